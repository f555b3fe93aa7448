"""Kafka transactions with confluent-kafka (librdkafka) against a real broker: commit, abort, read_committed against
read_uncommitted, several partitions and topics, offsets sent to a transaction, a zombie fenced, a transaction timed
out, timeouts over the broker's maximum, and the protocol answers around them (CONCURRENT_TRANSACTIONS while a
transaction completes, an idle transactional id expired)."""
import time
from collections.abc import Callable

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from kafka.protocol.consumer import FetchResponse, ListOffsetsRequest, ListOffsetsResponse
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse
from kafka.protocol.producer import InitProducerIdRequest, InitProducerIdResponse
from kafka.protocol.producer.transaction import EndTxnRequest, EndTxnResponse

from integration.fetch_requests import FETCH_VERSION, fetch_request
from integration.idem_raw import RawKafka, idempotent_batch
from integration.test_dedup_policies import DEDUP_CURSOR, internal_stats
from integration.txn_clients import (READ_COMMITTED, READ_UNCOMMITTED, RawTxnProducer, ck_read_to_end,
                                     init_transactional_id, values)
from integration.waiting import wait_until
from kop.producer_ids import MAX_EPOCH
from protocol.api import REQUEST_CLASSES as REQ
from protocol.api import RESPONSE_CLASSES as RESP
from protocol.errors import ErrorCode
from protocol.records import build_batch, Record


# A transaction the coordinator is to abort for its timeout: its records must be stored first, and librdkafka's
# message timeout is the transaction's (1 s let a loaded machine time them out, never stored).
TIMING_OUT_MS = 5000


def txn_producer(producers: Callable[[dict], Producer], bootstrap: str, transactional_id: str,
                 **config) -> Producer:
    """A transactional producer made by `producers` (the ck_producers fixture: let go when the test ends)."""
    producer = producers({"bootstrap.servers": bootstrap, "transactional.id": transactional_id, **config})
    producer.init_transactions(15)
    return producer


def send(producer: Producer, topic: str, prefix: str, count: int, partition: int = 0) -> None:
    """Records f"{prefix}{i}", each stored before this returns (flush's 0 also counts the deliveries that failed,
    as a message past librdkafka's message timeout does)."""
    failed = []
    for i in range(count):
        producer.produce(topic, f"{prefix}{i}".encode(), partition=partition,
                         on_delivery=lambda err, _msg: err is None or failed.append(err))
    assert producer.flush(15) == 0  # on the broker before the transaction ends (librdkafka purges unsent ones)
    assert not failed, failed


def test_committed_records_are_read_and_aborted_ones_only_read_uncommitted(broker, ck_producers):
    producer = txn_producer(ck_producers, broker.bootstrap, "commit-abort")
    producer.begin_transaction()
    send(producer, "ca", "c", 3)
    producer.commit_transaction(15)
    producer.begin_transaction()
    send(producer, "ca", "a", 4)
    producer.abort_transaction(15)
    producer.begin_transaction()
    send(producer, "ca", "d", 2)
    producer.commit_transaction(15)

    committed = ck_read_to_end(broker.bootstrap, "ca", isolation=READ_COMMITTED)
    assert values(committed) == [b"c0", b"c1", b"c2", b"d0", b"d1"]
    everything = ck_read_to_end(broker.bootstrap, "ca", isolation=READ_UNCOMMITTED)
    assert values(everything) == [b"c0", b"c1", b"c2", b"a0", b"a1", b"a2", b"a3", b"d0", b"d1"]
    # 9 records and 3 markers: the markers take offsets but no client sees them as records
    assert [offset for _, offset, _ in everything] == [0, 1, 2, 4, 5, 6, 7, 9, 10]


def test_read_committed_stops_at_the_open_transaction_until_it_commits(broker, ck_producers):
    producer = txn_producer(ck_producers, broker.bootstrap, "open")
    producer.begin_transaction()
    send(producer, "open", "x", 3)
    with RawKafka(broker.port) as kafka:
        assert _latest(kafka, "open", READ_COMMITTED) == 0
        assert _latest(kafka, "open", READ_UNCOMMITTED) == 3
        response = kafka.call(fetch_request([("open", 0, 0)], isolation_level=1), *_fetch_types())
        data = response.responses[0].partitions[0]
        assert (data.high_watermark, data.last_stable_offset, bytes(data.records or b"")) == (3, 0, b"")
    assert ck_read_to_end(broker.bootstrap, "open", isolation=READ_COMMITTED) == []
    assert len(ck_read_to_end(broker.bootstrap, "open", isolation=READ_UNCOMMITTED)) == 3
    producer.commit_transaction(15)
    assert values(ck_read_to_end(broker.bootstrap, "open")) == [b"x0", b"x1", b"x2"]
    with RawKafka(broker.port) as kafka:
        assert _latest(kafka, "open", READ_COMMITTED) == _latest(kafka, "open", READ_UNCOMMITTED) == 4


