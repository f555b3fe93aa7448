"""Committed offsets: OffsetCommit, OffsetFetch, OffsetDelete. Version notes:

- OffsetCommit (8) v0-9: v0 has no generation (a simple commit, as generation -1 is in v1+: groups without members,
  assign-only consumers and the Reader pattern commit that way); v1 carries a commit timestamp; v2-4 a retention time
  we ignore (offsets live as long as the cursor); v6+ leader epochs; v7+ group.instance.id; v8+ flexible; v9 renames
  the generation to GenerationIdOrMemberEpoch, which for a classic group is still the generation and for a
  consumer-protocol group (KIP-848) the member epoch: a member's commit with another epoch answers
  STALE_MEMBER_EPOCH, an unknown member UNKNOWN_MEMBER_ID, as Kafka does. v10 (topic ids) is not served.
- OffsetFetch (9) v0-9: v2+ null topics mean every partition with an offset, and a top-level error; v5+ leader
  epochs; v7+ require_stable (a partition whose offset an open transaction holds answers UNSTABLE_OFFSET_COMMIT,
  which clients retry until the transaction ends); v8+ many
  groups per request; v9 member id and epoch, which Kafka ignores for classic groups, as we do, and checks for
  consumer-protocol groups (none given: an admin client's fetch), as we do.
- OffsetDelete (47) v0.

Durability: the ordered phase validates and hands every partition's offset to its cursor in request order; the
response waits until all of them are durable.
"""
import asyncio
from collections.abc import Awaitable, Sequence
from typing import Any

from kafka.protocol.consumer import (OffsetCommitRequest, OffsetCommitResponse, OffsetDeleteRequest,
                                     OffsetDeleteResponse, OffsetFetchRequest, OffsetFetchResponse)

from kop.groups import CommittedOffset
from kop.handlers.context import RequestContext
from kop.handlers.groups import may_read_group
from kop.security.acls import Operation, ResourceType
from protocol.errors import ErrorCode

NO_OFFSET = -1
# Per topic, each partition's outcome: an error decided at once, or a future of the code once the commit is durable.
PartitionCommit = tuple[int, ErrorCode | asyncio.Future]
PendingCommits = list[tuple[str, list[PartitionCommit]]]
# Per topic, each partition's committed offset (None: none committed).
Committed = list[tuple[str, list[tuple[int, CommittedOffset | None]]]]


# ---- OffsetCommit

async def offset_commit(ctx: RequestContext, request: OffsetCommitRequest) -> Awaitable[OffsetCommitResponse]:
    v = ctx.version
    cls = OffsetCommitResponse[v]
    groups = ctx.groups
    generation = request.generation_id_or_member_epoch if v >= 1 else -1
    member_id = request.member_id if v >= 1 else ""
    error = ErrorCode.GROUP_AUTHORIZATION_FAILED if not may_read_group(ctx, request.group_id) else \
        groups.validate_commit(request.group_id, generation, member_id or "",
                               request.group_instance_id if v >= 7 else None, commit_version=v)
    pending: PendingCommits = []
    for topic in request.topics:
        per_partition: list[PartitionCommit] = []
        readable = ctx.authorized(Operation.READ, ResourceType.TOPIC, topic.name)
        for p in topic.partitions:
            if error != ErrorCode.NONE or not readable:
                per_partition.append((p.partition_index, error if error != ErrorCode.NONE
                                      else ErrorCode.TOPIC_AUTHORIZATION_FAILED))
                continue
            per_partition.append((p.partition_index, groups.commit(
                request.group_id, topic.name, p.partition_index, p.committed_offset,
                p.committed_leader_epoch if v >= 6 else -1, p.committed_metadata,
                p.commit_timestamp if v == 1 else -1)))
        pending.append((topic.name, per_partition))
    return _commit_response(cls, pending)


async def _commit_response(cls: type[OffsetCommitResponse], pending: PendingCommits) -> OffsetCommitResponse:
    topics = []
    for name, per_partition in pending:
        partitions = []
        for index, outcome in per_partition:
            code = await outcome if isinstance(outcome, asyncio.Future) else outcome
            partitions.append(cls.OffsetCommitResponseTopic.OffsetCommitResponsePartition(
                partition_index=index, error_code=code))
        topics.append(cls.OffsetCommitResponseTopic(name=name, partitions=partitions))
    return cls(throttle_time_ms=0, topics=topics)


# ---- OffsetFetch

