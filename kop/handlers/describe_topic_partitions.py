"""DescribeTopicPartitions (key 75, KIP-966; Kafka 4.x admin tools describe topics with it). Version notes: v0 only.
An empty topic list means every topic. Topics are answered in name order; at most ResponsePartitionLimit partitions
(capped at Kafka's 2000) per response, and NextCursor names the topic and partition to ask for next. A cursor whose
topic is not among those asked for is INVALID_REQUEST for every topic, as in Kafka. A principal sees only the topics
it may describe: the others are left out of a listing of every topic and answered TOPIC_AUTHORIZATION_FAILED when
named; each topic listed says what the principal may do on it (KIP-430)."""
import uuid
from typing import Any

from kafka.protocol.admin import DescribeTopicPartitionsRequest, DescribeTopicPartitionsResponse

from kop import internal_topics
from kop.handlers.context import RequestContext
from kop.security.acls import NOT_REQUESTED, Operation, ResourceType, operations_bits
from protocol.errors import ErrorCode

MAX_PARTITIONS_PER_RESPONSE = 2000  # Kafka's max.request.partition.size.limit default


def _shape(ctx: RequestContext, name: str) -> tuple[int, uuid.UUID] | None:
    """(partition count, topic id) of a topic clients may see, None if there is none."""
    if internal_topics.is_internal(name):
        return internal_topics.CONSUMER_OFFSETS_PARTITIONS, internal_topics.CONSUMER_OFFSETS_ID
    topic = ctx.topics.get(name)
    return None if topic is None else (topic.count, uuid.UUID(bytes=topic.topic_id))


def _topic(cls: type[DescribeTopicPartitionsResponse], name: str, error: ErrorCode,
           topic_id: uuid.UUID = uuid.UUID(int=0)) -> Any:
    return cls.DescribeTopicPartitionsResponseTopic(
        error_code=error, name=name, topic_id=topic_id, is_internal=internal_topics.is_internal(name), partitions=[],
        topic_authorized_operations=NOT_REQUESTED)


async def handle(ctx: RequestContext, request: DescribeTopicPartitionsRequest) -> DescribeTopicPartitionsResponse:
    cls = DescribeTopicPartitionsResponse[ctx.version]
    Partition = cls.DescribeTopicPartitionsResponseTopic.DescribeTopicPartitionsResponsePartition

    def visible(name: str) -> bool:
        return ctx.authorized(Operation.DESCRIBE, ResourceType.TOPIC, name)
    asked = sorted({t.name for t in request.topics}) if request.topics else \
        [n for n in sorted([*ctx.topics.topics, internal_topics.CONSUMER_OFFSETS]) if visible(n)]
    cursor = request.cursor
    if cursor is not None and request.topics and cursor.topic_name not in asked:
        return cls(throttle_time_ms=0, next_cursor=None,
                   topics=[_topic(cls, name, ErrorCode.INVALID_REQUEST) for name in asked])
    names = [n for n in asked if cursor is None or n >= cursor.topic_name]
    room = max(1, min(request.response_partition_limit, MAX_PARTITIONS_PER_RESPONSE))
    topics, next_cursor = [], None
    for i, name in enumerate(names):
        if room == 0:
            next_cursor = cls.Cursor(topic_name=name, partition_index=0)
            break
        if not visible(name):
            topics.append(_topic(cls, name, ErrorCode.TOPIC_AUTHORIZATION_FAILED))
            continue
        shape = _shape(ctx, name)
        if shape is None:
            topics.append(_topic(cls, name, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))
            continue
        count, topic_id = shape
        entry = _topic(cls, name, ErrorCode.NONE, topic_id)
        entry.topic_authorized_operations = operations_bits(ctx.authorized_operations(ResourceType.TOPIC, name))
        first = cursor.partition_index if cursor is not None and i == 0 and name == cursor.topic_name else 0
        first = max(0, min(first, count))  # a cursor past the end lists none of this topic
        end = min(count, first + room)
        leaders = {p: ctx.cluster.leader(name, p) for p in range(first, end)}  # __consumer_offsets: by its shards
        entry.partitions = [Partition(error_code=ErrorCode.NONE, partition_index=p, leader_id=leader, leader_epoch=0,
                                      replica_nodes=[leader], isr_nodes=[leader], eligible_leader_replicas=[],
                                      last_known_elr=[], offline_replicas=[])
                            for p, leader in leaders.items()]
        topics.append(entry)
        room -= end - first
        if end < count:
            next_cursor = cls.Cursor(topic_name=name, partition_index=end)
            break
    return cls(throttle_time_ms=0, topics=topics, next_cursor=next_cursor)


ROUTES = [(DescribeTopicPartitionsRequest.API_KEY, 0, 0, handle)]
