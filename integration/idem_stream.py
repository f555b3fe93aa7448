"""Produce a numbered stream of values with each real client, and check what the broker stored against it.

Value i of a stream is f"{prefix}-{i}" (key f"k{i}", so each client's own partitioner spreads the values over the
partitions). Every runner returns one Report per value. `check_stream` compares the reports with the stored log
(read directly from the broker) and counts every way exactly-once-in-order can fail.
"""
from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from integration.idem_raw import StoredRecord
from integration.java_client import java_produce

DELIVERY_TIMEOUT_S = 60
# Small batches make many Produce requests per stream, so that a cut policy finds enough requests to cut.
SMALL_BATCH_BYTES = 512


@dataclass(frozen=True, slots=True)
class Report:
    """What a client's delivery report said about one value. offset None: no offset known (-1/invalid)."""

    value: bytes
    partition: int | None
    offset: int | None
    error: str | None


@dataclass(frozen=True, slots=True)
class StreamCheck:
    sent: int
    stored: int
    failed: int  # values whose delivery report is an error
    lost: int  # acknowledged but not stored
    duplicated: int  # extra stored copies (a value stored 3 times counts 2)
    out_of_order: int  # adjacent stored pairs, per partition, whose send order is reversed
    offset_mismatches: int  # acknowledged with an offset that is not where the value is stored
    unknown_offsets: int  # acknowledged without an offset
    foreign: int  # stored values that were never sent
    holes: int  # per partition, offsets below the end that hold no record
    per_partition: dict[int, int]

    def summary(self) -> str:
        return (f"sent={self.sent} stored={self.stored} failed={self.failed} lost={self.lost} "
                f"duplicated={self.duplicated} out_of_order={self.out_of_order} "
                f"offset_mismatches={self.offset_mismatches} unknown_offsets={self.unknown_offsets} "
                f"foreign={self.foreign} holes={self.holes} per_partition={self.per_partition}")


def stream_values(prefix: str, count: int) -> list[bytes]:
    return [f"{prefix}-{i}".encode() for i in range(count)]


def check_stream(values: Sequence[bytes], reports: Sequence[Report], stored: Sequence[StoredRecord]) -> StreamCheck:
    send_index = {v: i for i, v in enumerate(values)}
    copies = Counter(r.value for r in stored)
    where = {r.value: (r.partition, r.offset) for r in stored}
    by_partition: dict[int, list[StoredRecord]] = defaultdict(list)
    for record in stored:
        by_partition[record.partition].append(record)
    out_of_order = holes = 0
    for records in by_partition.values():
        records.sort(key=lambda r: r.offset)
        order = [send_index.get(r.value, -1) for r in records]
        out_of_order += sum(1 for a, b in zip(order, order[1:]) if b <= a)
        holes += (records[-1].offset + 1) - len(records) if records else 0
    acked = [r for r in reports if r.error is None]
    return StreamCheck(
        sent=len(values),
        stored=len(stored),
        failed=sum(1 for r in reports if r.error is not None),
        lost=sum(1 for r in acked if r.value not in copies),
        duplicated=sum(n - 1 for n in copies.values() if n > 1),
        out_of_order=out_of_order,
        offset_mismatches=sum(1 for r in acked if r.offset is not None and r.value in where
                              and where[r.value] != (r.partition, r.offset)),
        unknown_offsets=sum(1 for r in acked if r.offset is None),
        foreign=sum(1 for v in copies if v not in send_index),
        holes=holes,
        per_partition={p: len(rs) for p, rs in sorted(by_partition.items())},
    )


# ---- one runner per client: (bootstrap, topic, values, idempotent, compression, **options) -> reports

def _key(value: bytes) -> bytes:
    return b"k" + value.rsplit(b"-", 1)[1]


def confluent_reporter(reports: dict[bytes, Report]):
    """A librdkafka delivery callback that files a Report per value (offset None unless stored)."""
    def on_delivery(err, msg) -> None:
        offset = msg.offset()
        reports[msg.value()] = Report(msg.value(), msg.partition(), offset if offset is not None and offset >= 0
                                      else None, None if err is None else err.name())
    return on_delivery


def produce_when_room(producer, topic: str, **fields) -> None:
    """librdkafka's produce(), serving delivery callbacks while its local queue is full (BufferError)."""
    for _ in range(100_000):
        try:
            producer.produce(topic, **fields)
            break
        except BufferError:
            producer.poll(0.01)
    else:
        raise BufferError("librdkafka's queue stayed full for a thousand seconds")
    producer.poll(0)


