"""The classic group membership and group admin APIs. Version notes:

- JoinGroup (11) v0-9: v1+ rebalance timeout (v0 uses the session timeout); v4+ an empty member id gets
  MEMBER_ID_REQUIRED with the id to rejoin with (KIP-394); v5+ group.instance.id (KIP-345); v6+ flexible;
  v7+ protocol type in the response; v8+ a reason; v9+ skip_assignment for a rejoining static leader (KIP-814).
- SyncGroup (14) v0-5: v3+ group.instance.id; v5+ protocol type/name, checked against the group's.
- Heartbeat (12) v0-4: v3+ group.instance.id.
- LeaveGroup (13) v0-5: v0-2 one member id, the error at the top; v3+ a batch of member identities with one error
  each (KIP-345); v5+ reasons.
- ListGroups (16) v0-5: v4+ states filter (KIP-518); v5+ types filter: "classic", or "consumer" for groups of
  KIP-848's protocol (kop.handlers.consumer_groups).
- DescribeGroups (15) v0-6: v3+ authorized operations; v6+ GROUP_ID_NOT_FOUND for an unknown group where older
  versions describe it as Dead.
- DeleteGroups (42) v0-2.
Version ranges: aiokafka 0.14 sends JoinGroup v5, SyncGroup v3, Heartbeat/LeaveGroup v1; librdkafka 2.x JoinGroup v5,
SyncGroup/Heartbeat v3, LeaveGroup v1, DescribeGroups v4, ListGroups v5; kafka-python 3 JoinGroup v7; the Java
client 3.9 the maxima listed. A group of KIP-848's protocol with members serves them to classic members as Kafka 4
does (kop.groups.consumer.classic).
"""
import asyncio
from collections.abc import Awaitable

from kafka.protocol.admin import (DeleteGroupsRequest, DeleteGroupsResponse, DescribeGroupsRequest,
                                  DescribeGroupsResponse, ListGroupsRequest, ListGroupsResponse)
from kafka.protocol.consumer import (HeartbeatRequest, HeartbeatResponse, JoinGroupRequest, JoinGroupResponse,
                                     LeaveGroupRequest, LeaveGroupResponse, SyncGroupRequest, SyncGroupResponse)

from kop.groups import JoinRequest, JoinResult, SyncResult
from kop.handlers.context import RequestContext
from kop.security.acls import Operation, ResourceType
from protocol.errors import ErrorCode

NOT_REQUESTED = None  # authorized operations not asked for: the bit field encodes it as Integer.MIN_VALUE


def client_host(ctx: RequestContext) -> str:
    return "/" + ctx.client_host  # as Kafka prints an InetAddress


def may_read_group(ctx: RequestContext, group_id: str) -> bool:
    return ctx.authorized(Operation.READ, ResourceType.GROUP, group_id)


# ---- JoinGroup

async def join_group(ctx: RequestContext,
                     request: JoinGroupRequest) -> JoinGroupResponse | Awaitable[JoinGroupResponse]:
    v = ctx.version
    cls = JoinGroupResponse[v]
    if not may_read_group(ctx, request.group_id):
        return cls(error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED)
    req = JoinRequest(
        group_id=request.group_id, member_id=request.member_id or "",
        group_instance_id=request.group_instance_id if v >= 5 else None,
        session_timeout_ms=request.session_timeout_ms,
        rebalance_timeout_ms=request.rebalance_timeout_ms if v >= 1 else request.session_timeout_ms,
        protocol_type=request.protocol_type or "",
        protocols=[(p.name, bytes(p.metadata or b"")) for p in request.protocols],
        client_id=ctx.client_id, client_host=client_host(ctx), require_known_member_id=v >= 4,
        supports_skip_assignment=v >= 9, reason=request.reason if v >= 8 else None)
    future = ctx.groups.join(req)
    if future.done():
        return _join_response(cls, v, future.result())
    return _await_join(cls, v, future)


async def _await_join(cls: type[JoinGroupResponse], v: int,
                      future: asyncio.Future[JoinResult]) -> JoinGroupResponse:
    return _join_response(cls, v, await future)


def _join_response(cls: type[JoinGroupResponse], v: int, result: JoinResult) -> JoinGroupResponse:
    members = [cls.JoinGroupResponseMember(member_id=m.member_id, group_instance_id=m.group_instance_id,
                                           metadata=m.metadata) for m in result.members]
    protocol_name = result.protocol_name
    if protocol_name is None and v < 7:
        protocol_name = ""
    return cls(throttle_time_ms=0, error_code=result.error, generation_id=result.generation_id,
               protocol_type=result.protocol_type, protocol_name=protocol_name, leader=result.leader_id,
               skip_assignment=result.skip_assignment, member_id=result.member_id, members=members)


# ---- SyncGroup

async def sync_group(ctx: RequestContext,
                     request: SyncGroupRequest) -> SyncGroupResponse | Awaitable[SyncGroupResponse]:
    v = ctx.version
    cls = SyncGroupResponse[v]
    if not may_read_group(ctx, request.group_id):
        return cls(error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED)
    assignments = {a.member_id: bytes(a.assignment or b"") for a in request.assignments}
    future = ctx.groups.sync(request.group_id, request.generation_id, request.member_id,
                             request.group_instance_id if v >= 3 else None,
                             request.protocol_type if v >= 5 else None,
                             request.protocol_name if v >= 5 else None, assignments)
    if future.done():
        return _sync_response(cls, future.result())
    return _await_sync(cls, future)