def test_fetch_lists_the_aborted_transactions_of_the_range_it_returns(broker, ck_producers):
    producer = txn_producer(ck_producers, broker.bootstrap, "listed")
    producer.begin_transaction()
    send(producer, "listed", "a", 2)
    producer.abort_transaction(15)
    producer.begin_transaction()
    send(producer, "listed", "c", 2)
    producer.commit_transaction(15)
    wait_lso(broker, "listed", 6)
    with RawKafka(broker.port) as kafka:
        data = kafka.call(fetch_request([("listed", 0, 0)], isolation_level=1), *_fetch_types()) \
            .responses[0].partitions[0]
        aborted = [(t.producer_id, t.first_offset) for t in data.aborted_transactions]
        assert len(aborted) == 1 and aborted[0][1] == 0
        past = kafka.call(fetch_request([("listed", 0, 3)], isolation_level=1), *_fetch_types()) \
            .responses[0].partitions[0]
        assert past.aborted_transactions == []  # the abort ended before offset 3


def test_a_transaction_spans_partitions_and_topics(broker, ck_producers):
    with RawKafka(broker.port) as kafka:
        kafka.create_topic("multi-a", partitions=3)
        kafka.create_topic("multi-b", partitions=2)
    producer = txn_producer(ck_producers, broker.bootstrap, "multi")
    producer.begin_transaction()
    for p in range(3):
        send(producer, "multi-a", f"a{p}-", 2, partition=p)
    for p in range(2):
        send(producer, "multi-b", f"b{p}-", 2, partition=p)
    producer.abort_transaction(15)
    producer.begin_transaction()
    for p in range(3):
        send(producer, "multi-a", f"A{p}-", 1, partition=p)
    for p in range(2):
        send(producer, "multi-b", f"B{p}-", 1, partition=p)
    producer.commit_transaction(15)
    assert sorted(values(ck_read_to_end(broker.bootstrap, "multi-a", (0, 1, 2)))) == [b"A0-0", b"A1-0", b"A2-0"]
    assert sorted(values(ck_read_to_end(broker.bootstrap, "multi-b", (0, 1)))) == [b"B0-0", b"B1-0"]
    assert len(ck_read_to_end(broker.bootstrap, "multi-a", (0, 1, 2), isolation=READ_UNCOMMITTED)) == 9


def _group_consumer(bootstrap: str, group: str, topic: str) -> Consumer:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                         "auto.offset.reset": "earliest", "isolation.level": READ_COMMITTED})
    consumer.assign([TopicPartition(topic, 0)])
    return consumer


def _committed(bootstrap: str, group: str, topic: str) -> int:
    consumer = _group_consumer(bootstrap, group, topic)
    try:
        return consumer.committed([TopicPartition(topic, 0)], timeout=10)[0].offset
    finally:
        consumer.close()


def test_offsets_sent_to_a_transaction_are_committed_with_it_and_vanish_with_an_abort(broker, ck_producers):
    seed = ck_producers({"bootstrap.servers": broker.bootstrap})
    for i in range(10):
        seed.produce("offsets-in", f"in{i}".encode(), partition=0)
    assert seed.flush(15) == 0
    consumer = _group_consumer(broker.bootstrap, "eos-group", "offsets-in")
    metadata = consumer.consumer_group_metadata()
    producer = txn_producer(ck_producers, broker.bootstrap, "offsets")

    producer.begin_transaction()
    send(producer, "offsets-out", "o", 1)
    producer.send_offsets_to_transaction([TopicPartition("offsets-in", 0, 4)], metadata, 15)
    producer.abort_transaction(15)
    assert _committed(broker.bootstrap, "eos-group", "offsets-in") < 0  # nothing committed

    producer.begin_transaction()
    send(producer, "offsets-out", "p", 1)
    producer.send_offsets_to_transaction([TopicPartition("offsets-in", 0, 7)], metadata, 15)
    producer.commit_transaction(15)
    deadline = time.monotonic() + 10
    while _committed(broker.bootstrap, "eos-group", "offsets-in") != 7:  # offsets land just after the markers
        assert time.monotonic() < deadline, "the transaction's offset was not committed"
        time.sleep(0.1)
    consumer.close()
    assert values(ck_read_to_end(broker.bootstrap, "offsets-out")) == [b"p0"]


def _seed(bootstrap: str, topic: str, count: int) -> None:
    seed = Producer({"bootstrap.servers": bootstrap})  # flushed, and gone once this returns
    for i in range(count):
        seed.produce(topic, f"in{i}".encode(), partition=0)
    assert seed.flush(15) == 0


def _send_offsets_for_two_groups(bootstrap: str, producer: Producer, topic: str, offset: int) -> list[Consumer]:
    """The open transaction commits `offset` for the groups "later" and "only-txn"; returns their consumers."""
    consumers = [_group_consumer(bootstrap, group, topic) for group in ("later", "only-txn")]
    for consumer in consumers:
        producer.send_offsets_to_transaction([TopicPartition(topic, 0, offset)], consumer.consumer_group_metadata(),
                                             15)
    return consumers


