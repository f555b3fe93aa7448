"""A consumer-protocol group as the group generation log keeps it (kop/groups/generations.py): one record per group
id, the same log and the same last-record-wins rule as classic groups, so a group that changes kind is simply
recorded as its new kind.

Kafka keeps these groups in __consumer_offsets as records of their epoch, members, target and current assignments;
kop writes the whole group after each change, before the member that caused it is answered, so a restarted broker
restores every member with its epoch and partitions and members go on heartbeating as if nothing happened.
"""
from collections.abc import Iterable

from kop.groups.consumer.assignors import DEFAULT_ASSIGNOR
from kop.groups.consumer.group import CONSUMER_PROTOCOL_TYPE, ConsumerGroup
from kop.groups.consumer.member import ClassicProtocols, ConsumerMember, MemberState, Partitions, by_topic
from proto.kop_pb2 import (ConsumerGroupRecord, ConsumerMemberRecord, GroupGeneration, GroupProtocolRecord,
                           TopicPartitionsRecord)


def _partitions(partitions: Partitions) -> list[TopicPartitionsRecord]:
    return [TopicPartitionsRecord(topic=topic, partitions=indexes) for topic, indexes in by_topic(partitions).items()]


def _restored(records: Iterable[TopicPartitionsRecord]) -> Partitions:
    return frozenset((r.topic, p) for r in records for p in r.partitions)


def _member_record(group: ConsumerGroup, m: ConsumerMember) -> ConsumerMemberRecord:
    record = ConsumerMemberRecord(
        member_id=m.member_id, instance_id=m.instance_id, client_id=m.client_id, client_host=m.client_host,
        rack_id=m.rack_id, rebalance_timeout_ms=m.rebalance_timeout_ms, subscribed_names=sorted(m.subscribed_names),
        subscribed_regex=m.subscribed_regex, server_assignor=m.server_assignor, epoch=m.epoch,
        previous_epoch=m.previous_epoch, state=m.state.value, assigned=_partitions(m.assigned),
        revoking=_partitions(m.revoking), owned=_partitions(m.owned),
        target=_partitions(group.target.get(m.member_id, frozenset())), regex_topics=sorted(m.regex_topics))
    if m.classic is not None:
        record.classic_session_timeout_ms = m.classic.session_timeout_ms
        record.classic_protocols.extend(GroupProtocolRecord(name=name, metadata=metadata)
                                        for name, metadata in m.classic.protocols)
    return record


def consumer_group_record(group: ConsumerGroup) -> GroupGeneration:
    return GroupGeneration(
        group_id=group.group_id, generation_id=group.epoch, protocol_type=CONSUMER_PROTOCOL_TYPE,
        consumer=ConsumerGroupRecord(
            epoch=group.epoch, assignment_epoch=group.assignment_epoch, assignor=group.assignor,
            members=[_member_record(group, m) for m in group.members.values()],
            partition_counts=[TopicPartitionsRecord(topic=topic, count=count)
                              for topic, count in sorted(group.partition_counts.items())]))


def _optional(record, name: str) -> str | None:
    return getattr(record, name) if record.HasField(name) else None


def restore_consumer_group(record: GroupGeneration) -> ConsumerGroup:
    stored = record.consumer
    group = ConsumerGroup(record.group_id, epoch=stored.epoch, assignment_epoch=stored.assignment_epoch,
                          assignor=stored.assignor or DEFAULT_ASSIGNOR,
                          partition_counts={c.topic: c.count for c in stored.partition_counts})
    for r in stored.members:
        classic = None
        if r.HasField("classic_session_timeout_ms"):
            classic = ClassicProtocols(r.classic_session_timeout_ms,
                                       tuple((p.name, p.metadata) for p in r.classic_protocols))
        member = ConsumerMember(
            r.member_id, _optional(r, "instance_id"), r.client_id, r.client_host, rack_id=_optional(r, "rack_id"),
            rebalance_timeout_ms=r.rebalance_timeout_ms, subscribed_names=frozenset(r.subscribed_names),
            subscribed_regex=_optional(r, "subscribed_regex"), server_assignor=_optional(r, "server_assignor"),
            epoch=r.epoch, previous_epoch=r.previous_epoch, state=MemberState(r.state), assigned=_restored(r.assigned),
            revoking=_restored(r.revoking), owned=_restored(r.owned), regex_topics=frozenset(r.regex_topics),
            classic=classic)
        group.members[member.member_id] = member
        if member.instance_id is not None:
            group.static_members[member.instance_id] = member.member_id
        group.target[member.member_id] = _restored(r.target)
    return group
