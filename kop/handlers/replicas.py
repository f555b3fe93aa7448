"""Replica placement on a one-broker cluster: ElectLeaders (43), DescribeLogDirs (35), AlterReplicaLogDirs (34),
AlterPartitionReassignments (45) and ListPartitionReassignments (46), answered as a single Kafka broker answers them.

Every partition has one replica, on this broker, in one log directory (the ledger directory), and is always led by
it: an election is never needed, a reassignment can only name this broker (a no-op), none is ever in progress, and
the only log directory a replica can move to is the one it is in. Admin tools that run these against any cluster
then work against kop too."""
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from kafka.protocol.admin import (AlterPartitionReassignmentsRequest, AlterPartitionReassignmentsResponse,
                                  AlterReplicaLogDirsRequest, AlterReplicaLogDirsResponse, DescribeLogDirsRequest,
                                  DescribeLogDirsResponse, ElectLeadersRequest, ElectLeadersResponse,
                                  ListPartitionReassignmentsRequest, ListPartitionReassignmentsResponse)

from kop.handlers.context import RequestContext
from kop.handlers.guards import requires_cluster
from kop.security.acls import Operation
from kop.partition import PartitionLog
from protocol.errors import ErrorCode

PREFERRED, UNCLEAN = 0, 1
T = TypeVar("T")


def _requested(ctx: RequestContext, topics: Sequence[Any] | None, name_of: Callable[[Any], str],
               partitions_of: Callable[[Any], Iterable[int]]) -> list[tuple[str, int, PartitionLog | None]]:
    """(topic, partition index, PartitionLog or None) for the request's partitions; every partition if None."""
    if topics is None:
        return [(name, p.partition, p) for name, topic in sorted(ctx.topics.topics.items())
                for p in topic.partitions]
    return [(name_of(t), index, ctx.topics.partition(name_of(t), index))
            for t in topics for index in partitions_of(t)]


def _by_topic(items: Iterable[tuple[str, T]]) -> dict[str, list[T]]:
    out: dict[str, list[T]] = {}
    for topic, item in items:
        out.setdefault(topic, []).append(item)
    return out


async def elect_leaders(ctx: RequestContext, request: ElectLeadersRequest) -> ElectLeadersResponse:
    cls = ElectLeadersResponse[ctx.version]
    Result = cls.ReplicaElectionResult
    election_type = getattr(request, "election_type", PREFERRED)
    results = []
    for topic, index, partition in _requested(ctx, request.topic_partitions, lambda t: t.topic,
                                              lambda t: t.partitions):
        if partition is None:
            error, message = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown partition {topic}-{index}"
        elif election_type not in (PREFERRED, UNCLEAN):
            error, message = ErrorCode.INVALID_REQUEST, f"unknown election type {election_type}"
        else:
            error, message = ErrorCode.ELECTION_NOT_NEEDED, "the only replica leads already"
        results.append((topic, Result.PartitionResult(partition_id=index, error_code=error, error_message=message)))
    return cls(throttle_time_ms=0, error_code=ErrorCode.NONE, replica_election_results=[
        Result(topic=topic, partition_result=parts) for topic, parts in _by_topic(results).items()])


def _log_dir(ctx: RequestContext) -> str:
    return ctx.topics.storage.log_dir


async def describe_log_dirs(ctx: RequestContext, request: DescribeLogDirsRequest) -> DescribeLogDirsResponse:
    cls = DescribeLogDirsResponse[ctx.version]
    Result = cls.DescribeLogDirsResult
    Topic = Result.DescribeLogDirsTopic
    parts = []
    for topic, index, partition in _requested(ctx, request.topics, lambda t: t.topic, lambda t: t.partitions):
        if partition is not None:
            size = sum(ledger.size for ledger in partition.ledger.internal_stats().ledgers)
            parts.append((topic, Topic.DescribeLogDirsPartition(partition_index=index, partition_size=size,
                                                                offset_lag=0, is_future_key=False)))
    total, usable = ctx.topics.storage.space()
    result = Result(error_code=ErrorCode.NONE, log_dir=_log_dir(ctx),
                    topics=[Topic(name=name, partitions=p) for name, p in _by_topic(parts).items()],
                    total_bytes=total, usable_bytes=usable)
    return cls(throttle_time_ms=0, error_code=ErrorCode.NONE, results=[result])


