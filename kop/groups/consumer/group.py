"""A consumer-protocol group (KIP-848): its epoch, members and target assignment.

The group epoch moves on whenever what the assignment depends on changes (a member joins, leaves or changes its
subscription or assignor, a subscribed topic appears or grows); each move computes a new target assignment at that
epoch, towards which every member then reconciles on its own heartbeats.
"""
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from kop.groups.consumer.assignors import ASSIGNORS, DEFAULT_ASSIGNOR
from kop.groups.consumer.member import ConsumerMember, MemberState, Partitions, TopicPartition

CONSUMER_GROUP_TYPE = "consumer"
CONSUMER_PROTOCOL_TYPE = "consumer"


class ConsumerGroupState(Enum):
    EMPTY = "Empty"
    ASSIGNING = "Assigning"  # never observed here: the target is computed as the epoch moves
    RECONCILING = "Reconciling"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass
class ConsumerGroup:
    group_id: str
    epoch: int = 0
    assignment_epoch: int = 0
    members: dict[str, ConsumerMember] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)  # instance id -> member id
    target: dict[str, Partitions] = field(default_factory=dict)  # member id -> its target partitions
    partition_counts: dict[str, int] = field(default_factory=dict)  # subscribed topics as last assigned
    assignor: str = DEFAULT_ASSIGNOR
    dead: bool = False

    @property
    def state(self) -> ConsumerGroupState:
        if self.dead:
            return ConsumerGroupState.DEAD
        if not self.members:
            return ConsumerGroupState.EMPTY
        if any(m.epoch != self.assignment_epoch or m.state is not MemberState.STABLE
               for m in self.members.values()):
            return ConsumerGroupState.RECONCILING
        return ConsumerGroupState.STABLE

    def subscribed_topics(self) -> frozenset[str]:
        return frozenset().union(*(m.subscribed_topics for m in self.members.values()))

    def held_by_other(self, member_id: str, tp: TopicPartition) -> bool:
        return any(m.holds(tp) for other, m in self.members.items() if other != member_id)

    def _choose_assignor(self, default: str) -> str:
        """The assignor most members ask for (the broker's default when none asks)."""
        asked = [m.server_assignor for m in self.members.values() if m.server_assignor]
        return max(sorted(set(asked)), key=asked.count) if asked else default

    def bump(self, partition_counts: Mapping[str, int], default_assignor: str = DEFAULT_ASSIGNOR) -> None:
        """Move to the next epoch and compute its target assignment."""
        self.epoch += 1
        self.partition_counts = dict(partition_counts)
        self.assignor = self._choose_assignor(default_assignor)
        subscriptions = {mid: m.subscribed_topics for mid, m in self.members.items()}
        current: dict[str, dict[str, set[int]]] = {}
        for member_id, partitions in self.target.items():
            for topic, index in partitions:
                current.setdefault(member_id, {}).setdefault(topic, set()).add(index)
        assigned = ASSIGNORS[self.assignor](subscriptions, self.partition_counts, current)
        self.target = {mid: frozenset((t, i) for t, indexes in per_topic.items() for i in indexes)
                       for mid, per_topic in assigned.items()}
        self.assignment_epoch = self.epoch

    def reconcile(self, member: ConsumerMember) -> None:
        member.reconcile(self.target.get(member.member_id, frozenset()), self.assignment_epoch,
                         lambda tp: self.held_by_other(member.member_id, tp))

    # ---- members of the classic protocol (Kafka's online migration)

    def classic_members(self) -> list[ConsumerMember]:
        return [m for m in self.members.values() if m.classic is not None]

    def supports_classic_protocols(self, protocol_type: str, names: frozenset[str]) -> bool:
        """A classic member may join with protocol type "consumer" and a protocol every classic member supports."""
        if protocol_type != CONSUMER_PROTOCOL_TYPE or not names:
            return False
        return any(all(name in m.classic.names() for m in self.classic_members()) for name in names)

    def all_classic_except(self, member_id: str) -> bool:
        """Whether every member but this one (a consumer-protocol member) uses the classic protocol."""
        member = self.members.get(member_id)
        return member is not None and member.classic is None \
            and all(m.classic is not None for mid, m in self.members.items() if mid != member_id)

    def waiting_on_unreleased(self, member: ConsumerMember) -> bool:
        """Whether a member still waits for target partitions that another member holds."""
        if member.state is not MemberState.UNRELEASED_PARTITIONS:
            return False
        return any(self.held_by_other(member.member_id, tp)
                   for tp in self.target.get(member.member_id, frozenset()) - member.assigned)

    def remove(self, member_id: str) -> ConsumerMember | None:
        member = self.members.pop(member_id, None)
        if member is not None and member.instance_id is not None \
                and self.static_members.get(member.instance_id) == member_id:
            del self.static_members[member.instance_id]
        self.target.pop(member_id, None)
        return member
