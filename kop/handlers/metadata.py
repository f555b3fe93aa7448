"""Metadata (key 3). Version notes: v0 with an empty list means all topics, v1+ uses null for that; v4+ carries
AllowAutoTopicCreation; v8+ the operations the principal may do on each topic, v8-10 on the cluster, when asked
(KIP-430); v10+ topic ids; v13+ a top-level error code (always NONE: a topic the principal may not describe is
refused on its own entry). Brokers are the live members of the cluster (this one alone on the
file engine), each at its address on the listener the request came by; a partition's leader is its owner
(kop/cluster), LEADER_NOT_AVAILABLE while no broker is live. `__consumer_offsets` is listed as internal
(kop/internal_topics.py), each partition led by the coordinator of the groups it shards."""
import uuid
from typing import Any

from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from kop import internal_topics
from kop.handlers.context import RequestContext
from kop.security.acls import CLUSTER_NAME, Operation, ResourceType
from kop.topics import Topic, TopicError, validate_topic_name
from protocol.api import id_bytes
from protocol.errors import ErrorCode


def endpoints(ctx: RequestContext) -> dict[int, tuple[str, int]]:
    """node id -> (host, port) of every live broker on the listener the request came by (this one included)."""
    me = ctx.endpoint
    found = {member.node_id: member.endpoints[me.listener] for member in ctx.cluster.members()
             if me.listener in member.endpoints}
    found[me.node_id] = (me.host, me.port)
    return found


def broker_list(ctx: RequestContext, cls: type[MetadataResponse]) -> list[Any]:
    return [cls.MetadataResponseBroker(node_id=node, host=host, port=port, rack=None)
            for node, (host, port) in sorted(endpoints(ctx).items())]


def _partition(cls: type[MetadataResponse], index: int, leader: int) -> Any:
    error = ErrorCode.NONE if leader >= 0 else ErrorCode.LEADER_NOT_AVAILABLE
    replicas = [leader] if leader >= 0 else []
    return cls.MetadataResponseTopic.MetadataResponsePartition(
        error_code=error, partition_index=index, leader_id=leader, leader_epoch=0, replica_nodes=replicas,
        isr_nodes=replicas, offline_replicas=[])


def topic_entry(ctx: RequestContext, cls: type[MetadataResponse], name: str | None, topic: Topic | None,
                error: ErrorCode = ErrorCode.NONE) -> Any:
    if internal_topics.is_internal(name):  # led by the group coordinators of its shards (kop/cluster/groups.py)
        error = ErrorCode.NONE
        partitions = [_partition(cls, p, ctx.cluster.leader(internal_topics.CONSUMER_OFFSETS, p))
                      for p in range(internal_topics.CONSUMER_OFFSETS_PARTITIONS)]
        topic_id = internal_topics.CONSUMER_OFFSETS_ID
    elif topic is not None:
        partitions = [_partition(cls, p, ctx.cluster.leader(topic.name, p)) for p in range(topic.count)]
        topic_id = uuid.UUID(bytes=topic.topic_id)
    else:
        partitions, topic_id = [], uuid.UUID(int=0)
    return cls.MetadataResponseTopic(error_code=error, name=name, topic_id=topic_id,
                                     is_internal=internal_topics.is_internal(name), partitions=partitions)


async def handle(ctx: RequestContext, request: MetadataRequest) -> MetadataResponse:
    cls = MetadataResponse[ctx.version]
    topics_mgr = ctx.topics
    wanted = request.topics
    if wanted is None or (ctx.version == 0 and not wanted):
        names = [n for n in sorted([*topics_mgr.topics, internal_topics.CONSUMER_OFFSETS])
                 if ctx.authorized(Operation.DESCRIBE, ResourceType.TOPIC, n)]
        entries = [topic_entry(ctx, cls, n, topics_mgr.get(n)) for n in names]
    else:
        auto = ctx.version < 4 or request.allow_auto_topic_creation
        entries = []
        for item in wanted:
            name = item.name
            if name is None:  # lookup by topic id (v10+)
                topic_id = id_bytes(item.topic_id)
                found = topics_mgr.name_of(topic_id) or internal_topics.name_of(topic_id)
                if found and not ctx.authorized(Operation.DESCRIBE, ResourceType.TOPIC, found):
                    # as Kafka: the id is the client's own, the name and partitions are not told
                    entries.append(cls.MetadataResponseTopic(
                        error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED, name=None, topic_id=item.topic_id,
                        is_internal=False, partitions=[]))
                    continue
                entries.append(topic_entry(ctx, cls, found, topics_mgr.get(found) if found else None,
                                           ErrorCode.NONE if found else ErrorCode.UNKNOWN_TOPIC_ID))
                continue
            if not ctx.authorized(Operation.DESCRIBE, ResourceType.TOPIC, name):
                entries.append(topic_entry(ctx, cls, name, None, ErrorCode.TOPIC_AUTHORIZATION_FAILED))
                continue
            creatable = auto and (ctx.authorized_on_cluster(Operation.CREATE)
                                  or ctx.authorized(Operation.CREATE, ResourceType.TOPIC, name))
            try:
                validate_topic_name(name)
                topic = await topics_mgr.get_or_create(name) if creatable else topics_mgr.get(name)
            except TopicError as exc:
                entries.append(topic_entry(ctx, cls, name, None, exc.code))
                continue
            error = ErrorCode.NONE if topic else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            entries.append(topic_entry(ctx, cls, name, topic, error))
    if ctx.version >= 8 and request.include_topic_authorized_operations:
        for entry in entries:
            if entry.error_code == ErrorCode.NONE and entry.name:
                entry.authorized_operations = ctx.authorized_operations(ResourceType.TOPIC, entry.name)
    cluster_operations = ctx.authorized_operations(ResourceType.CLUSTER, CLUSTER_NAME) \
        if 8 <= ctx.version <= 10 and request.include_cluster_authorized_operations else None
    return cls(throttle_time_ms=0, brokers=broker_list(ctx, cls), cluster_id=ctx.config.cluster_id,
               controller_id=ctx.endpoint.node_id, topics=entries, error_code=ErrorCode.NONE,
               authorized_operations=cluster_operations)


ROUTES = [(MetadataRequest.API_KEY, 0, 13, handle)]