async def _await_sync(cls: type[SyncGroupResponse], future: asyncio.Future[SyncResult]) -> SyncGroupResponse:
    return _sync_response(cls, await future)


def _sync_response(cls: type[SyncGroupResponse], result: SyncResult) -> SyncGroupResponse:
    return cls(throttle_time_ms=0, error_code=result.error, protocol_type=result.protocol_type,
               protocol_name=result.protocol_name, assignment=result.assignment)


# ---- Heartbeat

async def heartbeat(ctx: RequestContext, request: HeartbeatRequest) -> HeartbeatResponse:
    cls = HeartbeatResponse[ctx.version]
    if not may_read_group(ctx, request.group_id):
        return cls(error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED)
    error = ctx.groups.heartbeat(request.group_id, request.generation_id, request.member_id,
                                 request.group_instance_id if ctx.version >= 3 else None)
    return cls(throttle_time_ms=0, error_code=error)


# ---- LeaveGroup

async def leave_group(ctx: RequestContext, request: LeaveGroupRequest) -> LeaveGroupResponse:
    v = ctx.version
    cls = LeaveGroupResponse[v]
    if not may_read_group(ctx, request.group_id):
        return cls(error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED)
    if v >= 3:
        leaving = [(m.member_id or "", m.group_instance_id) for m in request.members]
    else:
        leaving = [(request.member_id or "", None)]
    error, results = ctx.groups.leave(request.group_id, leaving)
    await ctx.groups.stored(request.group_id)
    if v < 3:
        if error == ErrorCode.NONE and results:
            error = results[0]
        return cls(throttle_time_ms=0, error_code=error)
    members = [cls.MemberResponse(member_id=member_id, group_instance_id=instance_id, error_code=member_error)
               for (member_id, instance_id), member_error in zip(leaving, results)]
    return cls(throttle_time_ms=0, error_code=error, members=members)


# ---- ListGroups, DescribeGroups, DeleteGroups

async def list_groups(ctx: RequestContext, request: ListGroupsRequest) -> ListGroupsResponse:
    v = ctx.version
    cls = ListGroupsResponse[v]
    coordinator = ctx.groups
    if not coordinator.loaded:
        return cls(throttle_time_ms=0, error_code=ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, groups=[])
    listed = coordinator.list_groups(request.states_filter if v >= 4 else None,
                                     request.types_filter if v >= 5 else None)
    every = ctx.authorized_on_cluster(Operation.DESCRIBE)
    groups = [cls.ListedGroup(group_id=g.group_id, protocol_type=g.protocol_type, group_state=g.state,
                              group_type=g.group_type) for g in listed
              if every or ctx.authorized(Operation.DESCRIBE, ResourceType.GROUP, g.group_id)]
    return cls(throttle_time_ms=0, error_code=ErrorCode.NONE, groups=groups)


async def describe_groups(ctx: RequestContext, request: DescribeGroupsRequest) -> DescribeGroupsResponse:
    v = ctx.version
    cls = DescribeGroupsResponse[v]
    asked = v >= 3 and request.include_authorized_operations
    described = []
    for group_id in request.groups:
        if not ctx.authorized(Operation.DESCRIBE, ResourceType.GROUP, group_id):
            described.append(cls.DescribedGroup(error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED, group_id=group_id,
                                                authorized_operations=NOT_REQUESTED))
            continue
        operations = ctx.authorized_operations(ResourceType.GROUP, group_id) if asked else NOT_REQUESTED
        d = ctx.groups.describe(group_id)
        error, message = d.error, None
        if error == ErrorCode.GROUP_ID_NOT_FOUND:
            if v >= 6:
                message = f"group {group_id} not found"
            else:
                error = ErrorCode.NONE  # older versions describe an unknown group as Dead
        members = [cls.DescribedGroup.DescribedGroupMember(
            member_id=m.member_id, group_instance_id=m.group_instance_id, client_id=m.client_id,
            client_host=m.client_host, member_metadata=m.metadata, member_assignment=m.assignment)
            for m in d.members]
        described.append(cls.DescribedGroup(
            error_code=error, error_message=message, group_id=group_id, group_state=d.state,
            protocol_type=d.protocol_type, protocol_data=d.protocol_data, members=members,
            authorized_operations=operations))
    return cls(throttle_time_ms=0, groups=described)


async def delete_groups(ctx: RequestContext, request: DeleteGroupsRequest) -> DeleteGroupsResponse:
    cls = DeleteGroupsResponse[ctx.version]
    names = list(request.groups_names)
    allowed = [g for g in names if ctx.authorized(Operation.DELETE, ResourceType.GROUP, g)]
    deleted = iter(await ctx.groups.delete_groups(allowed))  # in the order asked, a name asked twice twice
    results = [next(deleted) if g in allowed else (g, ErrorCode.GROUP_AUTHORIZATION_FAILED) for g in names]
    return cls(throttle_time_ms=0,
               results=[cls.DeletableGroupResult(group_id=g, error_code=e) for g, e in results])


ROUTES = [
    (JoinGroupRequest.API_KEY, 0, 9, join_group),
    (SyncGroupRequest.API_KEY, 0, 5, sync_group),
    (HeartbeatRequest.API_KEY, 0, 4, heartbeat),
    (LeaveGroupRequest.API_KEY, 0, 5, leave_group),
    (ListGroupsRequest.API_KEY, 0, 5, list_groups),
    (DescribeGroupsRequest.API_KEY, 0, 6, describe_groups),
    (DeleteGroupsRequest.API_KEY, 0, 2, delete_groups),
]
