"""InitProducerId: every version clients send; ids durable and never reused; KIP-360 epoch bumps only for the
(id, epoch) kop last handed out, anything else a new id with epoch 0 (what Kafka answers every idempotent producer)."""
import socket
import struct

import pytest
from kafka.protocol.producer import InitProducerIdRequest, InitProducerIdResponse

from integration.idem_raw import RawKafka, idempotent_batch, read_topic
from protocol.errors import ErrorCode
from protocol.records import split_batches


def call(broker, version, **fields):
    req = InitProducerIdRequest[version](transactional_id=None, transaction_timeout_ms=60000, **fields)
    req.with_header(correlation_id=1, client_id="pid-test")
    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as sock:
        sock.sendall(req.encode(header=True, framed=True))
        size = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))[0]
        return InitProducerIdResponse.decode(sock.recv(size, socket.MSG_WAITALL), version=version, header=True)


def bump(broker, producer_id, epoch, version=4):
    answer = call(broker, version, producer_id=producer_id, producer_epoch=epoch)
    assert answer.error_code == ErrorCode.NONE
    return answer.producer_id, answer.producer_epoch


def stored_identities(broker, topic) -> list[tuple[int, int, int]]:
    """(producer id, epoch, base sequence) of every stored batch of partition 0."""
    with RawKafka(broker.port) as kafka:
        _, _, records = kafka.fetch_once(topic, 0, 0)
    return [(h.producer_id, h.producer_epoch, h.base_sequence) for h, _ in split_batches(records)]


@pytest.mark.parametrize("version", [0, 1, 2, 3, 4, 5])
def test_every_version_hands_out_a_fresh_id(broker, version):
    first, second = call(broker, version), call(broker, version)
    assert first.error_code == second.error_code == ErrorCode.NONE
    assert first.producer_epoch == 0 and second.producer_id > first.producer_id >= 0


def test_ids_are_never_reused_after_a_crash(broker):
    before = {call(broker, 0).producer_id for _ in range(5)}
    broker.kill()
    broker.start()
    after = {call(broker, 4).producer_id for _ in range(5)}
    assert not before & after
    assert min(after) > max(before)


@pytest.mark.parametrize("version", [3, 4, 5])
def test_kip360_bump_of_the_current_epoch_keeps_the_id_and_raises_the_epoch(broker, version):
    issued = call(broker, version)
    pid = issued.producer_id
    assert bump(broker, pid, 0, version) == (pid, 1)
    assert bump(broker, pid, 1, version) == (pid, 2)


def test_a_stale_or_unknown_pair_gets_a_new_id_never_a_live_producers_next_epoch(broker):
    pid = call(broker, 4).producer_id
    assert bump(broker, pid, 0) == (pid, 1)
    # The same request again (a retry after a lost response, or a zombie): epoch 1 is someone else's now.
    again = bump(broker, pid, 0)
    assert again[0] not in (pid, -1) and again[1] == 0
    assert bump(broker, pid, 5) != (pid, 6)  # an epoch kop never handed out
    assert bump(broker, pid, 1) == (pid, 2)  # the holder of the current epoch can still bump
    stranger = call(broker, 4, producer_id=10**12, producer_epoch=3)  # an id this broker never issued
    assert stranger.producer_id != 10**12 and stranger.producer_epoch == 0


def test_after_a_restart_no_pair_is_known_so_a_bump_gets_a_new_id(broker):
    pid = call(broker, 4).producer_id
    broker.kill()
    broker.start()
    fresh, epoch = bump(broker, pid, 0)
    assert fresh > pid and epoch == 0


def test_no_bump_to_an_epoch_a_client_already_bumped_to_locally(broker):
    """Java and librdkafka bump an idempotent producer's epoch locally: kop then sees epoch 1 on a partition without
    having issued it, and must not hand epoch 1 to anyone presenting epoch 0."""
    topic = "local-bump"
    with RawKafka(broker.port) as kafka:
        assert kafka.create_topic(topic) == ErrorCode.NONE
        pid = kafka.init_producer_id().producer_id
        for epoch in (0, 1):
            batch = idempotent_batch([b"e%d" % epoch], producer_id=pid, epoch=epoch, base_sequence=0)
            assert kafka.produce(topic, 0, batch).error_code == ErrorCode.NONE
    fresh, epoch = bump(broker, pid, 0)
    assert fresh != pid and epoch == 0


def test_kafka_python_bumps_through_kip360_and_goes_on_with_the_bumped_epoch(broker):
    """kafka-python answers OUT_OF_ORDER_SEQUENCE_NUMBER with InitProducerId v3+ carrying its id and epoch, and adopts
    whatever comes back. The 45 is provoked honestly: another writer used the producer's next sequence, so the
    producer's next batch overlaps a stored one."""
    from kafka import KafkaProducer
    topic = "kp-bump"
    with RawKafka(broker.port) as kafka:
        assert kafka.create_topic(topic) == ErrorCode.NONE
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, enable_idempotence=True, acks="all",
                             linger_ms=200, retry_backoff_ms=20, request_timeout_ms=10_000,
                             delivery_timeout_ms=30_000)
    try:
        producer.send(topic, b"v0", partition=0).get(timeout=20)
        identity = producer._transaction_manager.producer_id_and_epoch
        pid = identity.producer_id
        assert identity.epoch == 0
        with RawKafka(broker.port) as kafka:  # sequence 1, behind the producer's back
            assert kafka.produce(topic, 0, idempotent_batch([b"x1"], producer_id=pid, epoch=0,
                                                            base_sequence=1)).error_code == ErrorCode.NONE
        overlapping = [producer.send(topic, v, partition=0) for v in (b"v1", b"v2")]  # one batch: sequences 1..2
        producer.flush(timeout=20)
        for future in overlapping:
            with pytest.raises(Exception) as failed:
                future.get(timeout=1)
            assert "OutOfOrderSequence" in type(failed.value).__name__
        producer.send(topic, b"v3", partition=0).get(timeout=20)
        identity = producer._transaction_manager.producer_id_and_epoch
        assert (identity.producer_id, identity.epoch) == (pid, 1)  # the same id, bumped by kop
    finally:
        producer.close(timeout=10)
    assert [r.value for r in read_topic(broker.port, topic, [0])] == [b"v0", b"x1", b"v3"]
    assert stored_identities(broker, topic) == [(pid, 0, 0), (pid, 0, 1), (pid, 1, 0)]
