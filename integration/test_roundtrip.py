"""Produce and consume with every client library and compression codec against a real kop process: keys, null
values, headers and timestamps survive, offsets are dense and start at 0."""
import pytest

from integration.clients import (COMPRESSIONS, aio_consume_all, aio_produce, ck_consume_all, ck_produce,
                                 kp_consume_all, kp_produce, sample_records)
from integration.idem_raw import RawKafka
from protocol.compression import CODEC_NAMES, XERIAL_MAGIC
from protocol.records import HEADER_SIZE, split_batches, validate_batch

N = 60


def _normalise_headers(headers):
    return tuple((k, bytes(v) if v is not None else None) for k, v in headers)


def stored_codecs(broker, topic) -> set[str]:
    """The codec of every batch kop stored for partition 0, as the client wrote it ("snappy-xerial" for snappy in
    xerial's block framing, which Java and the Python clients write), read back raw so no client decompresses it."""
    with RawKafka(broker.port) as kafka:
        _, _, records = kafka.fetch_once(topic, 0, 0)
    codecs = set()
    for header, view in split_batches(records):
        name = CODEC_NAMES[header.compression]
        if name == "snappy" and bytes(view[HEADER_SIZE:HEADER_SIZE + len(XERIAL_MAGIC)]) == XERIAL_MAGIC:
            name = "snappy-xerial"
        codecs.add(name)
    return codecs


def assert_same(records, consumed):
    assert len(consumed) == len(records)
    assert [r.offset for r in consumed] == list(range(len(records)))
    for (key, value, headers, ts), got in zip(records, consumed):
        assert got.key == key
        assert got.value == value
        assert _normalise_headers(got.headers) == _normalise_headers(tuple(headers))
        assert got.timestamp == ts


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_kafka_python_roundtrip(broker, compression):
    records = sample_records(N)
    kwargs = {} if compression == "none" else {"compression_type": compression}
    metas = kp_produce(broker.bootstrap, f"kp-{compression}", records, linger_ms=20, **kwargs)
    assert sorted(m.offset for m in metas) == list(range(N))
    assert_same(records, kp_consume_all(broker.bootstrap, f"kp-{compression}", N))
    assert stored_codecs(broker, f"kp-{compression}") == {"snappy-xerial" if compression == "snappy" else compression}


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_confluent_kafka_roundtrip(broker, compression):
    records = sample_records(N)
    reports = ck_produce(broker.bootstrap, f"ck-{compression}", records, **{"compression.type": compression,
                                                                              "linger.ms": 20})
    assert all(err is None for err, *_ in reports)
    assert sorted(offset for _, _, offset, _ in reports) == list(range(N))
    assert_same(records, ck_consume_all(broker.bootstrap, f"ck-{compression}", N))
    # librdkafka writes raw snappy, and sends a batch uncompressed when compressing would not make it smaller
    codecs = stored_codecs(broker, f"ck-{compression}")
    assert compression in codecs and codecs <= {compression, "none"}, codecs


def test_records_without_timestamps_are_stored_with_the_maximum_kafka_gives_them(broker):
    """librdkafka writes maxTimestamp 0 into a batch of records timestamped -1 (its C++ produce() with timestamp -1
    does this). Kafka's broker sets maxTimestamp from the records, -1, instead of refusing the batch; so does kop."""
    records = [(b"k%d" % i, b"v%d" % i, (), -1) for i in range(5)]
    reports = ck_produce(broker.bootstrap, "ck-no-timestamp", records, **{"linger.ms": 50})
    assert [err for err, *_ in reports] == [None] * len(records)
    with RawKafka(broker.port) as kafka:
        _, _, stored = kafka.fetch_once("ck-no-timestamp", 0, 0)
    batches = split_batches(stored)
    assert batches and all(header.max_timestamp == -1 for header, _ in batches)
    for header, view in batches:
        validate_batch(header, view)  # the CRC was recomputed
    assert [r.timestamp for r in ck_consume_all(broker.bootstrap, "ck-no-timestamp", len(records))] == [-1] * 5


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_aiokafka_roundtrip(broker, compression):
    records = sample_records(N)
    kwargs = {} if compression == "none" else {"compression_type": compression}
    metas = aio_produce(broker.bootstrap, f"aio-{compression}", records, linger_ms=20, **kwargs)
    assert sorted(m.offset for m in metas) == list(range(N))
    assert_same(records, aio_consume_all(broker.bootstrap, f"aio-{compression}", N))
    assert stored_codecs(broker, f"aio-{compression}") == {"snappy-xerial" if compression == "snappy" else compression}


def test_clients_read_each_others_records(broker):
    records = sample_records(30)
    kp_produce(broker.bootstrap, "mixed", records[:10])
    ck_produce(broker.bootstrap, "mixed", records[10:20])
    aio_produce(broker.bootstrap, "mixed", records[20:])
    for consume in (kp_consume_all, ck_consume_all, aio_consume_all):
        assert_same(records, consume(broker.bootstrap, "mixed", 30))


def test_large_batches_and_large_values(broker):
    big = [(b"k", bytes([i % 256]) * 200_000, [], 1_700_000_000_000 + i) for i in range(20)]
    reports = ck_produce(broker.bootstrap, "big", big, **{"compression.type": "none", "linger.ms": 50,
                                                           "batch.size": 900_000})
    assert all(err is None for err, *_ in reports)
    got = kp_consume_all(broker.bootstrap, "big", 20)
    assert [r.value for r in got] == [v for _, v, _, _ in big]


def test_empty_topic_consumes_nothing_and_reports_end_offset_zero(broker):
    from kafka import KafkaConsumer, TopicPartition
    from kafka.admin import KafkaAdminClient, NewTopic
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    admin.create_topics([NewTopic("empty", num_partitions=3, replication_factor=1)])
    admin.close()
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None)
    parts = [TopicPartition("empty", p) for p in range(3)]
    assert consumer.end_offsets(parts) == {tp: 0 for tp in parts}
    assert consumer.beginning_offsets(parts) == {tp: 0 for tp in parts}
    consumer.assign(parts)
    assert consumer.poll(timeout_ms=500) == {}
    consumer.close()