def _fetch_group(ctx: RequestContext, group_id: str, topics: Sequence[Any] | None, member_id: str | None = None,
                 member_epoch: int = -1) -> tuple[ErrorCode, Committed]:
    """(group error, [(topic, [(partition, CommittedOffset | None)])]) for named topics, or every committed
    partition when topics is None."""
    groups = ctx.groups
    error = groups.check(group_id, allow_empty=True)
    if error is None:
        error = groups.validate_fetch(group_id, member_id, member_epoch) or None
    if not ctx.authorized(Operation.DESCRIBE, ResourceType.GROUP, group_id):
        error = ErrorCode.GROUP_AUTHORIZATION_FAILED
    if error is not None:
        requested: Committed = [(t.name, [(i, None) for i in t.partition_indexes]) for t in topics or []]
        return error, requested
    if topics is None:
        by_topic: dict[str, list] = {}
        for (topic, index), committed in groups.fetch_all_offsets(group_id).items():
            by_topic.setdefault(topic, []).append((index, committed))
        return ErrorCode.NONE, sorted(by_topic.items())
    # a topic the principal may not describe reads as having no committed offset, as in Kafka
    return ErrorCode.NONE, [(t.name, [(i, groups.fetch_offset(group_id, t.name, i)
                                       if ctx.authorized(Operation.DESCRIBE, ResourceType.TOPIC, t.name) else None)
                                      for i in t.partition_indexes]) for t in topics]


def _answer(ctx: RequestContext, group_id: str, topic: str, index: int, committed: CommittedOffset | None,
            error: ErrorCode, require_stable: bool) -> dict[str, Any]:
    """One partition's answer; with require_stable, an offset an open transaction holds is not answered yet."""
    if require_stable and ctx.transactions.has_pending_offset(group_id, topic, index):
        return dict(committed_offset=NO_OFFSET, committed_leader_epoch=-1, metadata="",
                    error_code=ErrorCode.UNSTABLE_OFFSET_COMMIT)
    return _partition_fields(committed, error)


def _partition_fields(committed: CommittedOffset | None, error: ErrorCode) -> dict[str, Any]:
    if committed is None:
        return dict(committed_offset=NO_OFFSET, committed_leader_epoch=-1, metadata="", error_code=error)
    return dict(committed_offset=committed.offset, committed_leader_epoch=committed.leader_epoch,
                metadata=committed.metadata, error_code=ErrorCode.NONE)


async def offset_fetch(ctx: RequestContext, request: OffsetFetchRequest) -> OffsetFetchResponse:
    v = ctx.version
    cls = OffsetFetchResponse[v]
    if v >= 8:
        out = []
        for group in request.groups:
            error, found = _fetch_group(ctx, group.group_id, group.topics,
                                        *((group.member_id, group.member_epoch) if v >= 9 else ()))
            Topics = cls.OffsetFetchResponseGroup.OffsetFetchResponseTopics
            topics = [] if error != ErrorCode.NONE else [
                Topics(name=name, partitions=[Topics.OffsetFetchResponsePartitions(
                    partition_index=index, **_answer(ctx, group.group_id, name, index, committed, ErrorCode.NONE,
                                                     request.require_stable))
                    for index, committed in partitions])
                for name, partitions in found]
            out.append(cls.OffsetFetchResponseGroup(group_id=group.group_id, topics=topics, error_code=error))
        return cls(throttle_time_ms=0, groups=out)
    topics_requested = request.topics
    error, found = _fetch_group(ctx, request.group_id, topics_requested)
    # v0-1 have no top-level error: each partition carries it.
    partition_error = error if v < 2 else ErrorCode.NONE
    Topic = cls.OffsetFetchResponseTopic
    topics = [] if error != ErrorCode.NONE and v >= 2 else [
        Topic(name=name, partitions=[Topic.OffsetFetchResponsePartition(
            partition_index=index, **_answer(ctx, request.group_id, name, index, committed, partition_error,
                                             v >= 7 and request.require_stable))
            for index, committed in partitions])
        for name, partitions in found]
    return cls(throttle_time_ms=0, topics=topics, error_code=error)


# ---- OffsetDelete

async def offset_delete(ctx: RequestContext, request: OffsetDeleteRequest) -> OffsetDeleteResponse:
    cls = OffsetDeleteResponse[ctx.version]
    wanted = [(t.name, p.partition_index) for t in request.topics for p in t.partitions]
    if not ctx.authorized(Operation.DELETE, ResourceType.GROUP, request.group_id):
        return cls(error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED, throttle_time_ms=0, topics=[])
    readable = {name for name, _ in wanted if ctx.authorized(Operation.READ, ResourceType.TOPIC, name)}
    error, results = await ctx.groups.delete_offsets(request.group_id, [tp for tp in wanted if tp[0] in readable])
    results.update({tp: ErrorCode.TOPIC_AUTHORIZATION_FAILED for tp in wanted if tp[0] not in readable})
    Topic = cls.OffsetDeleteResponseTopic
    topics = [] if error != ErrorCode.NONE else [
        Topic(name=t.name, partitions=[Topic.OffsetDeleteResponsePartition(
            partition_index=p.partition_index, error_code=results[(t.name, p.partition_index)])
            for p in t.partitions])
        for t in request.topics]
    return cls(error_code=error, throttle_time_ms=0, topics=topics)


ROUTES = [
    (OffsetCommitRequest.API_KEY, 0, 9, offset_commit),
    (OffsetFetchRequest.API_KEY, 0, 9, offset_fetch),
    (OffsetDeleteRequest.API_KEY, 0, 0, offset_delete),
]