def _wait_committed(bootstrap: str, group: str, topic: str, expected: int) -> None:
    deadline = time.monotonic() + 15
    while (committed := _committed(bootstrap, group, topic)) != expected:
        assert time.monotonic() < deadline, f"{group} committed {committed}, expected {expected}"
        time.sleep(0.1)


def test_a_commit_made_after_the_transactions_offset_commit_is_not_moved_back_by_it(broker, ck_producers):
    """As in Kafka, a transaction's offsets are installed on commit only where the group has not committed since
    its TxnOffsetCommit: a plain commit made in between stands (the control group, with no later commit, gets the
    transaction's offset)."""
    _seed(broker.bootstrap, "later-in", 10)
    producer = txn_producer(ck_producers, broker.bootstrap, "later-txn")
    producer.begin_transaction()
    send(producer, "later-out", "o", 1)
    consumers = _send_offsets_for_two_groups(broker.bootstrap, producer, "later-in", 4)
    consumers[0].commit(offsets=[TopicPartition("later-in", 0, 8)], asynchronous=False)
    producer.commit_transaction(15)
    _wait_committed(broker.bootstrap, "only-txn", "later-in", 4)
    assert _committed(broker.bootstrap, "later", "later-in") == 8
    for consumer in consumers:
        consumer.close()


def test_a_completion_replayed_after_a_kill_9_does_not_move_a_newer_commit_back(start_broker, ck_producers):
    """The commit is decided (PrepareCommit stored) but its marker is held on the output partition's disk, so its
    offsets are not installed yet; a plain commit lands; kill -9. The restarted coordinator completes the
    transaction: the control group gets the transaction's offset, the group that committed later keeps its own."""
    broker = start_broker({"adminFailpointsEnabled": "true"})
    _seed(broker.bootstrap, "replay-in", 10)
    with RawKafka(broker.port) as kafka:
        kafka.create_topic("replay-out")
    producer = txn_producer(ck_producers, broker.bootstrap, "replay-txn")
    producer.begin_transaction()
    send(producer, "replay-out", "o", 1)
    consumers = _send_offsets_for_two_groups(broker.bootstrap, producer, "replay-in", 4)
    _failpoint(broker, "replay-out", hold_flushes=True)
    producer.commit_transaction(15)  # answered once the decision is stored, the marker still held
    with RawKafka(broker.port) as kafka:
        assert _describe(kafka, "replay-txn").transaction_state == "PrepareCommit"
    consumers[0].commit(offsets=[TopicPartition("replay-in", 0, 8)], asynchronous=False)
    with RawKafka(broker.port) as kafka:  # control: nothing installed before the crash (require_stable would wait)
        assert _offset_fetch(kafka, "only-txn", "replay-in", require_stable=False) == (ErrorCode.NONE, -1)
    for consumer in consumers:
        consumer.close()
    broker.kill()
    broker.start()
    _wait_committed(broker.bootstrap, "only-txn", "replay-in", 4)
    assert _committed(broker.bootstrap, "later", "replay-in") == 8
    assert values(ck_read_to_end(broker.bootstrap, "replay-out")) == [b"o0"]


def _offset_fetch(kafka: RawKafka, group: str, topic: str, require_stable: bool) -> tuple[int, int]:
    """OffsetFetch v7 for partition 0: (error code, committed offset)."""
    request = REQ[9][7](group_id=group, topics=[REQ[9][7].OffsetFetchRequestTopic(name=topic, partition_indexes=[0])],
                        require_stable=require_stable)
    answer = kafka.call(request, RESP[9], 7).topics[0].partitions[0]
    return answer.error_code, answer.committed_offset


def test_offset_fetch_require_stable_waits_for_the_transaction_holding_the_offset(broker, ck_producers):
    seed = ck_producers({"bootstrap.servers": broker.bootstrap})
    seed.produce("stable-in", b"x", partition=0)
    assert seed.flush(15) == 0
    consumer = _group_consumer(broker.bootstrap, "stable-group", "stable-in")
    producer = txn_producer(ck_producers, broker.bootstrap, "stable")
    producer.begin_transaction()
    send(producer, "stable-out", "o", 1)
    producer.send_offsets_to_transaction([TopicPartition("stable-in", 0, 1)], consumer.consumer_group_metadata(), 15)
    with RawKafka(broker.port) as kafka:
        assert _offset_fetch(kafka, "stable-group", "stable-in", True) == (ErrorCode.UNSTABLE_OFFSET_COMMIT, -1)
        assert _offset_fetch(kafka, "stable-group", "stable-in", False) == (ErrorCode.NONE, -1)  # not committed yet
        producer.commit_transaction(15)
        deadline = time.monotonic() + 10
        while _offset_fetch(kafka, "stable-group", "stable-in", True) != (ErrorCode.NONE, 1):
            assert time.monotonic() < deadline, "the transaction's offset never became stable"
            time.sleep(0.1)
    consumer.close()


