"""ConsumerGroupHeartbeat's logic: joining, leaving, epochs and fencing, static members, session and revocation
deadlines. One instance serves every consumer-protocol group of the broker; the group coordinator decides which group
ids are consumer-protocol groups (a group id is one kind or the other).

Errors as Kafka answers them:
- a heartbeat with an epoch newer than the member's, or older and not its previous epoch with partitions it still
  owns (a lost response), is FENCED_MEMBER_EPOCH: the client gives up its partitions and rejoins with epoch 0;
- an unknown member id with any epoch but 0 is UNKNOWN_MEMBER_ID;
- a static member joining with an instance id another live member holds is UNRELEASED_INSTANCE_ID; a heartbeat
  whose instance id names another member is FENCED_INSTANCE_ID.

Every change to a group is reported to on_change (the coordinator stores the group before the member hears of it,
so a restarted broker restores the members where they were), and a member fenced out (left, timed out) goes through
on_fenced first, which may turn the group back into a classic group (the online downgrade of
kop.groups.consumer.migration).
"""
import logging
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from kop.groups.consumer.assignors import ASSIGNORS
from kop.groups.consumer.group import ConsumerGroup
from kop.groups.consumer.member import (JOIN_EPOCH, LEAVE_EPOCH, STATIC_LEAVE_EPOCH, ConsumerMember, MemberState,
                                        Partitions)
from kop.groups.timers import Timers
from protocol.errors import ErrorCode

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Heartbeat:
    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str | None
    rack_id: str | None
    rebalance_timeout_ms: int
    subscribed_names: tuple[str, ...] | None  # None: unchanged
    subscribed_regex: str | None  # None: unchanged
    server_assignor: str | None
    owned: Partitions | None  # None: unchanged
    client_id: str
    client_host: str


@dataclass(frozen=True, slots=True)
class HeartbeatResult:
    error: ErrorCode
    message: str | None = None
    member_id: str | None = None
    member_epoch: int = 0
    assignment: Partitions | None = None  # None: not sent (unchanged)