async def alter_replica_log_dirs(ctx: RequestContext,
                                 request: AlterReplicaLogDirsRequest) -> AlterReplicaLogDirsResponse:
    cls = AlterReplicaLogDirsResponse[ctx.version]
    Result = cls.AlterReplicaLogDirTopicResult
    here = _log_dir(ctx)
    results = []
    for wanted in request.dirs:
        for topic in wanted.topics:
            for index in topic.partitions:
                if ctx.topics.partition(topic.name, index) is None:
                    error = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                elif here not in (wanted.path, os.path.abspath(wanted.path)):
                    error = ErrorCode.LOG_DIR_NOT_FOUND
                else:
                    error = ErrorCode.NONE  # already there
                results.append((topic.name, Result.AlterReplicaLogDirPartitionResult(partition_index=index,
                                                                                     error_code=error)))
    return cls(throttle_time_ms=0, results=[Result(topic_name=name, partitions=p)
                                            for name, p in _by_topic(results).items()])


async def alter_partition_reassignments(ctx: RequestContext, request: AlterPartitionReassignmentsRequest
                                        ) -> AlterPartitionReassignmentsResponse:
    cls = AlterPartitionReassignmentsResponse[ctx.version]
    Response = cls.ReassignableTopicResponse
    node = ctx.endpoint.node_id
    results = []
    for topic in request.topics:
        for p in topic.partitions:
            if ctx.topics.partition(topic.name, p.partition_index) is None:
                error, message = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown partition {topic.name}-" \
                                                                       f"{p.partition_index}"
            elif p.replicas is None:
                error, message = ErrorCode.NO_REASSIGNMENT_IN_PROGRESS, "no reassignment to cancel"
            elif list(p.replicas) != [node]:
                error, message = ErrorCode.INVALID_REPLICA_ASSIGNMENT, \
                    f"replicas {list(p.replicas)}: this cluster has one broker, id {node}"
            else:
                error, message = ErrorCode.NONE, None  # where it is already
            results.append((topic.name, Response.ReassignablePartitionResponse(
                partition_index=p.partition_index, error_code=error, error_message=message)))
    return cls(throttle_time_ms=0, error_code=ErrorCode.NONE, error_message=None,
               responses=[Response(name=name, partitions=p) for name, p in _by_topic(results).items()])


async def list_partition_reassignments(ctx: RequestContext, request: ListPartitionReassignmentsRequest
                                       ) -> ListPartitionReassignmentsResponse:
    cls = ListPartitionReassignmentsResponse[ctx.version]
    return cls(throttle_time_ms=0, error_code=ErrorCode.NONE, error_message=None, topics=[])


ROUTES = [
    (AlterReplicaLogDirsRequest.API_KEY, 0, 2, requires_cluster(Operation.ALTER, alter_replica_log_dirs)),
    (DescribeLogDirsRequest.API_KEY, 0, 4, requires_cluster(Operation.DESCRIBE, describe_log_dirs)),
    (ElectLeadersRequest.API_KEY, 0, 2, requires_cluster(Operation.ALTER, elect_leaders)),
    (AlterPartitionReassignmentsRequest.API_KEY, 0, 0, requires_cluster(Operation.ALTER,
                                                                         alter_partition_reassignments)),
    (ListPartitionReassignmentsRequest.API_KEY, 0, 0, requires_cluster(Operation.DESCRIBE,
                                                                        list_partition_reassignments)),
]
