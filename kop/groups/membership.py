"""The classic group membership protocol: JoinGroup, SyncGroup, Heartbeat and LeaveGroup against the groups'
state machines, with member sessions and rebalance deadlines on timers.

Version-independent: the wire handlers translate each request version into these calls. Waiting requests
(JoinGroup until the rebalance completes, a follower's SyncGroup until the leader's) get futures that resolve to
JoinResult / SyncResult. Each generation is stored with its members and assignments (through store_generation,
before the members of a new generation get their assignments), and so is a group that became empty: a restarted
coordinator restores the groups (kop/groups/generations.py) and members go on in their generation, as after a Kafka
coordinator move.
"""
import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from kop.groups.generations import CoordinatorMoved
from kop.groups.group import Group, GroupState, JoinResult, Member, SyncResult
from kop.groups.timers import Timers
from protocol.errors import ErrorCode

log = logging.getLogger(__name__)

# A new member whose first JoinGroup never completes (its client went away) is dropped after this (Kafka's value).
NEW_MEMBER_JOIN_TIMEOUT_MS = 5 * 60 * 1000


@dataclass(frozen=True, slots=True)
class JoinRequest:
    group_id: str
    member_id: str
    group_instance_id: str | None
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    client_id: str = ""
    client_host: str = ""
    require_known_member_id: bool = True  # JoinGroup v4+: first join gets MEMBER_ID_REQUIRED
    supports_skip_assignment: bool = False  # JoinGroup v9+ (KIP-814)
    reason: str | None = None


def resolved(value) -> asyncio.Future:
    future = asyncio.get_running_loop().create_future()
    future.set_result(value)
    return future


async def _nothing_to_store(group: Group, assignments: dict[str, bytes]) -> None:
    pass


def _answer(future: asyncio.Future | None, value) -> None:
    if future is not None and not future.done():
        future.set_result(value)


