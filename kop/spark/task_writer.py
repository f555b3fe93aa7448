"""Executor side of a write: one Spark task's rows to kop through an idempotent producer.

The producer is idempotent with acks=all, so the records of one producer name reach each partition in the order the
task wrote them (the order kop's per-record deduplication relies on). The task succeeds only once every record is
acknowledged: it flushes, then checks every delivery report, and raises on the first failure, so Spark retries it
(and the retry's records are deduplicated by their sequence-id headers).

The client never gives up on a record by itself (`message.timeout.ms` 0, as Pulsar advises `sendTimeout(0)` for
deduplication): a record dropped on a timeout while a later record of its name is stored would leave a gap that
sequence ids cannot fill, since an id at or below the highest stored is a duplicate. The task decides instead: when
records are outstanding and none has been acknowledged for the `message.timeout.ms` given (5 minutes by default),
it purges all it has not sent, so nothing of it is stored behind a record that is not, and fails; Spark retries
it."""
import time
from collections.abc import Iterable
from dataclasses import dataclass

from confluent_kafka import KafkaError, Producer

from kop.spark.faults import Faults, InjectedTaskFailure

DEFAULT_DEADLINE_MS = 300_000
DEADLINE_KEYS = ("message.timeout.ms", "delivery.timeout.ms")  # librdkafka's name, and its alias (Java's)
PRODUCER_DEFAULTS = {
    "enable.idempotence": True,
    "acks": "all",
    "message.timeout.ms": 0,  # never: the task's deadline decides, for all its records at once
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
    """Counts the delivery reports of one producer and keeps the first error, and when the last report came."""

    def __init__(self) -> None:
        self.acknowledged = 0
        self.failed = 0
        self.first_error: KafkaError | None = None
        self.last_report = time.monotonic()

    def __call__(self, error: KafkaError | None, message) -> None:
        self.last_report = time.monotonic()
        if error is None:
            self.acknowledged += 1
            return
        self.failed += 1
        self.first_error = self.first_error or error


def write_records(config: dict[str, str], records: Iterable[WrittenRecord], faults: Faults = Faults()) -> int:
    """Write all `records`, wait for every acknowledgement, and return how many there were."""
    deadline_s = int(next((config[k] for k in DEADLINE_KEYS if k in config), DEFAULT_DEADLINE_MS)) / 1000
    client = {k: v for k, v in config.items() if k not in DEADLINE_KEYS}
    producer = Producer({**client, **PRODUCER_DEFAULTS})
    tracker = DeliveryTracker()
    sent = 0
    for record in records:
        if sent == faults.fail_after_rows > 0:
            producer.flush(deadline_s)
            raise InjectedTaskFailure(f"the task fails on purpose after storing {tracker.acknowledged} records")
        if faults.row_delay_ms:
            time.sleep(faults.row_delay_ms / 1000)
        _produce(producer, record, tracker)
        sent += 1
        _fail_if_stalled(producer, tracker, deadline_s, sent)
    while producer.flush(min(deadline_s, 0.5)):
        _fail_if_stalled(producer, tracker, deadline_s, sent)
    if tracker.failed:
        raise TaskWriteError(f"{tracker.failed} of {sent} records failed; first: {tracker.first_error}")
    return tracker.acknowledged


def _fail_if_stalled(producer: Producer, tracker: DeliveryTracker, deadline_s: float, sent: int) -> None:
    """Records outstanding, none acknowledged for `deadline_s`: purge them all (none may be stored behind one that
    is not) and fail the task."""
    if not len(producer) or time.monotonic() - tracker.last_report < deadline_s:
        return
    outstanding = len(producer)
    producer.purge(in_queue=True, in_flight=True)
    producer.flush(0)
    raise TaskWriteError(f"{outstanding} of {sent} records not acknowledged, none for {deadline_s:g}s: purged")


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
