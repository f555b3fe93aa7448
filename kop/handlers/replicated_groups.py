"""PIP-33 between the brokers of a cluster (kop's own requests, v0, CLUSTER_ACTION as Kafka's brokers need among
themselves; kop/cluster/replicated_groups.py sends them):

- ReplicatedGroupOffsets (32002): the committed offsets, on the sender's partitions, of the replicated groups this
  broker coordinates (every group's on a topic whose policy replicates them all), for the sender's snapshots;
- MoveReplicatedGroup (32003): as the group's coordinator, where the group is on a partition, and the move a PIP-33
  UPDATE stored at the sender asks for, made only if the group is still where the sender saw it."""
from kop.handlers.context import RequestContext
from kop.replication.group_positions import move_here
from kop.security.acls import Operation
from protocol.errors import ErrorCode
from protocol.replicated_groups import (MOVE_REPLICATED_GROUP_KEY, REPLICATED_GROUP_OFFSETS_KEY,
                                        MoveReplicatedGroupRequest, MoveReplicatedGroupResponse,
                                        ReplicatedGroupOffsetsRequest, ReplicatedGroupOffsetsResponse)


async def replicated_group_offsets(ctx: RequestContext,
                                   request: ReplicatedGroupOffsetsRequest) -> ReplicatedGroupOffsetsResponse:
    cls = ReplicatedGroupOffsetsResponse[ctx.version]
    if not ctx.authorized_on_cluster(Operation.CLUSTER_ACTION):
        return cls(throttle_time_ms=0, error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED, topics=[])
    if not ctx.groups.loaded:
        return cls(throttle_time_ms=0, error_code=ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, topics=[])
    Topic = cls.ReplicatedGroupOffsetsTopicResult
    Partition = Topic.ReplicatedGroupOffsetsPartitionResult
    topics = [Topic(name=t.name, partitions=[
        Partition(partition_index=index, groups=[
            Partition.ReplicatedGroupOffset(group_id=group, committed_offset=offset)
            for group, offset in sorted(ctx.groups.replicated_on(t.name, index, t.every_group).items())])
        for index in t.partitions]) for t in request.topics]
    return cls(throttle_time_ms=0, error_code=ErrorCode.NONE, topics=topics)


async def move_replicated_group(ctx: RequestContext,
                                request: MoveReplicatedGroupRequest) -> MoveReplicatedGroupResponse:
    cls = MoveReplicatedGroupResponse[ctx.version]
    if not ctx.authorized_on_cluster(Operation.CLUSTER_ACTION):
        return cls(throttle_time_ms=0, error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED, committed_offset=-1,
                   moved=False)
    offset = request.offset if request.offset >= 0 else None
    expected = request.expected_offset if request.expected_offset >= 0 else None
    found = await move_here(ctx.groups, request.group_id, request.topic, request.partition_index, offset, expected)
    return cls(throttle_time_ms=0, error_code=found.error, committed_offset=-1 if found.offset is None else found.offset,
               moved=found.moved)


ROUTES = [
    (REPLICATED_GROUP_OFFSETS_KEY, 0, 0, replicated_group_offsets),
    (MOVE_REPLICATED_GROUP_KEY, 0, 0, move_replicated_group),
]
