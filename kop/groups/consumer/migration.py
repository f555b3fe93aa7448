"""Online migration between the classic and the consumer group protocols, as Kafka 4 does it under
`group.consumer.migration.policy`:

- upgrade: the first consumer-protocol member to join a classic group that has members turns it into a consumer group
  in place. Each classic member becomes a member of the classic protocol in the consumer group, at the classic
  generation as its epoch, holding the partitions it was assigned (and, kop's addition, any its subscription says it
  still owns), so the newcomer gets only what nobody holds; the classic members then rejoin and reconcile.
- downgrade: when the last consumer-protocol member leaves (or times out) and only classic members remain, the group
  becomes a classic group again at its epoch as the generation, each member assigned its target partitions, and
  rebalances at once (the classic protocol's leader assigns from what the members then report).

An empty group changes kind whatever the policy (the offline migration). The conversions here are pure; the
coordinator swaps the groups and drives what follows.
"""
from enum import Enum

from kop.groups.consumer.embedded import EmbeddedProtocolError, encode_assignment, parse_assignment, \
    parse_subscription, version_of
from kop.groups.consumer.group import CONSUMER_PROTOCOL_TYPE, ConsumerGroup
from kop.groups.consumer.member import ClassicProtocols, ConsumerMember
from kop.groups.group import Group, GroupState, Member


class MigrationPolicy(Enum):
    DISABLED = "disabled"
    UPGRADE = "upgrade"
    DOWNGRADE = "downgrade"
    BIDIRECTIONAL = "bidirectional"

    @classmethod
    def parse(cls, value: str) -> "MigrationPolicy":
        return cls(value.strip().lower())

    @property
    def upgrades(self) -> bool:
        return self in (MigrationPolicy.UPGRADE, MigrationPolicy.BIDIRECTIONAL)

    @property
    def downgrades(self) -> bool:
        return self in (MigrationPolicy.DOWNGRADE, MigrationPolicy.BIDIRECTIONAL)


class MigrationRefused(Exception):
    """The group cannot change kind; the message says why."""


def to_consumer_group(classic: Group) -> ConsumerGroup:
    """The consumer group a classic group with members becomes."""
    generation = classic.generation_id
    group = ConsumerGroup(classic.group_id, epoch=generation, assignment_epoch=generation)
    for m in classic.members.values():
        metadata = m.metadata_for(classic.protocol_name) if classic.protocol_name in m.protocol_names() \
            else m.protocols[0][1]
        try:
            subscription = parse_subscription(metadata)
            assigned, user_data = parse_assignment(m.assignment)
        except EmbeddedProtocolError as exc:
            raise MigrationRefused(f"member {m.member_id}: {exc}") from None
        if user_data:
            raise MigrationRefused(f"member {m.member_id}'s assignment carries its assignor's user data, which a "
                                   f"consumer group would lose")
        held = assigned | subscription.owned
        member = ConsumerMember(m.member_id, m.group_instance_id, m.client_id, m.client_host,
                                rack_id=subscription.rack_id, rebalance_timeout_ms=m.rebalance_timeout_ms,
                                subscribed_names=subscription.topics, epoch=generation, previous_epoch=generation,
                                assigned=held, owned=held,
                                classic=ClassicProtocols(m.session_timeout_ms, tuple(m.protocols)))
        group.members[member.member_id] = member
        if member.instance_id is not None:
            group.static_members[member.instance_id] = member.member_id
        group.target[member.member_id] = held
    return group


def to_classic_group(group: ConsumerGroup, leaving: str | None) -> Group:
    """The classic group that a consumer group whose members (but `leaving`) all use the classic protocol becomes:
    Stable at the group's epoch, each member assigned its target."""
    classic = Group(group.group_id, state=GroupState.STABLE, generation_id=group.epoch,
                    protocol_type=CONSUMER_PROTOCOL_TYPE)
    for member_id, m in group.members.items():
        if member_id == leaving:
            continue
        if m.classic is None:
            raise MigrationRefused(f"member {member_id} uses the consumer protocol")
        classic.add(Member(member_id, m.instance_id, m.client_id, m.client_host, m.classic.session_timeout_ms,
                           m.rebalance_timeout_ms or m.classic.session_timeout_ms, CONSUMER_PROTOCOL_TYPE,
                           list(m.classic.protocols)))
    try:
        classic.protocol_name = classic.select_protocol()
    except ValueError as exc:
        raise MigrationRefused(str(exc)) from None
    classic.subscribed_topics = classic.compute_subscribed_topics()
    for member in classic.members.values():
        try:
            version = version_of(member.metadata_for(classic.protocol_name))
        except EmbeddedProtocolError:
            version = 0
        member.assignment = encode_assignment(group.target.get(member.member_id, frozenset()), version)
    return classic
