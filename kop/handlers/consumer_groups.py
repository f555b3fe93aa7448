"""KIP-848's consumer group protocol (the logic is in kop.groups.consumer). Version notes:

- ConsumerGroupHeartbeat (68) v0-1: v1 adds SubscribedTopicRegex. The Java client 3.9 sends v0, librdkafka 2.x
  only v1. Needs READ on the group and DESCRIBE on every topic subscribed to by name (TOPIC_AUTHORIZATION_FAILED
  otherwise, as Kafka 4 answers); a regex matches only the topics the principal may describe.
- ConsumerGroupDescribe (69) v0-1: v1 adds each member's type (0: classic protocol, 1: consumer protocol). Needs
  DESCRIBE on the group and on the topics its members subscribe to or hold.
"""
import uuid

from kop.groups.consumer.group import ConsumerGroup
from kop.groups.consumer.heartbeat import Heartbeat
from kop.groups.consumer.member import Partitions, by_topic
from kop.handlers.context import RequestContext
from kop.handlers.groups import client_host, may_read_group
from kop.security.acls import NOT_REQUESTED, Operation, ResourceType, operations_bits
from protocol.api import id_bytes
from protocol.consumer_groups import (ConsumerGroupDescribeRequest, ConsumerGroupDescribeResponse,
                                      ConsumerGroupHeartbeatRequest, ConsumerGroupHeartbeatResponse)
from protocol.errors import ErrorCode

CLASSIC_MEMBER_TYPE, CONSUMER_MEMBER_TYPE = 0, 1


def _may_describe_topic(ctx: RequestContext, topic: str) -> bool:
    return ctx.authorized(Operation.DESCRIBE, ResourceType.TOPIC, topic)


# ---- ConsumerGroupHeartbeat

def _owned(ctx: RequestContext, request: ConsumerGroupHeartbeatRequest) -> Partitions | None:
    if request.topic_partitions is None:
        return None
    owned = set()
    for tp in request.topic_partitions:
        name = ctx.topics.name_of(id_bytes(tp.topic_id))
        if name is not None:  # a topic deleted since: nothing to revoke
            owned.update((name, p) for p in tp.partitions)
    return frozenset(owned)


async def consumer_group_heartbeat(ctx: RequestContext,
                                   request: ConsumerGroupHeartbeatRequest) -> ConsumerGroupHeartbeatResponse:
    cls = ConsumerGroupHeartbeatResponse[ctx.version]
    interval = ctx.groups.consumer.heartbeat_interval_ms

    def error(code: ErrorCode, message: str | None = None) -> ConsumerGroupHeartbeatResponse:
        return cls(throttle_time_ms=0, error_code=code, error_message=message, member_epoch=request.member_epoch,
                   heartbeat_interval_ms=interval)

    if not may_read_group(ctx, request.group_id):
        return error(ErrorCode.GROUP_AUTHORIZATION_FAILED)
    names = request.subscribed_topic_names
    hidden = sorted(t for t in names or () if not _may_describe_topic(ctx, t))
    if hidden:
        return error(ErrorCode.TOPIC_AUTHORIZATION_FAILED, f"not authorized to describe {', '.join(hidden)}")
    hb = Heartbeat(
        group_id=request.group_id, member_id=request.member_id or "", member_epoch=request.member_epoch,
        instance_id=request.instance_id, rack_id=request.rack_id, rebalance_timeout_ms=request.rebalance_timeout_ms,
        subscribed_names=None if names is None else tuple(names),
        subscribed_regex=request.subscribed_topic_regex if ctx.version >= 1 else None,
        server_assignor=request.server_assignor, owned=_owned(ctx, request),
        client_id=ctx.client_id, client_host=client_host(ctx))
    result = await ctx.groups.consumer_heartbeat(hb, lambda topic: _may_describe_topic(ctx, topic))
    assignment = None
    if result.assignment is not None:
        assignment = cls.Assignment(topic_partitions=[
            cls.Assignment.TopicPartitions(topic_id=uuid.UUID(bytes=topic.topic_id), partitions=partitions)
            for name, partitions in by_topic(result.assignment).items()
            if (topic := ctx.topics.get(name)) is not None])
    return cls(throttle_time_ms=0, error_code=result.error, error_message=result.message,
               member_id=result.member_id, member_epoch=result.member_epoch, heartbeat_interval_ms=interval,
               assignment=assignment)