def test_a_second_producer_with_the_same_transactional_id_fences_the_first(broker, ck_producers):
    zombie = txn_producer(ck_producers, broker.bootstrap, "fenced")
    zombie.begin_transaction()
    send(zombie, "fenced", "z", 2)
    successor = txn_producer(ck_producers, broker.bootstrap, "fenced")  # aborts the zombie's open transaction
    with pytest.raises(KafkaException) as raised:
        zombie.commit_transaction(15)
    assert raised.value.args[0].fatal() or raised.value.args[0].code() in (
        KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH)
    successor.begin_transaction()
    send(successor, "fenced", "s", 1)
    successor.commit_transaction(15)
    assert values(ck_read_to_end(broker.bootstrap, "fenced")) == [b"s0"]
    assert values(ck_read_to_end(broker.bootstrap, "fenced", isolation=READ_UNCOMMITTED)) == [b"z0", b"z1", b"s0"]


def test_the_coordinator_aborts_a_transaction_open_past_its_timeout(broker_factory, ck_producers):
    broker = broker_factory({"transaction.abort.timed.out.transaction.cleanup.interval.ms": "200"})
    with RawKafka(broker.port) as kafka:  # no topic creation in the transaction's time
        assert kafka.create_topic("slow") == ErrorCode.NONE
    producer = txn_producer(ck_producers, broker.bootstrap, "slow", **{"transaction.timeout.ms": TIMING_OUT_MS})
    producer.begin_transaction()
    send(producer, "slow", "late", 2)
    wait_lso(broker, "slow", 3)  # aborted by the coordinator: the marker moved the LSO past the records
    with pytest.raises(KafkaException):
        producer.commit_transaction(15)
    assert ck_read_to_end(broker.bootstrap, "slow") == []
    assert len(ck_read_to_end(broker.bootstrap, "slow", isolation=READ_UNCOMMITTED)) == 2


def test_a_timeout_over_the_brokers_maximum_is_refused(broker_factory, ck_producers):
    broker = broker_factory({"transaction.max.timeout.ms": "5000"})
    producer = ck_producers({"bootstrap.servers": broker.bootstrap, "transactional.id": "too-long",
                         "transaction.timeout.ms": 60000})
    with pytest.raises(KafkaException) as raised:
        producer.init_transactions(15)
    assert raised.value.args[0].code() == KafkaError.INVALID_TRANSACTION_TIMEOUT


def test_a_batch_arriving_after_its_transaction_ended_is_refused(broker):
    """KIP-890's hanging transaction: a delayed transactional batch must not open a transaction no one ends."""
    with RawKafka(broker.port) as kafka:
        kafka.create_topic("late", partitions=2)
        txn = RawTxnProducer(kafka, "late")
        assert txn.add_partitions("late", [0]) == {0: ErrorCode.NONE}
        first = _txn_batch([b"in-time"], txn, 0)
        assert kafka.produce("late", 0, first).error_code == ErrorCode.NONE
        not_added = kafka.produce("late", 1, _txn_batch([b"never added"], txn, 0))
        assert not_added.error_code == ErrorCode.INVALID_TXN_STATE
        assert txn.end(commit=True) == ErrorCode.NONE
        delayed = kafka.produce("late", 0, _txn_batch([b"delayed"], txn, 1))
        assert delayed.error_code == ErrorCode.INVALID_TXN_STATE
        wait_lso(broker, "late", 2)
        assert _latest(kafka, "late", READ_UNCOMMITTED) == 2  # the record and the marker; nothing after them
    assert values(ck_read_to_end(broker.bootstrap, "late")) == [b"in-time"]


def test_fencing_answers_by_request_version(broker):
    with RawKafka(broker.port) as kafka:
        kafka.create_topic("versions")
        old = RawTxnProducer(kafka, "versions")
        RawTxnProducer(kafka, "versions")  # bumps the epoch
        assert old.end(commit=True, version=1) == ErrorCode.INVALID_PRODUCER_EPOCH
        assert old.end(commit=True, version=2) == ErrorCode.PRODUCER_FENCED
        assert old.add_partitions("versions", [0], version=1) == {0: ErrorCode.INVALID_PRODUCER_EPOCH}
        assert old.add_partitions("versions", [0], version=3) == {0: ErrorCode.PRODUCER_FENCED}
        # a transactional batch of the old epoch is refused as Kafka refuses a stale epoch on Produce
        answer = kafka.produce("versions", 0, _txn_batch([b"zombie"], old, 0))
        assert answer.error_code == ErrorCode.INVALID_PRODUCER_EPOCH
        # a plain idempotent batch is not judged by the coordinator
        idem = kafka.init_producer_id()
        plain = idempotent_batch([b"idem"], producer_id=idem.producer_id, epoch=idem.producer_epoch, base_sequence=0)
        assert kafka.produce("versions", 0, plain).error_code == ErrorCode.NONE