def confluent_stream(bootstrap: str, topic: str, values: Sequence[bytes], *, idempotent: bool,
                     compression: str, pipelined: bool = False) -> list[Report]:
    """librdkafka; `pipelined`: one message per request and no linger, so 5 requests are really in flight."""
    from confluent_kafka import Producer
    reports: dict[bytes, Report] = {}
    config = {
        "bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": idempotent,
        "max.in.flight.requests.per.connection": 5, "compression.type": compression,
        "message.timeout.ms": DELIVERY_TIMEOUT_S * 1000, "retry.backoff.ms": 20, "reconnect.backoff.ms": 20,
        "reconnect.backoff.max.ms": 200, "socket.timeout.ms": 10_000,
    }
    if not idempotent:
        config["retries"] = 1_000_000
    if pipelined:
        config.update({"batch.num.messages": 1, "linger.ms": 0})
    else:
        config.update({"linger.ms": 5, "batch.num.messages": 20})
    producer = Producer(config)
    on_delivery = confluent_reporter(reports)
    for value in values:
        produce_when_room(producer, topic, key=_key(value), value=value, on_delivery=on_delivery)
    remaining = producer.flush(DELIVERY_TIMEOUT_S + 10)
    for value in values:
        if value not in reports:
            reports[value] = Report(value, None, None, "NoReport" if not remaining else "StillQueued")
    return [reports[v] for v in values]


def kafka_python_stream(bootstrap: str, topic: str, values: Sequence[bytes], *, idempotent: bool,
                        compression: str) -> list[Report]:
    from kafka import KafkaProducer
    producer = KafkaProducer(
        bootstrap_servers=bootstrap, enable_idempotence=idempotent, acks="all",
        compression_type=None if compression == "none" else compression, linger_ms=5, batch_size=SMALL_BATCH_BYTES,
        retry_backoff_ms=20, reconnect_backoff_ms=20, reconnect_backoff_max_ms=200,
        request_timeout_ms=10_000, delivery_timeout_ms=DELIVERY_TIMEOUT_S * 1000,
        max_in_flight_requests_per_connection=5)
    try:
        futures = [producer.send(topic, key=_key(v), value=v) for v in values]
        producer.flush(DELIVERY_TIMEOUT_S + 10)
        return kafka_python_reports(values, futures)
    finally:
        producer.close(timeout=10)


def kafka_python_reports(values: Sequence[bytes], futures: Sequence) -> list[Report]:
    """One Report per value from kafka-python's send() futures, once flushed."""
    out = []
    for value, future in zip(values, futures):
        try:
            md = future.get(timeout=1)
            out.append(Report(value, md.partition, md.offset if md.offset >= 0 else None, None))
        except Exception as exc:  # noqa: BLE001 - any failure is a failed delivery, counted
            out.append(Report(value, None, None, type(exc).__name__))
    return out


def aiokafka_stream(bootstrap: str, topic: str, values: Sequence[bytes], *, idempotent: bool,
                    compression: str) -> list[Report]:
    from aiokafka import AIOKafkaProducer

    async def go() -> list[Report]:
        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap, enable_idempotence=idempotent, acks="all",
            compression_type=None if compression == "none" else compression, linger_ms=5,
            max_batch_size=SMALL_BATCH_BYTES, retry_backoff_ms=20, request_timeout_ms=10_000)
        await producer.start()
        try:
            futures = [await producer.send(topic, key=_key(v), value=v) for v in values]
            results = await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True),
                                             DELIVERY_TIMEOUT_S + 10)
        finally:
            await asyncio.wait_for(producer.stop(), 15)
        out = []
        for value, md in zip(values, results):
            if isinstance(md, BaseException):
                out.append(Report(value, None, None, type(md).__name__))
            else:
                out.append(Report(value, md.partition, md.offset if md.offset >= 0 else None, None))
        return out
    return asyncio.run(go())


def java_stream(bootstrap: str, topic: str, values: Sequence[bytes], *, idempotent: bool,
                compression: str) -> list[Report]:
    """The Java harness numbers its values itself: value_prefix + i, so `values` must be stream_values()."""
    prefix = values[0].rsplit(b"-", 1)[0].decode() + "-"
    extra = {"batch.size": SMALL_BATCH_BYTES, "retry.backoff.ms": 20, "reconnect.backoff.ms": 20,
             "reconnect.backoff.max.ms": 200}
    if not idempotent:
        extra["retries"] = 1_000_000
    deliveries = java_produce(bootstrap, topic, len(values), idempotence=idempotent, max_in_flight=5,
                              compression=compression, key_prefix="k", value_prefix=prefix,
                              extra_props=extra, timeout=DELIVERY_TIMEOUT_S + 30)
    by_value = {d.value.encode(): d for d in deliveries}
    return [Report(v, by_value[v].partition, by_value[v].offset if by_value[v].ok else None, by_value[v].error)
            for v in values]


Runner = Callable[..., list[Report]]
RUNNERS: dict[str, Runner] = {
    "confluent": confluent_stream,
    "confluent-pipelined": lambda *a, **kw: confluent_stream(*a, pipelined=True, **kw),
    "java": java_stream,
    "kafka-python": kafka_python_stream,
    "aiokafka": aiokafka_stream,
}
