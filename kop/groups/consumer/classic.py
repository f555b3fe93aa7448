"""Classic consumers in a consumer group (Kafka's online migration): their JoinGroup, SyncGroup, Heartbeat and
LeaveGroup served by a consumer-protocol group, as Kafka 4 serves them.

The group assigns on the server, so a classic member is never a leader: its JoinGroup is answered at once, with its
member epoch as the generation and no member list, and its SyncGroup with the partitions the group gave it, in the
classic consumer protocol's encoding. It reconciles only when it joins, with what its subscription says it still
owns (kop.groups.consumer.member). Its heartbeat answers REBALANCE_IN_PROGRESS, so that it rejoins, when the group
has moved to a newer epoch, when it must revoke partitions, or when partitions it waited for are free.

Deadlines: its own session timeout between heartbeats; once told to rejoin, its rebalance timeout to do so; after
JoinGroup, its rebalance timeout to send SyncGroup. A member that misses one is fenced out of the group.
"""
import logging
import uuid

from kop.groups.consumer.embedded import EmbeddedProtocolError, encode_assignment, parse_subscription, version_of
from kop.groups.consumer.group import CONSUMER_PROTOCOL_TYPE, ConsumerGroup
from kop.groups.consumer.heartbeat import ConsumerGroups
from kop.groups.consumer.member import ClassicProtocols, ConsumerMember, MemberState
from kop.groups.group import JoinResult, SyncResult
from kop.groups.membership import JoinRequest
from protocol.errors import ErrorCode

log = logging.getLogger(__name__)


class ClassicMemberError(Exception):
    def __init__(self, error: ErrorCode, message: str, member_id: str | None = None) -> None:
        super().__init__(message)
        self.error = error
        self.member_id = member_id  # the id to answer with, where it is not the request's


def _lookup(group: ConsumerGroup, member_id: str, instance_id: str | None) -> ConsumerMember:
    """The classic member a SyncGroup, Heartbeat or LeaveGroup names (Kafka's checks, in its order)."""
    if instance_id is None:
        member = group.members.get(member_id)
        if member is None:
            raise ClassicMemberError(ErrorCode.UNKNOWN_MEMBER_ID, f"member {member_id} is not in the group")
    else:
        held_by = group.static_members.get(instance_id)
        if held_by is None:
            raise ClassicMemberError(ErrorCode.UNKNOWN_MEMBER_ID, f"instance {instance_id} is not in the group")
        member = group.members[held_by]
        if member_id and member_id != held_by:
            raise ClassicMemberError(ErrorCode.FENCED_INSTANCE_ID,
                                     f"instance {instance_id} is held by member {held_by}")
    if member.classic is None:
        raise ClassicMemberError(ErrorCode.UNKNOWN_MEMBER_ID,
                                 f"member {member.member_id} does not use the classic protocol")
    return member


def _must_rejoin(group: ConsumerGroup, member: ConsumerMember) -> bool:
    """The group moved past the member's epoch, it must revoke partitions, or partitions it waited for are free."""
    return member.epoch < group.epoch or member.state is MemberState.UNREVOKED_PARTITIONS or (
        member.state is MemberState.UNRELEASED_PARTITIONS and not group.waiting_on_unreleased(member))


