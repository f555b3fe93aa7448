"""Executor side of a write: one Spark task's rows to kop through an idempotent producer.

The producer is idempotent with acks=all, so the records of one producer name reach each partition in the order the
task wrote them (the order kop's per-record deduplication relies on). The task succeeds only once every record is
acknowledged: it flushes, then checks every delivery report, and raises on the first failure, so Spark retries it
(and the retry's records are deduplicated by their sequence-id headers)."""
import time
from collections.abc import Iterable
from dataclasses import dataclass

from confluent_kafka import KafkaError, Producer

from kop.spark.faults import Faults, InjectedTaskFailure

FLUSH_TIMEOUT_S = 300.0
PRODUCER_DEFAULTS = {
    "enable.idempotence": True,
    "acks": "all",
    # Java's default partitioner (murmur2 of the key), so a key lands where Spark's Kafka sink would put it.
    "partitioner": "murmur2_random",
}


class TaskWriteError(RuntimeError):
    """Some record of the task was not acknowledged; the message says how many and the first reason."""


@dataclass(frozen=True)
class WrittenRecord:
    """A row to write, in the sink schema's terms: topic, key, value, headers, partition (None: by the key)."""
    topic: str
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] | None
    partition: int | None


class DeliveryTracker:
    """Counts the delivery reports of one producer and keeps the first error."""

    def __init__(self) -> None:
        self.acknowledged = 0
        self.failed = 0
        self.first_error: KafkaError | None = None

    def __call__(self, error: KafkaError | None, message) -> None:
        if error is None:
            self.acknowledged += 1
            return
        self.failed += 1
        self.first_error = self.first_error or error


def write_records(config: dict[str, str], records: Iterable[WrittenRecord], faults: Faults = Faults()) -> int:
    """Write all `records`, wait for every acknowledgement, and return how many there were."""
    producer = Producer({**config, **PRODUCER_DEFAULTS})
    tracker = DeliveryTracker()
    sent = 0
    for record in records:
        if sent == faults.fail_after_rows > 0:
            producer.flush(FLUSH_TIMEOUT_S)
            raise InjectedTaskFailure(f"the task fails on purpose after storing {tracker.acknowledged} records")
        if faults.row_delay_ms:
            time.sleep(faults.row_delay_ms / 1000)
        _produce(producer, record, tracker)
        sent += 1
    unsent = producer.flush(FLUSH_TIMEOUT_S)
    if unsent:
        raise TaskWriteError(f"{unsent} of {sent} records not acknowledged within {FLUSH_TIMEOUT_S:.0f}s")
    if tracker.failed:
        raise TaskWriteError(f"{tracker.failed} of {sent} records failed; first: {tracker.first_error}")
    return tracker.acknowledged


def _produce(producer: Producer, record: WrittenRecord, tracker: DeliveryTracker) -> None:
    kwargs = {"key": record.key, "value": record.value, "headers": record.headers, "on_delivery": tracker}
    if record.partition is not None:
        kwargs["partition"] = record.partition
    while True:
        try:
            producer.produce(record.topic, **kwargs)
            break
        except BufferError:  # the local queue is full: serve delivery reports until there is room
            producer.poll(0.1)
    producer.poll(0)