# ---- ConsumerGroupDescribe

def _assignment(ctx: RequestContext, cls: type, partitions: Partitions):
    TopicPartitions = cls.DescribedGroup.Member.Assignment.TopicPartitions
    return cls.DescribedGroup.Member.Assignment(topic_partitions=[
        TopicPartitions(topic_id=uuid.UUID(bytes=topic.topic_id), topic_name=name, partitions=indexes)
        for name, indexes in by_topic(partitions).items() if (topic := ctx.topics.get(name)) is not None])


def _described(ctx: RequestContext, cls: type, group: ConsumerGroup, operations: int):
    Member = cls.DescribedGroup.Member
    members = [Member(member_id=m.member_id, instance_id=m.instance_id, rack_id=m.rack_id, member_epoch=m.epoch,
                      client_id=m.client_id, client_host=m.client_host,
                      subscribed_topic_names=sorted(m.subscribed_names), subscribed_topic_regex=m.subscribed_regex,
                      assignment=_assignment(ctx, cls, m.assigned),
                      target_assignment=_assignment(ctx, cls, group.target.get(m.member_id, frozenset())),
                      member_type=CLASSIC_MEMBER_TYPE if m.classic is not None else CONSUMER_MEMBER_TYPE)
               for m in group.members.values()]
    return cls.DescribedGroup(error_code=ErrorCode.NONE, group_id=group.group_id, group_state=group.state.value,
                              group_epoch=group.epoch, assignment_epoch=group.assignment_epoch,
                              assignor_name=group.assignor, members=members, authorized_operations=operations)


def _group_topics(group: ConsumerGroup) -> set[str]:
    topics = set(group.subscribed_topics())
    for member in group.members.values():
        topics.update(t for t, _ in member.assigned | member.revoking)
    return topics


async def consumer_group_describe(ctx: RequestContext,
                                  request: ConsumerGroupDescribeRequest) -> ConsumerGroupDescribeResponse:
    cls = ConsumerGroupDescribeResponse[ctx.version]
    out = []
    for group_id in request.group_ids:
        def failed(code: ErrorCode, message: str | None = None):
            return cls.DescribedGroup(error_code=code, error_message=message, group_id=group_id, group_state="",
                                      group_epoch=0, assignment_epoch=0, assignor_name="", members=[],
                                      authorized_operations=NOT_REQUESTED)
        if not ctx.authorized(Operation.DESCRIBE, ResourceType.GROUP, group_id):
            out.append(failed(ErrorCode.GROUP_AUTHORIZATION_FAILED))
            continue
        operations = operations_bits(ctx.authorized_operations(ResourceType.GROUP, group_id)) \
            if request.include_authorized_operations else NOT_REQUESTED
        error = ctx.groups.check(group_id)
        group = ctx.groups.consumer_group(group_id) if error is None else None
        if error is not None:
            out.append(failed(error))
        elif group is None:
            kind = "is not a consumer group" if group_id in ctx.groups.groups else "not found"
            out.append(failed(ErrorCode.GROUP_ID_NOT_FOUND, f"Group {group_id} {kind}."))
        elif any(not _may_describe_topic(ctx, t) for t in _group_topics(group)):
            out.append(failed(ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                              "not authorized to describe every topic of the group"))
        else:
            out.append(_described(ctx, cls, group, operations))
    return cls(throttle_time_ms=0, groups=out)


ROUTES = [
    (ConsumerGroupHeartbeatRequest.API_KEY, 0, 1, consumer_group_heartbeat),
    (ConsumerGroupDescribeRequest.API_KEY, 0, 1, consumer_group_describe),
]