class ClassicMembers:
    def __init__(self, groups: ConsumerGroups) -> None:
        self.groups = groups

    # ---- JoinGroup

    def join(self, group: ConsumerGroup, req: JoinRequest) -> JoinResult:
        try:
            member = self._joining(group, req)
        except ClassicMemberError as exc:
            if exc.error != ErrorCode.MEMBER_ID_REQUIRED:
                log.info("consumer group %s: classic JoinGroup refused (%s)", group.group_id, exc)
            return JoinResult(exc.error, exc.member_id or req.member_id)
        key = (group.group_id, member.member_id)
        self.groups.timers.cancel(("join",) + key)
        self.arm_session(group, member)
        self.groups.timers.arm(("sync",) + key, member.rebalance_timeout_ms, self.groups.expire, "sync", *key)
        self.groups.on_change(group)
        return JoinResult(ErrorCode.NONE, member.member_id, member.epoch, CONSUMER_PROTOCOL_TYPE,
                          member.classic.protocol_name, "", ())

    def _joining(self, group: ConsumerGroup, req: JoinRequest) -> ConsumerMember:
        """The member after its join."""
        unknown = req.member_id == ""
        member_id = req.member_id or str(uuid.uuid4())
        held_by = group.static_members.get(req.group_instance_id) if req.group_instance_id is not None else None
        if len(group.members) >= self.groups.max_size and member_id not in group.members and held_by is None:
            raise ClassicMemberError(ErrorCode.GROUP_MAX_SIZE_REACHED, f"group {group.group_id} is full")
        names = frozenset(name for name, _ in req.protocols)
        if not group.supports_classic_protocols(req.protocol_type, names):
            raise ClassicMemberError(ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
                                     f"member {member_id}'s protocols are not supported")
        if unknown and req.group_instance_id is None and req.require_known_member_id:
            raise ClassicMemberError(ErrorCode.MEMBER_ID_REQUIRED, "a new member is told its id first", member_id)
        try:
            subscription = parse_subscription(req.protocols[0][1])
        except EmbeddedProtocolError as exc:
            raise ClassicMemberError(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, str(exc)) from None
        member = self._member(group, req, member_id, unknown, held_by)
        before = member.subscribed_topics
        if subscription.rack_id is not None:
            member.rack_id = subscription.rack_id
        if req.rebalance_timeout_ms > 0:
            member.rebalance_timeout_ms = req.rebalance_timeout_ms
        member.subscribed_names = subscription.topics
        member.client_id, member.client_host = req.client_id, req.client_host
        member.classic = ClassicProtocols(req.session_timeout_ms, tuple(req.protocols))
        member.owned = subscription.owned
        self.groups.rebalance_if(group, member.subscribed_topics != before)
        group.reconcile(member)
        log.info("consumer group %s: classic member %s joined at epoch %d (group epoch %d, %s)", group.group_id,
                 member.member_id, member.epoch, group.epoch, member.state.value)
        return member

    def _member(self, group: ConsumerGroup, req: JoinRequest, member_id: str, unknown: bool,
                held_by: str | None) -> ConsumerMember:
        instance_id = req.group_instance_id
        if instance_id is None:
            member = group.members.get(member_id)
            if member is None:  # new, or a member the group fenced coming back: it starts from epoch 0
                member = group.members[member_id] = ConsumerMember(member_id, None, req.client_id, req.client_host)
            return member
        if not unknown:
            if held_by is None:
                raise ClassicMemberError(ErrorCode.UNKNOWN_MEMBER_ID, f"instance {instance_id} is not in the group")
            if held_by != member_id:
                raise ClassicMemberError(ErrorCode.FENCED_INSTANCE_ID,
                                         f"instance {instance_id} is held by member {held_by}")
            return group.members[held_by]
        if held_by is None:
            member = group.members[member_id] = ConsumerMember(member_id, instance_id, req.client_id,
                                                               req.client_host)
            group.static_members[instance_id] = member_id
            return member
        # A restarted static member takes its instance's place at once (Kafka: whatever protocol the other used).
        log.info("consumer group %s: static member %s rejoins as %s", group.group_id, instance_id, member_id)
        return self.groups.replace_static(group, group.members[held_by], member_id, req.client_id, req.client_host)

    # ---- SyncGroup, Heartbeat, LeaveGroup

    def sync(self, group: ConsumerGroup, generation_id: int, member_id: str, instance_id: str | None,
             protocol_type: str | None, protocol_name: str | None) -> SyncResult:
        try:
            member = _lookup(group, member_id, instance_id)
            self._check_generation(member, generation_id)
            if protocol_type is not None and protocol_type != CONSUMER_PROTOCOL_TYPE:
                raise ClassicMemberError(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, f"protocol type {protocol_type}")
            if protocol_name is not None and protocol_name != member.classic.protocol_name:
                raise ClassicMemberError(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, f"protocol {protocol_name}")
            if group.epoch > member.epoch and member.state is not MemberState.UNREVOKED_PARTITIONS:
                self._must_rejoin(group, member)
                raise ClassicMemberError(ErrorCode.REBALANCE_IN_PROGRESS, "the group moved to a newer epoch")
        except ClassicMemberError as exc:
            return SyncResult(exc.error)
        self.groups.timers.cancel(("sync", group.group_id, member.member_id))
        self.arm_session(group, member)
        try:
            version = version_of(member.classic.protocols[0][1])
        except EmbeddedProtocolError:
            version = 0
        return SyncResult(ErrorCode.NONE, encode_assignment(member.assigned, version), protocol_type, protocol_name)

    def heartbeat(self, group: ConsumerGroup, generation_id: int, member_id: str,
                  instance_id: str | None) -> ErrorCode:
        try:
            member = _lookup(group, member_id, instance_id)
            self._check_generation(member, generation_id)
        except ClassicMemberError as exc:
            return exc.error
        self.arm_session(group, member)
        if _must_rejoin(group, member):
            self._must_rejoin(group, member)
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE

    def leave(self, group: ConsumerGroup, leaving: list[tuple[str, str | None]]) -> list[ErrorCode]:
        results = []
        for member_id, instance_id in leaving:
            try:
                member = _lookup(group, member_id, instance_id)
            except ClassicMemberError as exc:
                results.append(exc.error)
                continue
            self.groups.fence(group, member.member_id, "it left")
            results.append(ErrorCode.NONE)
        return results

    # ---- deadlines

    @staticmethod
    def _check_generation(member: ConsumerMember, generation_id: int) -> None:
        if generation_id != member.epoch:
            raise ClassicMemberError(ErrorCode.ILLEGAL_GENERATION,
                                     f"generation {generation_id} is not the member's epoch {member.epoch}")

    def arm_session(self, group: ConsumerGroup, member: ConsumerMember) -> None:
        key = ("session", group.group_id, member.member_id)
        self.groups.timers.arm(key, member.classic.session_timeout_ms, self.groups.expire, *key)

    def _must_rejoin(self, group: ConsumerGroup, member: ConsumerMember) -> None:
        """It was told to rejoin: it has its rebalance timeout to do so (counted from the first time it was told)."""
        key = ("join", group.group_id, member.member_id)
        if not self.groups.timers.armed(key):
            self.groups.timers.arm(key, member.rebalance_timeout_ms, self.groups.expire, *key)
