"""One consumer group's membership and its state machine (Kafka's classic group protocol).

States and the only moves between them:

    Empty --join--> PreparingRebalance --all joined / rebalance timeout--> CompletingRebalance --leader's
    SyncGroup--> Stable; Stable and CompletingRebalance go back to PreparingRebalance when membership or
    metadata changes; PreparingRebalance ends in Empty when every member is gone; any state --delete--> Dead.

This module holds the data and enforces the transitions; the coordinator drives it (timers, answers to waiting
JoinGroup and SyncGroup requests). Nothing here does I/O.
"""
import asyncio
import struct
from collections import Counter
from dataclasses import dataclass, field
from enum import Enum

from protocol.errors import ErrorCode

CONSUMER_PROTOCOL_TYPE = "consumer"


class GroupState(str, Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


# state -> the states it may be entered from
ALLOWED_FROM: dict[GroupState, frozenset[GroupState]] = {
    GroupState.EMPTY: frozenset({GroupState.PREPARING_REBALANCE}),
    GroupState.PREPARING_REBALANCE: frozenset({GroupState.EMPTY, GroupState.STABLE,
                                               GroupState.COMPLETING_REBALANCE}),
    GroupState.COMPLETING_REBALANCE: frozenset({GroupState.PREPARING_REBALANCE}),
    GroupState.STABLE: frozenset({GroupState.COMPLETING_REBALANCE}),
    GroupState.DEAD: frozenset(GroupState),
}


class IllegalGroupTransition(Exception):
    pass


@dataclass(frozen=True, slots=True)
class JoinedMember:
    """One member as the leader sees it in its JoinGroup response."""
    member_id: str
    group_instance_id: str | None
    metadata: bytes


@dataclass(frozen=True, slots=True)
class JoinResult:
    error: ErrorCode
    member_id: str
    generation_id: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str = ""
    members: tuple[JoinedMember, ...] = ()
    skip_assignment: bool = False


@dataclass(frozen=True, slots=True)
class SyncResult:
    error: ErrorCode
    assignment: bytes = b""
    protocol_type: str | None = None
    protocol_name: str | None = None


@dataclass(eq=False)
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""
    join_waiter: asyncio.Future | None = None
    sync_waiter: asyncio.Future | None = None
    is_new: bool = False  # joined but no JoinGroup response yet: may be expired while waiting

    @property
    def awaiting_join(self) -> bool:
        return self.join_waiter is not None

    @property
    def awaiting_sync(self) -> bool:
        return self.sync_waiter is not None

    def protocol_names(self) -> list[str]:
        return [name for name, _ in self.protocols]

    def metadata_for(self, protocol: str) -> bytes:
        for name, metadata in self.protocols:
            if name == protocol:
                return metadata
        raise KeyError(protocol)

    def matches(self, protocols: list[tuple[str, bytes]]) -> bool:
        return self.protocols == protocols


@dataclass(eq=False)
class Group:
    group_id: str
    state: GroupState = GroupState.EMPTY
    generation_id: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str | None = None
    members: dict[str, Member] = field(default_factory=dict)  # in join order
    static_members: dict[str, str] = field(default_factory=dict)  # group.instance.id -> member id
    pending_members: set[str] = field(default_factory=set)  # told MEMBER_ID_REQUIRED, not joined yet
    pending_sync: set[str] = field(default_factory=set)  # must send SyncGroup for this generation
    new_member_added: bool = False  # extends the initial rebalance delay
    initial_join_pending: bool = False  # PreparingRebalance from Empty: wait out the initial delay
    subscribed_topics: frozenset[str] | None = None  # None: unknown (treated as every topic)
    storing_generation: int | None = None  # the generation the leader's SyncGroup is making durable
    rebalances: int = 0  # generations begun since the group was loaded (a metric)

    # ---- state

    def is_(self, state: GroupState) -> bool:
        return self.state is state

    def transition(self, target: GroupState) -> None:
        if self.state not in ALLOWED_FROM[target]:
            raise IllegalGroupTransition(f"group {self.group_id}: {self.state.value} -> {target.value}")
        self.state = target

    @property
    def can_rebalance(self) -> bool:
        return self.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE, GroupState.EMPTY)

    # ---- membership

    def has(self, member_id: str) -> bool:
        return member_id in self.members

    def get(self, member_id: str) -> Member | None:
        return self.members.get(member_id)

    def is_leader(self, member_id: str) -> bool:
        return self.leader_id == member_id

    def add(self, member: Member) -> None:
        if not self.members:
            self.protocol_type = member.protocol_type
        self.members[member.member_id] = member
        if member.group_instance_id is not None:
            self.static_members[member.group_instance_id] = member.member_id
        if self.leader_id is None:
            self.leader_id = member.member_id

    def remove(self, member_id: str) -> Member:
        member = self.members.pop(member_id)
        if member.group_instance_id is not None and self.static_members.get(member.group_instance_id) == member_id:
            del self.static_members[member.group_instance_id]
        self.pending_sync.discard(member_id)
        if self.leader_id == member_id:
            self.leader_id = next(iter(self.members), None)
        return member

    def replace_static_member(self, instance_id: str, old_id: str, new_id: str) -> Member:
        """A static member rejoined with a new member id: same member, same assignment, new id."""
        member = self.members.pop(old_id)
        member.member_id = new_id
        self.members[new_id] = member
        self.static_members[instance_id] = new_id
        if self.leader_id == old_id:
            self.leader_id = new_id
        if old_id in self.pending_sync:
            self.pending_sync.discard(old_id)
            self.pending_sync.add(new_id)
        return member

    def is_static_member_fenced(self, instance_id: str | None, member_id: str) -> bool:
        """A request naming an instance id that now belongs to another member id comes from a zombie."""
        if instance_id is None:
            return False
        current = self.static_members.get(instance_id)
        return current is not None and current != member_id

    def all_members_joined(self) -> bool:
        return not self.pending_members and all(m.awaiting_join for m in self.members.values())

    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def elect_joined_leader(self) -> bool:
        """Keep the leader if it rejoined, else pick a member that did; False if none rejoined."""
        leader = self.members.get(self.leader_id) if self.leader_id is not None else None
        if leader is not None and leader.awaiting_join:
            return True
        joined = next((m for m in self.members.values() if m.awaiting_join), None)
        if joined is None:
            return False
        self.leader_id = joined.member_id
        return True

    # ---- protocols

    def candidate_protocols(self) -> list[str]:
        """Protocols every member supports, in the first member's order of preference."""
        members = list(self.members.values())
        if not members:
            return []
        common = set(members[0].protocol_names())
        for member in members[1:]:
            common &= set(member.protocol_names())
        return [name for name in members[0].protocol_names() if name in common]

    def supports_protocols(self, protocol_type: str, names: list[str]) -> bool:
        if not self.members:
            return bool(protocol_type) and bool(names)
        if protocol_type != self.protocol_type:
            return False
        candidates = set(self.candidate_protocols())
        return any(name in candidates for name in names)

    def select_protocol(self) -> str:
        """Each member votes for its most preferred common protocol; the most votes win."""
        candidates = self.candidate_protocols()
        if not candidates:
            raise ValueError(f"group {self.group_id}: members share no protocol")
        votes = Counter(next(n for n in m.protocol_names() if n in candidates) for m in self.members.values())
        return max(candidates, key=lambda name: (votes[name], -candidates.index(name)))

    def init_next_generation(self) -> None:
        self.generation_id += 1
        self.rebalances += 1
        if self.members:
            self.protocol_name = self.select_protocol()
            self.subscribed_topics = self.compute_subscribed_topics()
            self.transition(GroupState.COMPLETING_REBALANCE)
            self.pending_sync = set(self.members)
        else:
            self.protocol_name = None
            self.subscribed_topics = None
            self.transition(GroupState.EMPTY)
            self.pending_sync = set()

    def leader_view(self) -> tuple[JoinedMember, ...]:
        return tuple(JoinedMember(m.member_id, m.group_instance_id, m.metadata_for(self.protocol_name))
                     for m in self.members.values())

    def compute_subscribed_topics(self) -> frozenset[str] | None:
        if self.protocol_type != CONSUMER_PROTOCOL_TYPE:
            return None
        topics: set[str] = set()
        for member in self.members.values():
            parsed = subscription_topics(member.metadata_for(self.protocol_name))
            if parsed is None:
                return None
            topics |= parsed
        return frozenset(topics)

    def is_subscribed_to(self, topic: str) -> bool:
        return self.subscribed_topics is None or topic in self.subscribed_topics


def subscription_topics(metadata: bytes) -> set[str] | None:
    """Topic names from a consumer-protocol Subscription (int16 version, then an array of int16-length strings);
    None if it does not parse."""
    try:
        pos = 2
        (count,) = struct.unpack_from(">i", metadata, pos)
        pos += 4
        if count < 0 or count > len(metadata):
            return None
        topics = set()
        for _ in range(count):
            (length,) = struct.unpack_from(">h", metadata, pos)
            pos += 2
            if length < 0 or pos + length > len(metadata):
                return None
            topics.add(metadata[pos:pos + length].decode("utf-8"))
            pos += length
        return topics
    except (struct.error, UnicodeDecodeError):
        return None