def test_a_plain_batch_from_a_producer_with_a_transaction_open_is_refused(broker):
    """As Kafka refuses it: it would land inside the transaction's range without being part of it."""
    with RawKafka(broker.port) as kafka:
        kafka.create_topic("mixed")
        txn = RawTxnProducer(kafka, "mixed")
        assert txn.add_partitions("mixed", [0]) == {0: ErrorCode.NONE}
        assert kafka.produce("mixed", 0, _txn_batch([b"in"], txn, 0)).error_code == ErrorCode.NONE
        plain = idempotent_batch([b"out"], producer_id=txn.producer_id, epoch=txn.epoch, base_sequence=1)
        assert kafka.produce("mixed", 0, plain).error_code == ErrorCode.INVALID_TXN_STATE
        assert txn.end(commit=True) == ErrorCode.NONE
    assert values(ck_read_to_end(broker.bootstrap, "mixed")) == [b"in"]


def test_sequence_ids_in_an_aborted_transaction_do_not_count_as_stored(broker):
    """A transaction's records are not judged by kop.sequence.id: after an abort, the same records sent again (the
    job's retry) are stored. Control: the same ids stored outside a transaction make their resend a duplicate."""
    headers = lambda seq: (("kop.producer.name", b"loader"), ("kop.sequence.id", str(seq).encode()))
    records = lambda values_: [Record(offset=i, timestamp=1_700_000_000_000, key=None, value=v, headers=headers(i))
                               for i, v in enumerate(values_)]
    with RawKafka(broker.port) as kafka:
        kafka.create_topic("seq-txn")
        txn = RawTxnProducer(kafka, "seq-txn")
        assert txn.add_partitions("seq-txn", [0]) == {0: ErrorCode.NONE}
        aborted = build_batch(records([b"a0", b"a1"]), producer_id=txn.producer_id, producer_epoch=txn.epoch,
                              base_sequence=0, transactional=True)
        assert kafka.produce("seq-txn", 0, aborted).error_code == ErrorCode.NONE
        assert txn.end(commit=False) == ErrorCode.NONE
        wait_lso(broker, "seq-txn", 3)
        retry = build_batch(records([b"r0", b"r1"]))  # the retry, without a transaction: ids 0 and 1 again
        stored = kafka.produce("seq-txn", 0, retry)
        assert (stored.error_code, stored.base_offset) == (ErrorCode.NONE, 3)  # after the aborted two and the marker
        again = build_batch(records([b"d0", b"d1"]))  # control: now stored, the same ids are duplicates
        assert kafka.produce("seq-txn", 0, again).base_offset == 3  # nothing stored: answered with the retry's offset
    assert values(ck_read_to_end(broker.bootstrap, "seq-txn")) == [b"r0", b"r1"]


def test_api_versions_advertise_the_transaction_apis(broker):
    with RawKafka(broker.port) as kafka:
        versions = {k.api_key: (k.min_version, k.max_version)
                    for k in kafka.call(ApiVersionsRequest[3](client_software_name="t", client_software_version="1"),
                                        ApiVersionsResponse, 3).api_keys}
    assert versions[25] == (0, 3) and versions[26] == (0, 3) and versions[28] == (0, 3)
    # v4 of AddPartitionsToTxn and WriteTxnMarkers are for brokers (verification, markers): clients stop at v3
    assert versions[24] == (0, 4) and versions[27] == (1, 2)


# ---- helpers

def _txn_batch(values_: list[bytes], txn: RawTxnProducer, base_sequence: int) -> bytes:
    records = [Record(offset=i, timestamp=1_700_000_000_000 + i, key=None, value=v) for i, v in enumerate(values_)]
    return build_batch(records, producer_id=txn.producer_id, producer_epoch=txn.epoch, base_sequence=base_sequence,
                       transactional=True)


def _fetch_types():
    return FetchResponse, FETCH_VERSION


def _latest(kafka: RawKafka, topic: str, isolation: str) -> int:
    request = ListOffsetsRequest[5](replica_id=-1, isolation_level=1 if isolation == READ_COMMITTED else 0,
                                    topics=[ListOffsetsRequest.ListOffsetsTopic(name=topic, partitions=[
                                        ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
                                            partition_index=0, current_leader_epoch=-1, timestamp=-1)])])
    answer = kafka.call(request, ListOffsetsResponse, 5).topics[0].partitions[0]
    assert answer.error_code == ErrorCode.NONE
    return answer.offset


