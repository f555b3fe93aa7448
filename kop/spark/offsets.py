"""Driver-side planning: which partitions a topic has and which offsets `earliest`/`latest` mean now, as
per-partition offset ranges (one Spark task each)."""
from dataclasses import dataclass

from confluent_kafka import Consumer, TopicPartition

from kop.spark.options import EARLIEST, LATEST, OffsetSpec, OptionError

METADATA_TIMEOUT_S = 30.0

# Streaming offsets are JSON: {"topic": {"partition": next offset}}, as Spark's Kafka source checkpoints them.
Positions = dict[str, dict[str, int]]


@dataclass(frozen=True)
class OffsetRange:
    """[start, end) of one partition: the records a task reads (`start` EARLIEST: from the log start). Offsets in it
    may be holes (records dropped as duplicates, transaction markers); `end` need not be the offset of a record."""
    topic: str
    partition: int
    start: int
    end: int


class TopicOffsets:
    """Lists partitions and queries watermarks through one consumer that never joins a group."""

    def __init__(self, config: dict[str, str]) -> None:
        self._consumer = Consumer({**config, "group.id": "kop-spark-planner", "enable.auto.commit": False})

    def close(self) -> None:
        self._consumer.close()

    def partitions(self, topic: str) -> list[int]:
        metadata = self._consumer.list_topics(topic, timeout=METADATA_TIMEOUT_S).topics.get(topic)
        if metadata is None or metadata.error is not None or not metadata.partitions:
            reason = metadata.error.str() if metadata is not None and metadata.error else "no partitions"
            raise OptionError(f"topic {topic!r} cannot be read: {reason}")
        return sorted(metadata.partitions)

    def positions(self, topics: list[str], spec: OffsetSpec) -> Positions:
        """The offset each partition of `topics` starts (or ends) at under `spec`, resolved now."""
        return {topic: {str(p): self._resolve(topic, p, spec.offset_for(topic, p)) for p in self.partitions(topic)}
                for topic in topics}

    def latest(self, topics: list[str]) -> Positions:
        return self.positions(topics, OffsetSpec(LATEST, {}))

    def _resolve(self, topic: str, partition: int, offset: int) -> int:
        if offset >= 0:
            return offset
        low, high = self._consumer.get_watermark_offsets(TopicPartition(topic, partition),
                                                         timeout=METADATA_TIMEOUT_S, cached=False)
        return low if offset == EARLIEST else high


def ranges_between(start: Positions, end: Positions) -> list[OffsetRange]:
    """One range per partition with records between two positions; a partition new since `start` is read from its
    earliest offset, as Spark's Kafka source does."""
    return [OffsetRange(topic, int(partition), start.get(topic, {}).get(partition, EARLIEST), stop)
            for topic, partitions in sorted(end.items())
            for partition, stop in sorted(partitions.items(), key=lambda item: int(item[0]))
            if start.get(topic, {}).get(partition, EARLIEST) < stop]
