"""Application-chosen sequence ids with every client: records sent with `kop.producer.name` / `kop.sequence.id` by
confluent-kafka, kafka-python, aiokafka and the Java client (idempotent and not, compressed), sent again as a re-run
job would (a new producer, ids already stored mixed with new ones, then a batch of nothing but stored ids), are
stored once each; each client's consumer reads them all back across the holes the dropped records leave."""
import pytest

from integration.clients import (aio_consume_all, aio_produce, ck_consume_all, ck_produce, kp_consume_all,
                                 kp_produce)
from integration.idem_raw import RawKafka
from integration.java_client import java_available, java_consume_all, java_produce

NAME, SEQUENCE = "kop.producer.name", "kop.sequence.id"
TIMESTAMP = 1_700_000_000_000

# (client, idempotent, compression): every client both ways, every codec somewhere.
CASES = [("confluent", True, "lz4"), ("confluent", False, "none"), ("kafka-python", True, "gzip"),
         ("kafka-python", False, "zstd"), ("aiokafka", True, "snappy"), ("aiokafka", False, "gzip"),
         ("java", True, "zstd"), ("java", False, "snappy")]


def python_records(name: str, ids) -> list[tuple]:
    return [(None, f"{name}-{i}".encode(), [(NAME, name.encode()), (SEQUENCE, str(i).encode())], TIMESTAMP + i)
            for i in ids]


def produce(client: str, bootstrap: str, topic: str, name: str, ids: range, idempotent: bool,
            compression: str) -> dict[bytes, int]:
    """Send records `ids` of `name` through a new producer of `client`, check every one was acknowledged, and return
    the offset each was acknowledged at, by value."""
    if client == "java":
        deliveries = java_produce(bootstrap, topic, len(ids), start_index=ids.start, value_prefix=f"{name}-",
                                  partition=0, idempotence=idempotent, acks="all", compression=compression,
                                  linger_ms=20, headers={NAME: name, SEQUENCE: "{i}"})
        assert all(d.ok for d in deliveries), [d for d in deliveries if not d.ok][:3]
        return {d.value.encode(): d.offset for d in deliveries}
    records = python_records(name, ids)
    if client == "confluent":
        reports = ck_produce(bootstrap, topic, records, **{"enable.idempotence": idempotent,
                                                           "compression.type": compression, "linger.ms": 20})
        assert all(err is None for err, *_ in reports), reports[:3]
        return {value: offset for _, _, offset, value in reports}
    if client == "kafka-python":
        acknowledged = kp_produce(bootstrap, topic, records, enable_idempotence=idempotent, linger_ms=20, acks="all",
                                  compression_type=None if compression == "none" else compression)
    else:
        acknowledged = aio_produce(bootstrap, topic, records, enable_idempotence=idempotent, linger_ms=20, acks="all",
                                   compression_type=None if compression == "none" else compression)
    return {value: metadata.offset for (_, value, _, _), metadata in zip(records, acknowledged)}


def consume(client: str, bootstrap: str, topic: str, expected: int) -> list[bytes]:
    if client == "java":
        return [r.value.encode() for r in java_consume_all(bootstrap, topic)]
    reader = {"confluent": ck_consume_all, "kafka-python": kp_consume_all, "aiokafka": aio_consume_all}[client]
    return [r.value for r in reader(bootstrap, topic, expected)]


@pytest.fixture(scope="module")
def stored_topics(tmp_path_factory):
    """One topic per case, written three times over; returns (broker, {topic: expected values}, {topic: the offsets
    the third send, all duplicates, was acknowledged at, by value})."""
    from integration.broker_process import BrokerProcess
    broker = BrokerProcess(str(tmp_path_factory.mktemp("kop") / "data")).start()
    expected, acknowledged = {}, {}
    try:
        for client, idempotent, compression in CASES:
            if client == "java" and not java_available():
                continue
            topic = f"seq-{client}-{'idem' if idempotent else 'plain'}-{compression}"
            name = f"{client}/{idempotent}"
            with RawKafka(broker.port) as kafka:
                assert kafka.create_topic(topic) == 0
            produce(client, broker.bootstrap, topic, name, range(0, 20), idempotent, compression)
            produce(client, broker.bootstrap, topic, name, range(10, 30), idempotent, compression)  # a re-run
            acknowledged[topic] = produce(client, broker.bootstrap, topic, name, range(25, 30), idempotent,
                                          compression)  # all stored
            produce(client, broker.bootstrap, topic, name, range(30, 31), idempotent, compression)
            expected[topic] = [f"{name}-{i}".encode() for i in range(31)]
        yield broker, expected, acknowledged
    finally:
        broker.stop()


@pytest.mark.parametrize("client, idempotent, compression", CASES)
def test_each_record_is_stored_once_whoever_sent_it_how_often(stored_topics, client, idempotent, compression):
    if client == "java" and not java_available():
        pytest.skip("no Java client harness")
    broker, expected, _ = stored_topics
    topic = f"seq-{client}-{'idem' if idempotent else 'plain'}-{compression}"
    with RawKafka(broker.port) as kafka:
        records = kafka.read_partition(topic, 0)
    assert [r.value for r in records] == expected[topic]  # 31 records, once each, in order


@pytest.mark.parametrize("client, idempotent, compression", CASES)
def test_records_sent_again_are_acknowledged_at_the_offsets_they_were_stored_at(stored_topics, client, idempotent,
                                                                                compression):
    """The third send repeats records the re-run stored (in batches rewritten without the records before them): an
    idempotent producer's batches are stored empty so its sequence numbers count, the others' not at all, and either
    way each record is acknowledged at the offset it was stored at the first time."""
    if client == "java" and not java_available():
        pytest.skip("no Java client harness")
    broker, _, acknowledged = stored_topics
    topic = f"seq-{client}-{'idem' if idempotent else 'plain'}-{compression}"
    with RawKafka(broker.port) as kafka:
        stored_at = {r.value: r.offset for r in kafka.read_partition(topic, 0)}
    assert len(acknowledged[topic]) == 5
    assert acknowledged[topic] == {value: stored_at[value] for value in acknowledged[topic]}


@pytest.mark.parametrize("reader", ["confluent", "kafka-python", "aiokafka", "java"])
def test_every_consumer_reads_across_the_holes(stored_topics, reader):
    if reader == "java" and not java_available():
        pytest.skip("no Java client harness")
    broker, expected, _ = stored_topics
    holey = [t for t in expected if "-idem-" in t]  # an idempotent re-run leaves holes and empty batches
    for topic in holey:
        with RawKafka(broker.port) as kafka:
            offsets = [r.offset for r in kafka.read_partition(topic, 0)]
        assert offsets != list(range(len(offsets))), f"{topic} has no hole to read across"
        assert consume(reader, broker.bootstrap, topic, len(expected[topic])) == expected[topic], topic