def wait_lso(broker, topic: str, expected: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    with RawKafka(broker.port) as kafka:
        while (lso := _latest(kafka, topic, READ_COMMITTED)) != expected:
            assert time.monotonic() < deadline, f"{topic}: last stable offset {lso}, expected {expected}"
            time.sleep(0.05)


def test_admin_tools_list_and_describe_transactions_and_producers(broker, ck_producers):
    """ListTransactions, DescribeTransactions and DescribeProducers (KIP-664), as kafka-transactions.sh asks them,
    around one open transaction and one plain idempotent producer on the same partition."""
    idem = ck_producers({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True})
    for i in range(3):
        idem.produce("described", b"i%d" % i, partition=0)
    assert idem.flush(15) == 0
    producer = txn_producer(ck_producers, broker.bootstrap, "described-txn")
    producer.begin_transaction()
    send(producer, "described", "t", 2)
    producer.flush(15)
    with RawKafka(broker.port) as kafka:
        listed = kafka.call(REQ[66][1](state_filters=["Ongoing", "Bogus"], producer_id_filters=[],
                                       duration_filter=-1), RESP[66], 1)
        assert [(s.transactional_id, s.transaction_state) for s in listed.transaction_states] == \
            [("described-txn", "Ongoing")]
        assert listed.unknown_state_filters == ["Bogus"]
        described = kafka.call(REQ[65][0](transactional_ids=["described-txn", "nobody"]), RESP[65], 0)
        found, missing = described.transaction_states
        assert (found.error_code, found.transaction_state) == (ErrorCode.NONE, "Ongoing")
        assert [(t.topic, list(t.partitions)) for t in found.topics] == [("described", [0])]
        assert missing.error_code == ErrorCode.TRANSACTIONAL_ID_NOT_FOUND
        txn_pid = found.producer_id

        def producers():
            request = REQ[61][0](topics=[REQ[61][0].TopicRequest(name="described", partition_indexes=[0])])
            answer = kafka.call(request, RESP[61], 0).topics[0].partitions[0]
            return {p.producer_id: (p.last_sequence, p.current_txn_start_offset) for p in answer.active_producers}

        during = producers()
        assert during[txn_pid] == (1, 3)  # two records from sequence 0; its transaction started at offset 3
        assert sorted(v for pid, v in during.items() if pid != txn_pid) == [(2, -1)]  # the idempotent producer
        producer.commit_transaction(15)
        deadline = time.monotonic() + 10
        while producers()[txn_pid][1] != -1:  # the transaction ends once its marker is written
            assert time.monotonic() < deadline, "the transaction never ended on the partition"
            time.sleep(0.1)
        after = kafka.call(REQ[66][1](state_filters=[], producer_id_filters=[txn_pid], duration_filter=-1),
                           RESP[66], 1)
        assert [s.transaction_state for s in after.transaction_states] == ["CompleteCommit"]


def test_the_next_transaction_starts_without_concurrent_transactions_once_end_txn_is_answered(broker):
    """EndTxn is answered once the markers are stored, so the producer's next AddPartitionsToTxn is accepted at once
    (answered at the decision, it met CONCURRENT_TRANSACTIONS and librdkafka backed off ~25 ms each time)."""
    with RawKafka(broker.port) as kafka:
        kafka.create_topic("back-to-back", partitions=4)
        txn = RawTxnProducer(kafka, "back-to-back")
        for n in range(5):
            assert txn.add_partitions("back-to-back", [0, 1, 2, 3]) == {p: ErrorCode.NONE for p in range(4)}, n
            for p in range(4):
                assert kafka.produce("back-to-back", p, _txn_batch([b"%d" % n], txn, n)).error_code == ErrorCode.NONE
            assert txn.end(commit=True) == ErrorCode.NONE
    assert sorted(values(ck_read_to_end(broker.bootstrap, "back-to-back", partitions=(0, 1, 2, 3)))) == \
        sorted(b"%d" % n for n in range(5) for _ in range(4))


def test_an_empty_transactional_id_is_an_invalid_request(broker):
    with RawKafka(broker.port) as kafka:
        answer = kafka.call(InitProducerIdRequest[4](transactional_id="", transaction_timeout_ms=60_000,
                                                     producer_id=-1, producer_epoch=-1), InitProducerIdResponse, 4)
    assert (answer.error_code, answer.producer_id) == (ErrorCode.INVALID_REQUEST, -1)


def _describe(kafka: RawKafka, transactional_id: str):
    return kafka.call(REQ[65][0](transactional_ids=[transactional_id]), RESP[65], 0).transaction_states[0]


def _listed(kafka: RawKafka) -> set[str]:
    answer = kafka.call(REQ[66][1](state_filters=[], producer_id_filters=[], duration_filter=-1), RESP[66], 1)
    return {s.transactional_id for s in answer.transaction_states}


def test_requests_for_a_transaction_whose_markers_are_being_written_get_concurrent_transactions(start_broker):
    """While the coordinator completes a commit (its marker held on the partition's disk), a new producer's
    InitProducerId, the producer's next AddPartitionsToTxn and a second EndTxn are answered CONCURRENT_TRANSACTIONS
    (retriable); once the marker is stored, InitProducerId bumps the epoch as usual."""
    broker = start_broker({"adminFailpointsEnabled": "true"})  # the failpoint route is on the admin API
    with RawKafka(broker.port) as kafka, RawKafka(broker.port) as other:
        kafka.create_topic("completing")
        txn = RawTxnProducer(kafka, "completing")
        assert txn.add_partitions("completing", [0]) == {0: ErrorCode.NONE}
        assert kafka.produce("completing", 0, _txn_batch([b"held"], txn, 0)).error_code == ErrorCode.NONE
        _failpoint(broker, "completing", hold_flushes=True)
        try:
            ending = kafka.send(EndTxnRequest[3](transactional_id="completing", producer_id=txn.producer_id,
                                                 producer_epoch=txn.epoch, committed=True))
            deadline = time.monotonic() + 10
            while _describe(other, "completing").transaction_state != "PrepareCommit":
                assert time.monotonic() < deadline, "the commit was never decided"
                time.sleep(0.05)
            assert init_transactional_id(other, "completing") == (ErrorCode.CONCURRENT_TRANSACTIONS, -1, -1)
            second = txn.over(other)
            assert second.add_partitions("completing", [0]) == {0: ErrorCode.CONCURRENT_TRANSACTIONS}
            assert second.end(commit=True) == ErrorCode.CONCURRENT_TRANSACTIONS
            assert _latest(other, "completing", READ_COMMITTED) == 0  # control: the marker is not stored
            assert _describe(other, "completing").transaction_state == "PrepareCommit"
        finally:
            _failpoint(broker, "completing", hold_flushes=False)
        assert kafka.receive(ending, EndTxnResponse, 3).error_code == ErrorCode.NONE
        wait_lso(broker, "completing", 2)
        deadline = time.monotonic() + 10
        while (answer := init_transactional_id(other, "completing"))[0] == ErrorCode.CONCURRENT_TRANSACTIONS:
            assert time.monotonic() < deadline, "the transaction never completed"
            time.sleep(0.05)
        assert answer == (ErrorCode.NONE, txn.producer_id, txn.epoch + 1)
    assert values(ck_read_to_end(broker.bootstrap, "completing")) == [b"held"]


def test_a_transactional_id_unused_past_its_expiration_is_forgotten(broker_factory):
    """transactional.id.expiration.ms: an id whose last transaction completed that long ago is no longer listed nor
    described, and InitProducerId then starts it afresh (a new producer id, epoch 0). An id with a transaction open
    is kept (the control: expiry ran, and judged by state)."""
    broker = broker_factory({"transactional.id.expiration.ms": "1500",
                             "transaction.abort.timed.out.transaction.cleanup.interval.ms": "200"})
    with RawKafka(broker.port) as kafka:
        kafka.create_topic("expiring")
        idle = RawTxnProducer(kafka, "idle")
        assert idle.add_partitions("expiring", [0]) == {0: ErrorCode.NONE}
        assert kafka.produce("expiring", 0, _txn_batch([b"once"], idle, 0)).error_code == ErrorCode.NONE
        assert idle.end(commit=True) == ErrorCode.NONE
        busy = RawTxnProducer(kafka, "busy")  # its timeout (60 s) outlives the test: open, never expired
        assert busy.add_partitions("expiring", [0]) == {0: ErrorCode.NONE}
        assert _listed(kafka) == {"idle", "busy"}
        assert _describe(kafka, "idle").transaction_state == "CompleteCommit"
        deadline = time.monotonic() + 15
        while "idle" in _listed(kafka):
            assert time.monotonic() < deadline, "the idle transactional id was never forgotten"
            time.sleep(0.1)
        assert _listed(kafka) == {"busy"}
        assert _describe(kafka, "idle").error_code == ErrorCode.TRANSACTIONAL_ID_NOT_FOUND
        assert _describe(kafka, "busy").transaction_state == "Ongoing"
        error, producer_id, epoch = init_transactional_id(kafka, "idle")
        assert (error, epoch) == (ErrorCode.NONE, 0) and producer_id != idle.producer_id
        assert busy.end(commit=True) == ErrorCode.NONE
    assert values(ck_read_to_end(broker.bootstrap, "expiring")) == [b"once"]


def _failpoint(broker, topic: str, **faults) -> None:
    from kop.admin.client import AdminClient
    AdminClient(broker.admin_url).post(f"/admin/v2/kop/failpoints/{topic}/0", faults)


@pytest.mark.slow  # 32,767 InitProducerId round trips, each a state-log write: ~15 s
# On PostgreSQL each of those writes is a database commit: 200 s at load 10 on a 2-core machine, past pytest's 300 s
# default under more load
@pytest.mark.timeout(900)
def test_an_exhausted_epoch_rotates_to_a_new_producer_id_through_the_protocol(broker_factory):
    """KIP-360 InitProducerId with the current id and epoch bumps the epoch each time; the bump that would reach the
    last epoch hands out a new producer id at epoch 0 instead (as Kafka does), a retry of that bump gets the same
    answer, the old id is refused, and the new one runs a transaction."""
    broker = broker_factory({"fsync": "false"})  # the state-log writes of 32k bumps, minus 32k fsyncs
    with RawKafka(broker.port) as kafka:
        kafka.create_topic("exhausted")
        error, first_id, epoch = init_transactional_id(kafka, "exhausted")
        assert (error, epoch) == (ErrorCode.NONE, 0)
        while epoch < MAX_EPOCH - 1:
            answer = init_transactional_id(kafka, "exhausted", producer_id=first_id, producer_epoch=epoch)
            assert answer == (ErrorCode.NONE, first_id, epoch + 1), answer
            epoch = answer[2]
        error, new_id, new_epoch = init_transactional_id(kafka, "exhausted", producer_id=first_id,
                                                         producer_epoch=epoch)
        assert (error, new_epoch) == (ErrorCode.NONE, 0) and new_id != first_id
        retry = init_transactional_id(kafka, "exhausted", producer_id=first_id, producer_epoch=epoch)
        assert retry == (ErrorCode.NONE, new_id, 0)  # the bump's answer was lost: the same new identity
        described = _describe(kafka, "exhausted")
        assert (described.producer_id, described.producer_epoch) == (new_id, 0)

        old = RawTxnProducer(kafka, "exhausted", identity=(first_id, epoch))
        assert old.add_partitions("exhausted", [0]) == {0: ErrorCode.INVALID_PRODUCER_ID_MAPPING}
        txn = RawTxnProducer(kafka, "exhausted", identity=(new_id, 0))
        assert txn.add_partitions("exhausted", [0]) == {0: ErrorCode.NONE}
        assert kafka.produce("exhausted", 0, _txn_batch([b"after"], txn, 0)).error_code == ErrorCode.NONE
        assert txn.end(commit=True) == ErrorCode.NONE
    assert values(ck_read_to_end(broker.bootstrap, "exhausted")) == [b"after"]


def _producer_epochs(kafka: RawKafka, topic: str) -> dict[int, int] | None:
    """DescribeProducers of the topic's partition 0: each producer's epoch there; None until the partition answers."""
    request = REQ[61][0](topics=[REQ[61][0].TopicRequest(name=topic, partition_indexes=[0])])
    answer = kafka.call(request, RESP[61], 0).topics[0].partitions[0]
    if answer.error_code != ErrorCode.NONE:
        return None
    return {p.producer_id: p.producer_epoch for p in answer.active_producers}


@pytest.mark.slow  # a transaction timing out, then a kill -9 and a restart: ~12 s (the dedup unit tests are quick)
@pytest.mark.parametrize("recovered_from", ["snapshot", "replay"])
def test_an_abort_under_a_bumped_epoch_fences_the_old_epoch_on_the_partition_also_after_kill_9(start_broker,
                                                                                              recovered_from):
    """The coordinator aborts a transaction open past its timeout under a bumped epoch. Its ABORT marker makes that
    the producer's epoch on the partition, as Kafka's producer state does: DescribeProducers shows it, and a batch
    of the old epoch is refused INVALID_PRODUCER_EPOCH (a plain idempotent one, which no transaction check sees:
    only the partition's producer state can refuse it). After a kill -9 the same holds, rebuilt from the dedup
    snapshot taken after the marker, or from replaying the marker."""
    interval = "1" if recovered_from == "snapshot" else "1000000"
    broker = start_broker({"transaction.abort.timed.out.transaction.cleanup.interval.ms": "200",
                           "brokerDeduplicationEntriesInterval": interval})
    with RawKafka(broker.port) as kafka:
        assert kafka.create_topic("bumped") == ErrorCode.NONE
        txn = RawTxnProducer(kafka, "bumped", timeout_ms=1000)
        assert txn.add_partitions("bumped", [0]) == {0: ErrorCode.NONE}
        assert kafka.produce("bumped", 0, _txn_batch([b"t0", b"t1"], txn, 0)).error_code == ErrorCode.NONE
    wait_lso(broker, "bumped", 3)  # aborted by the coordinator: its marker follows the two records
    old_epoch_batch = idempotent_batch([b"zombie"], producer_id=txn.producer_id, epoch=txn.epoch, base_sequence=2)
    if recovered_from == "snapshot":  # control: the snapshot holds the new epoch's name, with no sequence yet
        new_name = f"KOP-PID-{txn.producer_id}-{txn.epoch + 1}"
        assert wait_until(lambda: internal_stats(broker, "bumped")["cursors"][DEDUP_CURSOR]["properties"].get(
            new_name) == -1, timeout=15)
    for restarted in (False, True):
        if restarted:
            broker.restart(hard=True)
        with RawKafka(broker.port) as kafka:
            assert wait_until(lambda: _producer_epochs(kafka, "bumped") is not None, timeout=30)
            answer = kafka.produce("bumped", 0, old_epoch_batch)
            assert answer.error_code == ErrorCode.INVALID_PRODUCER_EPOCH, answer
            assert _producer_epochs(kafka, "bumped") == {txn.producer_id: txn.epoch + 1}
    assert values(ck_read_to_end(broker.bootstrap, "bumped", isolation=READ_UNCOMMITTED)) == [b"t0", b"t1"]
