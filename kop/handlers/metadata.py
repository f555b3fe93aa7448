"""Metadata (key 3). Version notes: v0 with an empty list means all topics, v1+ uses null for that; v4+ carries
AllowAutoTopicCreation; v10+ topic ids; v8-10 cluster authorized operations. One broker leads every partition."""
import uuid

from kop.topics import TopicError, validate_topic_name
from protocol.api import response_class
from protocol.errors import ErrorCode


def broker_list(ctx, cls):
    cfg = ctx.broker.config
    return [cls.MetadataResponseBroker(node_id=cfg.node_id, host=cfg.advertised, port=ctx.broker.advertised_port, rack=None)]


def topic_entry(ctx, cls, name, topic, error=ErrorCode.NONE):
    node = ctx.broker.config.node_id
    partitions = [] if topic is None else [
        cls.MetadataResponseTopic.MetadataResponsePartition(
            error_code=ErrorCode.NONE, partition_index=p, leader_id=node, leader_epoch=0,
            replica_nodes=[node], isr_nodes=[node], offline_replicas=[])
        for p in range(len(topic.partitions))]
    topic_id = uuid.UUID(bytes=topic.topic_id) if topic is not None else uuid.UUID(int=0)
    return cls.MetadataResponseTopic(error_code=error, name=name, topic_id=topic_id, is_internal=False,
                                     partitions=partitions)


async def handle(ctx, request):
    cls = response_class(3, ctx.version)
    topics_mgr = ctx.broker.topics
    wanted = request.topics
    if wanted is None or (ctx.version == 0 and not wanted):
        names = sorted(topics_mgr.topics)
        entries = [topic_entry(ctx, cls, n, topics_mgr.get(n)) for n in names]
    else:
        auto = ctx.version < 4 or request.allow_auto_topic_creation
        entries = []
        for item in wanted:
            name = item.name
            if name is None:  # lookup by topic id (v10+)
                match = next((t for t in topics_mgr.topics.values() if t.topic_id == item.topic_id.bytes), None)
                entries.append(topic_entry(ctx, cls, match.name if match else None, match,
                                           ErrorCode.NONE if match else ErrorCode.UNKNOWN_TOPIC_ID))
                continue
            try:
                validate_topic_name(name)
                topic = await topics_mgr.get_or_create(name) if auto else topics_mgr.get(name)
            except TopicError as exc:
                entries.append(topic_entry(ctx, cls, name, None, exc.code))
                continue
            error = ErrorCode.NONE if topic else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            entries.append(topic_entry(ctx, cls, name, topic, error))
    return cls(throttle_time_ms=0, brokers=broker_list(ctx, cls), cluster_id=ctx.broker.config.cluster_id,
               controller_id=ctx.broker.config.node_id, topics=entries)


ROUTES = [(3, 0, 12, handle)]
