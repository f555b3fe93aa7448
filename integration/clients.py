"""Thin helpers that drive each real Kafka client library the way an application would."""
import asyncio
import contextlib
import time
import warnings
from dataclasses import dataclass

COMPRESSIONS = ["none", "gzip", "snappy", "lz4", "zstd"]


@dataclass(frozen=True)
class Rec:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple
    timestamp: int


def sample_records(n: int, prefix: str = "v") -> list[tuple[bytes | None, bytes | None, list, int]]:
    """(key, value, headers, timestamp_ms) with some null keys, null values, empty and binary headers."""
    base_ts = 1_700_000_000_000
    out = []
    for i in range(n):
        key = None if i % 5 == 0 else f"key-{i}".encode()
        value = None if i % 7 == 3 and key is not None else f"{prefix}-{i}".encode() * (1 + i % 3)
        headers = [("h1", f"x{i}".encode()), ("bin", bytes([i % 256, 0, 255]))] if i % 2 else []
        out.append((key, value, headers, base_ts + i))
    return out


# ---- kafka-python

def kp_produce(bootstrap, topic, records, partition=0, **config):
    from kafka import KafkaProducer
    producer = KafkaProducer(bootstrap_servers=bootstrap, request_timeout_ms=20000, **config)
    try:
        futures = [producer.send(topic, key=k, value=v, headers=h, timestamp_ms=ts, partition=partition)
                   for k, v, h, ts in records]
        return [f.get(timeout=60) for f in futures]
    finally:
        producer.close(timeout=10)


def kp_consume_all(bootstrap, topic, expected, timeout=30.0, **config):
    from kafka import KafkaConsumer, TopicPartition
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                             auto_offset_reset="earliest", consumer_timeout_ms=1000, **config)
    try:
        parts = consumer.partitions_for_topic(topic) or {0}
        consumer.assign([TopicPartition(topic, p) for p in sorted(parts)])
        consumer.seek_to_beginning()
        out = []
        deadline = time.monotonic() + timeout
        while len(out) < expected and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=500).values():
                for m in batch:
                    out.append(Rec(m.partition, m.offset, m.key, m.value, tuple(m.headers), m.timestamp))
        return out
    finally:
        consumer.close()


# ---- confluent-kafka (librdkafka)

def ck_produce(bootstrap, topic, records, partition=0, **config):
    from confluent_kafka import Producer
    reports = []

    def on_delivery(err, msg):
        reports.append((err, msg.partition(), msg.offset(), msg.value()))
    producer = Producer({"bootstrap.servers": bootstrap, **config})
    for k, v, h, ts in records:
        producer.produce(topic, key=k, value=v, headers=h or None, timestamp=ts, partition=partition,
                         on_delivery=on_delivery)
        producer.poll(0)
    remaining = producer.flush(60)
    assert remaining == 0, f"{remaining} messages not delivered"
    return reports


def ck_let_go(producer) -> bool:
    """Close a confluent-kafka producer for good: what it still holds is dropped (a transaction, or a test that failed
    half way, may have left records queued), what is on its way awaited, bounded, then its handle is destroyed, and
    librdkafka's threads with it. False when closing failed (a fenced producer cannot abort the transaction close
    would end): its handle goes with its last reference then."""
    from confluent_kafka import KafkaException
    producer.purge()
    with contextlib.suppress(KafkaException):  # fenced, or refused at init: a fatal error, nothing of it on its way
        producer.flush(10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # "abort_transaction failed during close": it is known
        try:
            producer.close()
        except KafkaException:
            return False
    return True


def ck_consume_all(bootstrap, topic, expected, partitions=(0,), timeout=30.0, **config):
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "kop-test-reader",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest", **config})
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        out = []
        deadline = time.monotonic() + timeout
        while len(out) < expected and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            out.append(Rec(msg.partition(), msg.offset(), msg.key(), msg.value(),
                           tuple(msg.headers() or ()), msg.timestamp()[1]))
        return out
    finally:
        consumer.close()


# ---- aiokafka

def aio_produce(bootstrap, topic, records, partition=0, **config):
    from aiokafka import AIOKafkaProducer

    async def go():
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, request_timeout_ms=20000, **config)
        await producer.start()
        try:
            futures = [await producer.send(topic, key=k, value=v, headers=h, timestamp_ms=ts, partition=partition)
                       for k, v, h, ts in records]
            return [await f for f in futures]
        finally:
            await producer.stop()
    return asyncio.run(go())


def aio_consume_all(bootstrap, topic, expected, partitions=(0,), timeout=30.0, **config):
    from aiokafka import AIOKafkaConsumer, TopicPartition

    async def go():
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                                    auto_offset_reset="earliest", **config)
        await consumer.start()
        try:
            consumer.assign([TopicPartition(topic, p) for p in partitions])
            await consumer.seek_to_beginning()
            out = []
            deadline = time.monotonic() + timeout
            while len(out) < expected and time.monotonic() < deadline:
                batches = await consumer.getmany(timeout_ms=500)
                for batch in batches.values():
                    for m in batch:
                        out.append(Rec(m.partition, m.offset, m.key, m.value, tuple(m.headers), m.timestamp))
            return out
        finally:
            await consumer.stop()
    return asyncio.run(go())
