"""Executor side of a read: the records of one offset range, as rows of Spark's Kafka source schema.

Offsets may have holes (records kop dropped as duplicates leave them, as compaction does), and the range's end may lie
beyond the partition's last record: the read ends when the consumer's position or the end of the partition reaches
the range's end, never by waiting for an offset that will not come."""
import datetime
from collections.abc import Iterator

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from kop.spark.offsets import OffsetRange
from kop.spark.options import EARLIEST

POLL_TIMEOUT_S = 1.0
STALL_TIMEOUT_S = 60.0  # no progress for this long: the range cannot be read (the broker is gone or the log shrank)
EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)  # aware: Spark reads it as an instant


class RangeReadError(RuntimeError):
    """A range could not be read to its end; the message says which and why."""


def read_range(config: dict[str, str], span: OffsetRange, include_headers: bool) -> Iterator[tuple]:
    consumer = Consumer({**config, "group.id": "kop-spark-reader", "enable.auto.commit": False,
                         "enable.partition.eof": True, "auto.offset.reset": "error"})
    try:
        start = OFFSET_BEGINNING if span.start == EARLIEST else span.start
        partition = TopicPartition(span.topic, span.partition, start)
        consumer.assign([partition])
        stalled = 0.0
        while True:
            message = consumer.poll(POLL_TIMEOUT_S)
            if message is None:
                if _position(consumer, partition) >= span.end:
                    return  # the last batch covered the range's end (its last records were dropped or were markers)
                stalled += POLL_TIMEOUT_S
            elif message.error() is None:
                if message.offset() >= span.end:
                    return
                stalled = 0.0
                yield _row(message, include_headers)
            elif message.error().code() == KafkaError._PARTITION_EOF:
                if message.offset() >= span.end:
                    return  # the partition ends at or past the range's end: any offsets left were holes
            else:
                raise RangeReadError(f"reading {span}: {message.error().str()}")
            if stalled >= STALL_TIMEOUT_S:
                raise RangeReadError(f"reading {span}: no record for {STALL_TIMEOUT_S:.0f}s before the range's end")
    finally:
        consumer.close()


def _position(consumer: Consumer, partition: TopicPartition) -> int:
    try:
        return consumer.position([partition])[0].offset
    except KafkaException:
        return -1


def _row(message, include_headers: bool) -> tuple:
    timestamp_type, timestamp_ms = message.timestamp()
    row = (message.key(), message.value(), message.topic(), message.partition(), message.offset(),
           EPOCH + datetime.timedelta(milliseconds=timestamp_ms), timestamp_type - 1)
    if include_headers:
        row += ([(key, value) for key, value in message.headers() or ()],)
    return row