class Membership:
    def __init__(self, groups: dict[str, Group], initial_rebalance_delay_ms: int,
                 min_session_timeout_ms: int, max_session_timeout_ms: int, max_group_size: int,
                 store_generation: Callable[[Group, dict[str, bytes]], Awaitable[None]] | None = None) -> None:
        self.groups = groups
        self.store_generation = store_generation or _nothing_to_store
        self.timers = Timers()
        self.initial_rebalance_delay_ms = initial_rebalance_delay_ms
        self.min_session_timeout_ms = min_session_timeout_ms
        self.max_session_timeout_ms = max_session_timeout_ms
        self.max_group_size = max_group_size
        self._storing: dict[str, asyncio.Task] = {}  # group id -> the store of its becoming empty, in flight

    # ---- JoinGroup

    def valid_session_timeout(self, session_timeout_ms: int) -> bool:
        return self.min_session_timeout_ms <= session_timeout_ms <= self.max_session_timeout_ms

    def join(self, req: JoinRequest) -> asyncio.Future:
        """Resolves to a JoinResult once this member's place in the next generation is known."""
        if not self.valid_session_timeout(req.session_timeout_ms):
            return resolved(JoinResult(ErrorCode.INVALID_SESSION_TIMEOUT, req.member_id))
        group = self.groups.get(req.group_id)
        if req.member_id == "":
            if group is None:
                if not (req.protocol_type and req.protocols):
                    return resolved(JoinResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, req.member_id))
                group = self.groups[req.group_id] = Group(req.group_id)
            return self._join_new_member(group, req)
        if group is None:
            return resolved(JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, req.member_id))
        return self._join_known_member(group, req)

    def _join_new_member(self, group: Group, req: JoinRequest) -> asyncio.Future:
        if group.is_(GroupState.DEAD):
            return resolved(JoinResult(ErrorCode.COORDINATOR_NOT_AVAILABLE, req.member_id))
        if not group.supports_protocols(req.protocol_type, [name for name, _ in req.protocols]):
            return resolved(JoinResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, req.member_id))
        old_static_id = group.static_members.get(req.group_instance_id) if req.group_instance_id else None
        if old_static_id is None and len(group.members) + len(group.pending_members) >= self.max_group_size:
            return resolved(JoinResult(ErrorCode.GROUP_MAX_SIZE_REACHED, req.member_id))
        new_id = f"{req.group_instance_id or req.client_id}-{uuid.uuid4()}"
        if old_static_id is not None:
            return self._rejoin_static_member(group, req, old_static_id, new_id)
        if req.group_instance_id is None and req.require_known_member_id:
            # KIP-394: the member id first, so a client that times out and retries does not leave ghosts behind.
            group.pending_members.add(new_id)
            self.timers.arm(("pending", group.group_id, new_id), req.session_timeout_ms,
                            self._expire_pending_member, group, new_id)
            return resolved(JoinResult(ErrorCode.MEMBER_ID_REQUIRED, new_id))
        return self._add_member_and_rebalance(group, req, new_id)

    def _join_known_member(self, group: Group, req: JoinRequest) -> asyncio.Future:
        member_id = req.member_id
        if group.is_(GroupState.DEAD):
            return resolved(JoinResult(ErrorCode.COORDINATOR_NOT_AVAILABLE, member_id))
        names = [name for name, _ in req.protocols]
        if member_id in group.pending_members:
            if not group.supports_protocols(req.protocol_type, names):
                return resolved(JoinResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, member_id))
            group.pending_members.discard(member_id)
            self.timers.cancel(("pending", group.group_id, member_id))
            return self._add_member_and_rebalance(group, req, member_id)
        if group.is_static_member_fenced(req.group_instance_id, member_id):
            return resolved(JoinResult(ErrorCode.FENCED_INSTANCE_ID, member_id))
        member = group.get(member_id)
        if member is None:
            return resolved(JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member_id))
        if not group.supports_protocols(req.protocol_type, names):
            return resolved(JoinResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, member_id))
        if group.is_(GroupState.PREPARING_REBALANCE):
            return self._update_member_and_rebalance(group, member, req, "member rejoined")
        if group.is_(GroupState.COMPLETING_REBALANCE):
            if member.matches(req.protocols):
                # It missed its JoinGroup response: give it the same answer again.
                return resolved(self._join_result(group, member))
            return self._update_member_and_rebalance(group, member, req, "member changed its metadata")
        if group.is_(GroupState.STABLE):
            if group.is_leader(member_id) or not member.matches(req.protocols):
                # The leader rejoins to have the assignment redone (e.g. topic metadata changed).
                return self._update_member_and_rebalance(group, member, req, "leader or changed member rejoined")
            return resolved(self._join_result(group, member, members=False))
        return resolved(JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member_id))  # Empty

    def _join_result(self, group: Group, member: Member, members: bool = True) -> JoinResult:
        is_leader = group.is_leader(member.member_id)
        return JoinResult(ErrorCode.NONE, member.member_id, group.generation_id, group.protocol_type,
                          group.protocol_name, group.leader_id or "",
                          group.leader_view() if members and is_leader else ())

    def _add_member_and_rebalance(self, group: Group, req: JoinRequest, member_id: str) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        member = Member(member_id, req.group_instance_id, req.client_id, req.client_host, req.session_timeout_ms,
                        req.rebalance_timeout_ms, req.protocol_type, list(req.protocols), join_waiter=future,
                        is_new=True)
        group.add(member)
        if group.is_(GroupState.PREPARING_REBALANCE) and group.generation_id == 0:
            group.new_member_added = True
        self._arm_session(group, member, NEW_MEMBER_JOIN_TIMEOUT_MS)
        log.info("group %s: member %s (client %s, %s) joins%s", group.group_id, member_id, req.client_id,
                 req.client_host, f" ({req.reason})" if req.reason else "")
        self._maybe_prepare_rebalance(group, f"new member {member_id} joined")
        self._try_complete_join(group)
        return future

    def _update_member_and_rebalance(self, group: Group, member: Member, req: JoinRequest,
                                     reason: str) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        # A JoinGroup superseded by this one gets an answer rather than hanging its connection.
        _answer(member.join_waiter, JoinResult(ErrorCode.REBALANCE_IN_PROGRESS, member.member_id))
        member.protocols = list(req.protocols)
        member.session_timeout_ms = req.session_timeout_ms
        member.rebalance_timeout_ms = req.rebalance_timeout_ms
        member.join_waiter = future
        client_reason = f" ({req.reason})" if req.reason else ""
        self._maybe_prepare_rebalance(group, f"{reason}: {member.member_id}{client_reason}")
        self._try_complete_join(group)
        return future

    def _rejoin_static_member(self, group: Group, req: JoinRequest, old_id: str, new_id: str) -> asyncio.Future:
        """KIP-345: a static member restarting takes over its old place; no rebalance if nothing changed."""
        old_leader = group.leader_id
        member = group.get(old_id)
        _answer(member.join_waiter, JoinResult(ErrorCode.FENCED_INSTANCE_ID, old_id))
        _answer(member.sync_waiter, SyncResult(ErrorCode.FENCED_INSTANCE_ID))
        member.join_waiter = member.sync_waiter = None
        self.timers.cancel(("session", group.group_id, old_id))
        group.replace_static_member(req.group_instance_id, old_id, new_id)
        member.client_id, member.client_host = req.client_id, req.client_host
        member.session_timeout_ms = req.session_timeout_ms
        member.rebalance_timeout_ms = req.rebalance_timeout_ms
        member.protocols = list(req.protocols)
        self._arm_session(group, member)
        log.info("group %s: static member %s rejoins as %s", group.group_id, req.group_instance_id, new_id)
        future = asyncio.get_running_loop().create_future()
        if group.is_(GroupState.STABLE):
            # As Kafka: only a change of the group's protocol forces a rebalance. A consumer's subscription bytes
            # change on every restart (owned partitions, generation), which must not undo static membership.
            if group.select_protocol() == group.protocol_name:
                if req.supports_skip_assignment and group.is_leader(new_id):
                    # KIP-814: the leader learns it leads (to watch metadata) but must not reassign.
                    future.set_result(JoinResult(ErrorCode.NONE, new_id, group.generation_id, group.protocol_type,
                                                 group.protocol_name, new_id, group.leader_view(),
                                                 skip_assignment=True))
                else:
                    # The old leader id, so a rejoining leader does not compute an assignment nobody will get.
                    future.set_result(JoinResult(ErrorCode.NONE, new_id, group.generation_id, group.protocol_type,
                                                 group.protocol_name, old_leader or ""))
                return future
            member.join_waiter = future
            self._prepare_rebalance(group, f"static member {req.group_instance_id} changed protocols")
            return future
        member.join_waiter = future
        if group.is_(GroupState.COMPLETING_REBALANCE):
            self._prepare_rebalance(group, f"static member {req.group_instance_id} rejoined during a rebalance")
        self._try_complete_join(group)
        return future

    # ---- completing a rebalance

    def rebalance(self, group: Group, reason: str) -> None:
        """Start a rebalance of a Stable group (one that just became a classic group again)."""
        self._maybe_prepare_rebalance(group, reason)

    def _maybe_prepare_rebalance(self, group: Group, reason: str) -> None:
        if group.can_rebalance:
            self._prepare_rebalance(group, reason)

    def _prepare_rebalance(self, group: Group, reason: str) -> None:
        if group.is_(GroupState.COMPLETING_REBALANCE):
            # Members waiting for the leader's assignment must rejoin instead.
            for member in group.members.values():
                member.assignment = b""
                _answer(member.sync_waiter, SyncResult(ErrorCode.REBALANCE_IN_PROGRESS))
                member.sync_waiter = None
        self.timers.cancel(("sync", group.group_id))
        group.pending_sync.clear()
        from_empty = group.is_(GroupState.EMPTY)
        group.transition(GroupState.PREPARING_REBALANCE)
        log.info("group %s: preparing to rebalance (generation %d): %s", group.group_id, group.generation_id,
                 reason)
        timeout = group.rebalance_timeout_ms()
        if from_empty:
            # Let a burst of members starting together land in one generation (group.initial.rebalance.delay.ms).
            delay = min(self.initial_rebalance_delay_ms, timeout)
            group.initial_join_pending = True
            group.new_member_added = False
            self.timers.arm(("join", group.group_id), delay, self._initial_join_elapsed, group,
                            max(timeout - delay, 0))
        else:
            group.initial_join_pending = False
            self.timers.arm(("join", group.group_id), timeout, self._complete_join, group)
            self._try_complete_join(group)

    def _initial_join_elapsed(self, group: Group, remaining_ms: int) -> None:
        if group.new_member_added and remaining_ms > 0:
            group.new_member_added = False
            delay = min(self.initial_rebalance_delay_ms, remaining_ms)
            self.timers.arm(("join", group.group_id), delay, self._initial_join_elapsed, group, remaining_ms - delay)
            return
        group.initial_join_pending = False
        self._complete_join(group)

    def _try_complete_join(self, group: Group) -> None:
        if group.is_(GroupState.PREPARING_REBALANCE) and not group.initial_join_pending \
                and group.all_members_joined():
            self._complete_join(group)

    def _complete_join(self, group: Group) -> None:
        self.timers.cancel(("join", group.group_id))
        if not group.is_(GroupState.PREPARING_REBALANCE):
            return
        group.initial_join_pending = False
        for member in list(group.members.values()):
            if not member.awaiting_join and member.group_instance_id is None:
                log.info("group %s: member %s did not rejoin in time", group.group_id, member.member_id)
                self._drop_member(group, member)
        if group.members and not group.elect_joined_leader():
            # Only static members that have not rejoined are left: wait for them or for their sessions to end.
            self.timers.arm(("join", group.group_id), group.rebalance_timeout_ms(), self._complete_join, group)
            return
        group.init_next_generation()
        if group.is_(GroupState.EMPTY):
            log.info("group %s: empty at generation %d", group.group_id, group.generation_id)
            self._store_empty(group)
            return
        log.info("group %s: generation %d with %d members, protocol %s, leader %s", group.group_id,
                 group.generation_id, len(group.members), group.protocol_name, group.leader_id)
        for member in group.members.values():
            if member.awaiting_join:
                future, member.join_waiter = member.join_waiter, None
                _answer(future, self._join_result(group, member))
            member.is_new = False
            self._arm_session(group, member)
        self.timers.arm(("sync", group.group_id), group.rebalance_timeout_ms(), self._expire_pending_sync, group,
                        group.generation_id)

    def _expire_pending_sync(self, group: Group, generation: int) -> None:
        if group.generation_id != generation or not group.pending_sync \
                or group.state not in (GroupState.COMPLETING_REBALANCE, GroupState.STABLE):
            return
        for member_id in list(group.pending_sync):
            member = group.get(member_id)
            if member is not None:
                log.info("group %s: member %s sent no SyncGroup in time", group.group_id, member_id)
                self._drop_member(group, member)
        self._prepare_rebalance(group, "members did not sync")

    # ---- SyncGroup

    def sync(self, group_id: str, generation_id: int, member_id: str, instance_id: str | None,
             protocol_type: str | None, protocol_name: str | None,
             assignments: dict[str, bytes]) -> asyncio.Future:
        """Resolves to a SyncResult: the member's assignment once the leader has sent it."""
        group = self.groups.get(group_id)
        error = self._check_member(group, member_id, instance_id, generation_id)
        if error is None and ((protocol_type is not None and protocol_type != group.protocol_type)
                              or (protocol_name is not None and protocol_name != group.protocol_name)):
            error = ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        if error is None and group.is_(GroupState.EMPTY):
            error = ErrorCode.UNKNOWN_MEMBER_ID
        if error is None and group.is_(GroupState.PREPARING_REBALANCE):
            error = ErrorCode.REBALANCE_IN_PROGRESS
        if error is not None:
            return resolved(SyncResult(error))
        member = group.get(member_id)
        group.pending_sync.discard(member_id)
        if not group.pending_sync:
            self.timers.cancel(("sync", group_id))
        self._arm_session(group, member)
        if group.is_(GroupState.STABLE):
            return resolved(self._sync_result(group, member))
        future = asyncio.get_running_loop().create_future()
        _answer(member.sync_waiter, SyncResult(ErrorCode.REBALANCE_IN_PROGRESS))
        member.sync_waiter = future
        if group.is_leader(member_id) and group.storing_generation != group.generation_id:
            # One store per generation (a retried leader SyncGroup does not start another), but every generation
            # gets its own: a store of an older generation still in flight must not hold this one back.
            group.storing_generation = group.generation_id
            asyncio.get_running_loop().create_task(
                self._complete_sync(group, group.generation_id, dict(assignments)))
        return future

    async def _complete_sync(self, group: Group, generation: int, assignments: dict[str, bytes]) -> None:
        """Store the generation durably, then hand out the leader's assignment, unless the group moved on meanwhile
        (its waiters were answered by the rebalance that moved it)."""
        error = None
        try:
            await self.store_generation(group, assignments)
        except CoordinatorMoved as exc:  # a coordinator that lost the group's shard: its members look it up again
            log.warning("group %s: generation %d not stored: %s", group.group_id, generation, exc)
            error = ErrorCode.NOT_COORDINATOR
        except Exception:
            log.exception("group %s: could not store generation %d", group.group_id, generation)
            error = ErrorCode.COORDINATOR_NOT_AVAILABLE
        finally:
            if group.storing_generation == generation:
                group.storing_generation = None
        if group.generation_id != generation or not group.is_(GroupState.COMPLETING_REBALANCE):
            return
        if error is not None:
            for member in group.members.values():
                self._answer_sync(group, member, SyncResult(error))
            self._prepare_rebalance(group, "its generation could not be stored")
            return
        for member in group.members.values():
            member.assignment = assignments.get(member.member_id, b"")
        group.transition(GroupState.STABLE)
        log.info("group %s: stable at generation %d", group.group_id, group.generation_id)
        for member in group.members.values():
            self._answer_sync(group, member, self._sync_result(group, member))

    def _answer_sync(self, group: Group, member: Member, result: SyncResult) -> None:
        """Answer a member's waiting SyncGroup, and give it a whole session from now, as Kafka does: its session
        kept running while the store took its time, and it heartbeats again only once it has its answer (a store
        of seconds would otherwise leave it a fraction of a session, and expire it right after it became Stable)."""
        waiter, member.sync_waiter = member.sync_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(result)
            self._arm_session(group, member)

    @staticmethod
    def _sync_result(group: Group, member: Member) -> SyncResult:
        return SyncResult(ErrorCode.NONE, member.assignment, group.protocol_type, group.protocol_name)

    def _check_member(self, group: Group | None, member_id: str, instance_id: str | None,
                      generation_id: int) -> ErrorCode | None:
        """The checks SyncGroup and Heartbeat share, in Kafka's order."""
        if group is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if group.is_(GroupState.DEAD):
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if group.is_static_member_fenced(instance_id, member_id):
            return ErrorCode.FENCED_INSTANCE_ID
        if not group.has(member_id):
            return ErrorCode.UNKNOWN_MEMBER_ID
        if generation_id != group.generation_id:
            return ErrorCode.ILLEGAL_GENERATION
        return None

    # ---- Heartbeat

    def heartbeat(self, group_id: str, generation_id: int, member_id: str, instance_id: str | None) -> ErrorCode:
        group = self.groups.get(group_id)
        error = self._check_member(group, member_id, instance_id, generation_id)
        if error is not None:
            return error
        self._arm_session(group, group.get(member_id))
        if group.is_(GroupState.PREPARING_REBALANCE):
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE  # Stable, or CompletingRebalance between JoinGroup and SyncGroup

    def touch(self, group: Group, member_id: str) -> None:
        """A valid offset commit from a member counts as a heartbeat."""
        member = group.get(member_id)
        if member is not None:
            self._arm_session(group, member)

    # ---- LeaveGroup

    def leave(self, group_id: str, leaving: list[tuple[str, str | None]]) -> tuple[ErrorCode, list[ErrorCode]]:
        """Remove members (member id, group instance id); returns the group error and one error per member."""
        group = self.groups.get(group_id)
        if group is None:
            return ErrorCode.NONE, [ErrorCode.UNKNOWN_MEMBER_ID] * len(leaving)
        if group.is_(GroupState.DEAD):
            return ErrorCode.COORDINATOR_NOT_AVAILABLE, []
        results = []
        for member_id, instance_id in leaving:
            results.append(self._leave_one(group, member_id, instance_id))
        return ErrorCode.NONE, results

    def _leave_one(self, group: Group, member_id: str, instance_id: str | None) -> ErrorCode:
        if member_id and group.is_static_member_fenced(instance_id, member_id):
            return ErrorCode.FENCED_INSTANCE_ID
        if member_id in group.pending_members:
            group.pending_members.discard(member_id)
            self.timers.cancel(("pending", group.group_id, member_id))
            self._try_complete_join(group)
            return ErrorCode.NONE
        target = group.static_members.get(instance_id) if instance_id is not None else member_id
        member = group.get(target) if target else None
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        log.info("group %s: member %s leaves", group.group_id, member.member_id)
        self._remove_member_and_update_group(group, member, f"member {member.member_id} left")
        return ErrorCode.NONE

    # ---- sessions and removal

    def _arm_session(self, group: Group, member: Member, timeout_ms: int | None = None) -> None:
        self.timers.arm(("session", group.group_id, member.member_id), timeout_ms or member.session_timeout_ms,
                        self._session_expired, group, member)

    def _session_expired(self, group: Group, member: Member) -> None:
        if group.get(member.member_id) is not member or group.is_(GroupState.DEAD):
            return
        if not member.is_new and (member.awaiting_join or member.awaiting_sync):
            # Waiting in a rebalance is not silence; the rebalance and sync deadlines police it.
            self._arm_session(group, member)
            return
        log.info("group %s: member %s session expired", group.group_id, member.member_id)
        self._remove_member_and_update_group(group, member, f"member {member.member_id} session expired")

    def _expire_pending_member(self, group: Group, member_id: str) -> None:
        if member_id in group.pending_members:
            group.pending_members.discard(member_id)
            self._try_complete_join(group)

    def _drop_member(self, group: Group, member: Member) -> None:
        _answer(member.join_waiter, JoinResult(ErrorCode.UNKNOWN_MEMBER_ID, member.member_id))
        _answer(member.sync_waiter, SyncResult(ErrorCode.UNKNOWN_MEMBER_ID))
        member.join_waiter = member.sync_waiter = None
        self.timers.cancel(("session", group.group_id, member.member_id))
        group.remove(member.member_id)

    def _remove_member_and_update_group(self, group: Group, member: Member, reason: str) -> None:
        self._drop_member(group, member)
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._prepare_rebalance(group, reason)
        elif group.is_(GroupState.PREPARING_REBALANCE):
            self._try_complete_join(group)

    # ---- lifecycle

    def restored(self, group: Group) -> None:
        """A group loaded Stable with its members: each has a session from now, as after a heartbeat."""
        for member in group.members.values():
            self._arm_session(group, member)

    def _store_empty(self, group: Group) -> None:
        """Note durably that the group has no members left, so a restart does not bring the last ones back (they
        would only expire, but a member joining meanwhile would wait for them)."""
        async def store() -> None:
            if not group.is_(GroupState.EMPTY):
                return  # members joined meanwhile: their generation is stored once it is stable
            try:
                await self.store_generation(group, {})
            except Exception:
                log.exception("group %s: could not store empty generation %d", group.group_id, group.generation_id)
        task = asyncio.get_running_loop().create_task(store())
        self._storing[group.group_id] = task
        task.add_done_callback(lambda done: self._storing.pop(group.group_id, None) if
                               self._storing.get(group.group_id) is done else None)

    async def emptied_stored(self, group_id: str) -> None:
        """Wait until the group's becoming empty, if it just did, is stored (LeaveGroup answers after it, so a
        crash right after the last member left does not bring it back)."""
        task = self._storing.get(group_id)
        if task is not None:
            await asyncio.shield(task)

    async def settle(self) -> None:
        if self._storing:
            await asyncio.gather(*self._storing.values(), return_exceptions=True)

    def hand_over(self, group: Group) -> None:
        """The group became a consumer group (an online upgrade): its JoinGroup and SyncGroup requests still waiting
        are told to rejoin (the consumer group serves them then), its timers stop, and what its old self still had
        in flight (a generation being stored) finds it Dead and does nothing."""
        group.transition(GroupState.DEAD)
        for member in group.members.values():
            _answer(member.join_waiter, JoinResult(ErrorCode.REBALANCE_IN_PROGRESS, member.member_id))
            _answer(member.sync_waiter, SyncResult(ErrorCode.REBALANCE_IN_PROGRESS))
            member.join_waiter = member.sync_waiter = None
        gid = group.group_id
        self.timers.cancel_where(lambda key: key[1] == gid)

    def forget(self, group: Group) -> None:
        """The group is deleted: drop its timers and answer anything still waiting."""
        for member in list(group.members.values()):
            self._drop_member(group, member)
        gid = group.group_id
        self.timers.cancel_where(lambda key: key[1] == gid)

    def close(self) -> None:
        self.timers.cancel_all()
        for group in self.groups.values():
            for member in group.members.values():
                _answer(member.join_waiter, JoinResult(ErrorCode.COORDINATOR_NOT_AVAILABLE, member.member_id))
                _answer(member.sync_waiter, SyncResult(ErrorCode.COORDINATOR_NOT_AVAILABLE))
