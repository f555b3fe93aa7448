"""The classic consumer protocol's embedded formats: the subscription a classic consumer sends in its JoinGroup
protocols and the assignment it gets back from SyncGroup. A consumer group reads the first to learn what a classic
member subscribes to and still owns, and writes the second from the partitions the group assigned it; converting a
group between the two protocols reads and writes both. kafka-python's schemas do the encoding.

Every version so far (0-3) is understood; a newer one is read as version 3 (the fields of later versions come after
those), and an assignment is written in the member's own version, capped at 3, as Kafka writes it.
"""
import struct
from dataclasses import dataclass

from kafka.protocol.consumer.metadata import ConsumerProtocolAssignment, ConsumerProtocolSubscription

from kop.groups.consumer.member import Partitions, by_topic

LATEST_VERSION = 3


class EmbeddedProtocolError(ValueError):
    """Bytes that are not the consumer protocol's subscription or assignment."""


@dataclass(frozen=True, slots=True)
class Subscription:
    version: int
    topics: frozenset[str]
    owned: Partitions  # what the member still owns as it joins (version 1+; an older member owns nothing then)
    rack_id: str | None


def version_of(data: bytes) -> int:
    if len(data) < 2:
        raise EmbeddedProtocolError("too short for a consumer protocol version")
    (version,) = struct.unpack_from(">h", data)
    if version < 0:
        raise EmbeddedProtocolError(f"consumer protocol version {version}")
    return version


def _known(data: bytes) -> bytes:
    """The bytes with a version newer than LATEST_VERSION read as LATEST_VERSION."""
    return data if version_of(data) <= LATEST_VERSION else struct.pack(">h", LATEST_VERSION) + data[2:]


def parse_subscription(metadata: bytes) -> Subscription:
    try:
        sub = ConsumerProtocolSubscription.decode(_known(metadata))
    except (struct.error, ValueError) as exc:
        raise EmbeddedProtocolError(f"malformed consumer protocol subscription: {exc}") from None
    version = version_of(metadata)
    owned = getattr(sub, "owned_partitions", None) if version >= 1 else None
    return Subscription(version, frozenset(sub.topics or ()),
                        frozenset((tp.topic, p) for tp in owned or () for p in tp.partitions),
                        getattr(sub, "rack_id", None) if version >= 3 else None)


def parse_assignment(data: bytes) -> tuple[Partitions, bytes | None]:
    """The partitions and the assignor's user data; an empty assignment (a member that never synced) is none."""
    if not data:
        return frozenset(), None
    try:
        assignment = ConsumerProtocolAssignment.decode(_known(data))
    except (struct.error, ValueError) as exc:
        raise EmbeddedProtocolError(f"malformed consumer protocol assignment: {exc}") from None
    partitions = frozenset((tp.topic, p) for tp in assignment.assigned_partitions or () for p in tp.partitions)
    return partitions, assignment.user_data or None


def encode_assignment(partitions: Partitions, version: int = 0) -> bytes:
    version = min(max(version, 0), LATEST_VERSION)
    return ConsumerProtocolAssignment(
        version=version, user_data=None, assigned_partitions=[
            ConsumerProtocolAssignment.TopicPartition(topic=topic, partitions=indexes)
            for topic, indexes in by_topic(partitions).items()]).encode()


def encode_subscription(topics: frozenset[str] | set[str]) -> bytes:
    return ConsumerProtocolSubscription(version=0, topics=sorted(topics), user_data=None).encode()
