"""A member of a consumer-protocol group and its reconciliation towards the group's target assignment.

The rules (KIP-848): a member moves to the target epoch only once it holds none of the partitions the target took
from it. First it is told its kept partitions and keeps its epoch (UNREVOKED_PARTITIONS) until a heartbeat reports
that it no longer owns the revoked ones. Then it takes the target epoch with every target partition that no other
member still holds (assigned, or being revoked); the rest it gets on a later heartbeat, once their previous owner
has let them go (UNRELEASED_PARTITIONS). So a partition never has two owners.

A member of the classic protocol (a classic consumer in a consumer group, Kafka's online migration) reconciles only
when it joins: its JoinGroup tells what it still owns (an eager consumer gave up everything before it rejoined, a
cooperative one lists what it kept), so it is asked to revoke only partitions it really still holds.
"""
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

TopicPartition = tuple[str, int]
Partitions = frozenset[TopicPartition]

JOIN_EPOCH = 0
LEAVE_EPOCH = -1
STATIC_LEAVE_EPOCH = -2  # a static member that will come back: its partitions wait for it


@dataclass(frozen=True, slots=True)
class ClassicProtocols:
    """What a member of the classic protocol joined with: its session timeout and its (name, subscription)
    protocols in its order of preference."""
    session_timeout_ms: int
    protocols: tuple[tuple[str, bytes], ...]

    @property
    def protocol_name(self) -> str:
        """The protocol it is answered with (Kafka's: its first)."""
        return self.protocols[0][0]

    def names(self) -> frozenset[str]:
        return frozenset(name for name, _ in self.protocols)


class MemberState(Enum):
    STABLE = "stable"
    UNREVOKED_PARTITIONS = "unrevoked_partitions"
    UNRELEASED_PARTITIONS = "unreleased_partitions"


@dataclass
class ConsumerMember:
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    rack_id: str | None = None
    rebalance_timeout_ms: int = 0
    subscribed_names: frozenset[str] = frozenset()
    subscribed_regex: str | None = None
    server_assignor: str | None = None
    epoch: int = JOIN_EPOCH
    previous_epoch: int = JOIN_EPOCH
    state: MemberState = MemberState.STABLE
    assigned: Partitions = frozenset()
    revoking: Partitions = frozenset()
    owned: Partitions = frozenset()  # what the member last reported it owns
    regex_topics: frozenset[str] = frozenset()  # what its regex matched at its last heartbeat
    last_sent: tuple[int, Partitions] | None = None  # the epoch and assignment last answered
    classic: ClassicProtocols | None = None  # set for a member of the classic protocol

    @property
    def uses_classic(self) -> bool:
        return self.classic is not None

    @property
    def subscribed_topics(self) -> frozenset[str]:
        return self.subscribed_names | self.regex_topics

    def holds(self, tp: TopicPartition) -> bool:
        return tp in self.assigned or tp in self.revoking

    def release_all(self) -> None:
        """The client gave up every partition (it rejoins with epoch 0 after being fenced or restarting)."""
        self.assigned = self.revoking = self.owned = frozenset()
        self.state = MemberState.STABLE
        self.epoch = self.previous_epoch = JOIN_EPOCH

    def reconcile(self, target: Partitions, target_epoch: int,
                  held_elsewhere: Callable[[TopicPartition], bool]) -> None:
        if self.state is MemberState.UNREVOKED_PARTITIONS:
            if self.owned & self.revoking:
                return  # still waiting for the member to let them go
            self.revoking = frozenset()
        elif self.state is MemberState.STABLE and self.epoch == target_epoch:
            return
        kept = self.assigned & target
        revoked = self.assigned - target
        if revoked and (self.classic is None or self.owned & revoked):
            self.assigned, self.revoking = kept, revoked
            self.state = MemberState.UNREVOKED_PARTITIONS
            return
        wanted = target - kept
        free = frozenset(tp for tp in wanted if not held_elsewhere(tp))
        self.assigned = kept | free
        if self.epoch != target_epoch:
            self.previous_epoch, self.epoch = self.epoch, target_epoch
        self.state = MemberState.STABLE if free == wanted else MemberState.UNRELEASED_PARTITIONS


def by_topic(partitions: Partitions) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for topic, index in sorted(partitions):
        out.setdefault(topic, []).append(index)
    return out
