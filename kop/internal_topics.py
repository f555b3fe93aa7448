"""Kafka's internal topics as kop shows them. `__consumer_offsets` is listed (Metadata, DescribeTopicPartitions) as
an internal topic with Kafka's default 50 partitions, so clients' `exclude.internal.topics` and tools that hide
internal topics see what they see on Kafka. Its records are refused: kop keeps committed offsets in group cursors,
not in a log, so there are no stable offsets to serve them at (docs/compatibility.md says more)."""
import uuid

from protocol.errors import ErrorCode

CONSUMER_OFFSETS = "__consumer_offsets"
CONSUMER_OFFSETS_PARTITIONS = 50  # Kafka's offsets.topic.num.partitions default
# Fixed for every kop: the id names the same (absent) log everywhere.
CONSUMER_OFFSETS_ID = uuid.uuid5(uuid.NAMESPACE_URL, "kop:internal-topic:" + CONSUMER_OFFSETS)
# The overrides Kafka creates it with, reported by DescribeConfigs (`kafka-topics.sh --describe` asks for them).
CONSUMER_OFFSETS_CONFIGS = {"cleanup.policy": "compact", "compression.type": "producer", "segment.bytes": "104857600"}
# What Kafka answers to a client that may not read or write a topic; every client reports it with the topic's name.
REFUSED = ErrorCode.TOPIC_AUTHORIZATION_FAILED
REFUSAL = (f"{CONSUMER_OFFSETS} cannot be read or written on kop: committed offsets live in the group cursors "
           "(OffsetFetch, DescribeGroups, `kop admin`)")


def is_internal(name: str | None) -> bool:
    return name == CONSUMER_OFFSETS


def name_of(topic_id: bytes) -> str | None:
    return CONSUMER_OFFSETS if topic_id == CONSUMER_OFFSETS_ID.bytes else None


def missing_partition_error(name: str | None) -> ErrorCode:
    """The error for a partition kop has no log for: refused for an internal topic, unknown otherwise."""
    return REFUSED if is_internal(name) else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