class HeartbeatError(Exception):
    def __init__(self, error: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error = error


def _validate(hb: Heartbeat, assignors: tuple[str, ...]) -> None:
    """INVALID_REQUEST for what no client sends (Kafka checks the same)."""
    def invalid(message: str) -> HeartbeatError:
        return HeartbeatError(ErrorCode.INVALID_REQUEST, message)
    if hb.member_epoch < STATIC_LEAVE_EPOCH:
        raise invalid(f"member epoch {hb.member_epoch} is not valid")
    if hb.member_epoch != JOIN_EPOCH and not hb.member_id:
        raise invalid("MemberId can't be empty.")
    if hb.member_epoch == STATIC_LEAVE_EPOCH and hb.instance_id is None:
        raise invalid("InstanceId can't be null when leaving with epoch -2.")
    if hb.member_epoch == JOIN_EPOCH:
        if hb.rebalance_timeout_ms <= 0:
            raise invalid("RebalanceTimeoutMs must be provided in first request.")
        if hb.owned is None or hb.owned:
            raise invalid("TopicPartitions must be empty when (re-)joining.")
        if hb.subscribed_names is None and hb.subscribed_regex is None:
            raise invalid("SubscribedTopicNames or SubscribedTopicRegex must be set in first request.")
    if hb.server_assignor is not None and hb.server_assignor not in assignors:
        raise HeartbeatError(ErrorCode.UNSUPPORTED_ASSIGNOR,
                             f"ServerAssignor {hb.server_assignor} is not supported. Supported assignors: "
                             f"{', '.join(assignors)}.")
    if hb.subscribed_regex:
        try:
            re.compile(hb.subscribed_regex)
        except re.error as exc:
            raise HeartbeatError(ErrorCode.INVALID_REGULAR_EXPRESSION,
                                 f"SubscribedTopicRegex {hb.subscribed_regex!r} is not valid: {exc}") from None


def _fingerprint(group: ConsumerGroup, member: ConsumerMember) -> tuple:
    """What a heartbeat may change that is stored: the group's epochs and members, and this member."""
    return (group.epoch, group.assignment_epoch, group.assignor, tuple(group.members), member.epoch,
            member.previous_epoch, member.state, member.assigned, member.revoking, member.owned,
            member.subscribed_names, member.subscribed_regex, member.server_assignor, member.rack_id,
            member.rebalance_timeout_ms, member.instance_id)


def _nothing(*args) -> None:
    return None


class ConsumerGroups:
    """partition_counts(topics) -> {topic: partitions} for those of `topics` that exist; topic_names() -> every topic
    a regex may match; assignors: the server-side assignors members may ask for, the first the default;
    on_change(group): the group changed; on_fenced(group, member id, why) -> True if it took the group over instead of
    the member being removed."""

    def __init__(self, session_timeout_ms: int, heartbeat_interval_ms: int, max_size: int,
                 partition_counts: Callable[[frozenset[str]], dict[str, int]],
                 topic_names: Callable[[], list[str]], assignors: tuple[str, ...] = tuple(ASSIGNORS),
                 on_change: Callable[[ConsumerGroup], None] = _nothing,
                 on_fenced: Callable[[ConsumerGroup, str, str], bool] = _nothing) -> None:
        self.session_timeout_ms = session_timeout_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.max_size = max_size
        self.assignors = assignors
        self._partition_counts = partition_counts
        self._topic_names = topic_names
        self.on_change = on_change
        self.on_fenced = on_fenced
        self.groups: dict[str, ConsumerGroup] = {}
        self.timers = Timers()

    @property
    def default_assignor(self) -> str:
        return self.assignors[0]

    def close(self) -> None:
        self.timers.cancel_all()

    # ---- the heartbeat

    def heartbeat(self, hb: Heartbeat, describable: Callable[[str], bool]) -> HeartbeatResult:
        """describable(topic): may this member's principal see the topic (a regex matches only those)."""
        try:
            _validate(hb, self.assignors)
            if hb.member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
                return self._leave(hb)
            group = self.groups.get(hb.group_id)
            if group is None:
                if hb.member_epoch != JOIN_EPOCH:
                    raise HeartbeatError(ErrorCode.UNKNOWN_MEMBER_ID, f"member {hb.member_id} is not in the group")
                group = self.groups[hb.group_id] = ConsumerGroup(hb.group_id)
            before = (group.epoch, group.assignment_epoch, group.assignor, tuple(group.members))
            member, changed = self._member(group, hb) if hb.member_epoch == JOIN_EPOCH \
                else (self._known_member(group, hb), False)
        except HeartbeatError as exc:
            return HeartbeatResult(exc.error, str(exc), hb.member_id or None, hb.member_epoch)
        before += _fingerprint(group, member)[4:]
        changed |= self._update(member, hb, describable)
        self.rebalance_if(group, changed)
        group.reconcile(member)
        self._arm_timers(group, member)
        if _fingerprint(group, member) != before:
            self.on_change(group)
        sent = (member.epoch, member.assigned)
        full = hb.member_epoch == JOIN_EPOCH or hb.member_epoch != member.epoch
        assignment = member.assigned if full or member.last_sent != sent else None
        member.last_sent = sent
        return HeartbeatResult(ErrorCode.NONE, None, member.member_id, member.epoch, assignment)

    def refusal(self, hb: Heartbeat) -> HeartbeatResult | None:
        """The answer to a heartbeat no group could accept (checked before anything changes), or None."""
        try:
            _validate(hb, self.assignors)
        except HeartbeatError as exc:
            return HeartbeatResult(exc.error, str(exc), hb.member_id or None, hb.member_epoch)
        return None

    def rebalance_if(self, group: ConsumerGroup, changed: bool) -> None:
        """Move the group to its next epoch if what its assignment depends on changed: a member's subscription
        (changed), or the partitions of the topics it subscribes to."""
        counts = self._partition_counts(group.subscribed_topics())
        if changed or counts != group.partition_counts:
            group.bump(counts, self.default_assignor)
            log.info("consumer group %s moves to epoch %d (%d members, assignor %s)", group.group_id, group.epoch,
                     len(group.members), group.assignor)

    def _member(self, group: ConsumerGroup, hb: Heartbeat) -> tuple[ConsumerMember, bool]:
        """The member joining (epoch 0): new, a static member coming back, or a member rejoining after a fence.
        Returns it and whether the group's assignment must be recomputed."""
        if hb.instance_id is not None:
            held_by = group.static_members.get(hb.instance_id)
            if held_by is not None and held_by != hb.member_id:
                previous = group.members[held_by]
                if previous.epoch != STATIC_LEAVE_EPOCH and previous.classic is None:
                    raise HeartbeatError(ErrorCode.UNRELEASED_INSTANCE_ID,
                                         f"instance {hb.instance_id} is held by member {held_by}")
                return self._replace_static(group, previous, hb), False
        member = group.members.get(hb.member_id) if hb.member_id else None
        if member is not None:
            member.release_all()
            return member, False
        if len(group.members) >= self.max_size:
            raise HeartbeatError(ErrorCode.GROUP_MAX_SIZE_REACHED, f"group {group.group_id} is full")
        member = ConsumerMember(hb.member_id or str(uuid.uuid4()), hb.instance_id, hb.client_id, hb.client_host)
        group.members[member.member_id] = member
        if hb.instance_id is not None:
            group.static_members[hb.instance_id] = member.member_id
        return member, True

    def _replace_static(self, group: ConsumerGroup, previous: ConsumerMember, hb: Heartbeat) -> ConsumerMember:
        """A static member back after leaving with epoch -2 (or replacing a classic member with its instance id)
        takes over its partitions and target under its new member id, without a rebalance."""
        member = self.replace_static(group, previous, hb.member_id or str(uuid.uuid4()), hb.client_id,
                                     hb.client_host)
        log.info("consumer group %s: static member %s is back as %s", group.group_id, hb.instance_id,
                 member.member_id)
        return member

    def replace_static(self, group: ConsumerGroup, previous: ConsumerMember, member_id: str, client_id: str,
                       client_host: str) -> ConsumerMember:
        """The member that now holds previous's instance id: its subscription, partitions and target, epoch 0."""
        target = group.target.get(previous.member_id, frozenset())
        group.remove(previous.member_id)
        self.timers.cancel_where(lambda key: key[1:] == (group.group_id, previous.member_id))
        member = ConsumerMember(member_id, previous.instance_id, client_id, client_host,
                                rack_id=previous.rack_id, rebalance_timeout_ms=previous.rebalance_timeout_ms,
                                subscribed_names=previous.subscribed_names,
                                subscribed_regex=previous.subscribed_regex,
                                server_assignor=previous.server_assignor, assigned=previous.assigned,
                                owned=previous.assigned, regex_topics=previous.regex_topics,
                                previous_epoch=JOIN_EPOCH, epoch=JOIN_EPOCH, classic=previous.classic)
        group.members[member.member_id] = member
        group.static_members[member.instance_id] = member.member_id
        group.target[member.member_id] = target
        return member

    def _known_member(self, group: ConsumerGroup, hb: Heartbeat) -> ConsumerMember:
        member = group.members.get(hb.member_id)
        if member is None:
            raise HeartbeatError(ErrorCode.UNKNOWN_MEMBER_ID, f"member {hb.member_id} is not in the group")
        if hb.instance_id is not None and (member.instance_id != hb.instance_id
                                          or group.static_members.get(hb.instance_id) != member.member_id):
            raise HeartbeatError(ErrorCode.FENCED_INSTANCE_ID,
                                 f"instance {hb.instance_id} is not held by member {hb.member_id}")
        if hb.member_epoch > member.epoch:
            raise HeartbeatError(ErrorCode.FENCED_MEMBER_EPOCH,
                                 f"epoch {hb.member_epoch} is newer than the member's {member.epoch}")
        if hb.member_epoch < member.epoch and (hb.member_epoch != member.previous_epoch or (
                hb.owned is not None and not hb.owned <= member.assigned)):
            raise HeartbeatError(ErrorCode.FENCED_MEMBER_EPOCH,
                                 f"epoch {hb.member_epoch} is older than the member's {member.epoch}")
        return member

    def _update(self, member: ConsumerMember, hb: Heartbeat, describable: Callable[[str], bool]) -> bool:
        """Take what the heartbeat changed; True if the assignment depends on it."""
        before = (member.subscribed_topics, member.server_assignor)
        member.classic = None  # a member that heartbeats speaks the consumer protocol (a static one may replace a
        # classic member of its instance id)
        if hb.subscribed_names is not None:
            member.subscribed_names = frozenset(hb.subscribed_names)
        if hb.subscribed_regex is not None:
            member.subscribed_regex = hb.subscribed_regex or None
        if member.subscribed_regex is not None:
            pattern = re.compile(member.subscribed_regex)
            member.regex_topics = frozenset(t for t in self._topic_names()
                                            if pattern.fullmatch(t) and describable(t))
        else:
            member.regex_topics = frozenset()
        if hb.server_assignor is not None or hb.member_epoch == JOIN_EPOCH:
            member.server_assignor = hb.server_assignor
        if hb.rebalance_timeout_ms > 0:
            member.rebalance_timeout_ms = hb.rebalance_timeout_ms
        if hb.rack_id is not None:
            member.rack_id = hb.rack_id
        if hb.owned is not None:
            member.owned = hb.owned
        return (member.subscribed_topics, member.server_assignor) != before

    # ---- leaving and deadlines

    def _leave(self, hb: Heartbeat) -> HeartbeatResult:
        group = self.groups.get(hb.group_id)
        member = group.members.get(hb.member_id) if group is not None else None
        if member is None:
            raise HeartbeatError(ErrorCode.UNKNOWN_MEMBER_ID, f"member {hb.member_id} is not in the group")
        if hb.member_epoch == STATIC_LEAVE_EPOCH and member.instance_id is not None:
            # Its partitions wait for it (nobody else gets them) until its session times out.
            member.epoch = STATIC_LEAVE_EPOCH
            member.revoking = frozenset()
            self.timers.cancel(("revoke", group.group_id, member.member_id))
            log.info("consumer group %s: static member %s left for now", group.group_id, member.instance_id)
            self.on_change(group)
        else:
            self.fence(group, member.member_id, "it left")
        return HeartbeatResult(ErrorCode.NONE, None, hb.member_id, hb.member_epoch)

    def _arm_timers(self, group: ConsumerGroup, member: ConsumerMember) -> None:
        key = (group.group_id, member.member_id)
        self.timers.arm(("session",) + key, self.session_timeout_ms, self.expire, "session", *key)
        if member.state is MemberState.UNREVOKED_PARTITIONS:
            if not self.timers.armed(("revoke",) + key):
                self.timers.arm(("revoke",) + key, member.rebalance_timeout_ms, self.expire, "revoke", *key)
        else:
            self.timers.cancel(("revoke",) + key)

    def arm_restored(self, group: ConsumerGroup) -> None:
        """A group loaded from storage: each member has a session from now, as after a heartbeat."""
        for member in group.members.values():
            if member.classic is not None:
                key = ("session", group.group_id, member.member_id)
                self.timers.arm(key, member.classic.session_timeout_ms, self.expire, *key)
            else:
                self._arm_timers(group, member)

    EXPIRED = {"session": "its session timed out",
               "revoke": "it did not revoke partitions within its rebalance timeout",
               "join": "it did not rejoin within its rebalance timeout",
               "sync": "it did not send SyncGroup within its rebalance timeout"}

    def expire(self, why: str, group_id: str, member_id: str) -> None:
        group = self.groups.get(group_id)
        if group is not None and member_id in group.members:
            self.fence(group, member_id, self.EXPIRED[why])

    def fence(self, group: ConsumerGroup, member_id: str, why: str) -> None:
        """The member is out of the group (Kafka's fencing): unless on_fenced turns the group into a classic one,
        it is removed and the group moves to its next epoch without it."""
        self.timers.cancel_where(lambda key: key[1:] == (group.group_id, member_id))
        if self.on_fenced(group, member_id, why):
            return
        group.remove(member_id)
        self.rebalance_if(group, True)
        log.info("consumer group %s: member %s removed (%s); epoch %d", group.group_id, member_id, why, group.epoch)
        self.on_change(group)

    def forget(self, group_id: str) -> None:
        group = self.groups.pop(group_id, None)
        if group is not None:
            group.dead = True
            self.timers.cancel_where(lambda key: key[1] == group_id)
