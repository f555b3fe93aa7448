"""The pure parts of the online migration and of stored consumer groups: the classic consumer protocol's embedded
subscription and assignment (every version, a newer one read as 3), a classic group turned into a consumer group and
back, and a consumer group's record read back as the group it was."""
import struct

import pytest
from kafka.protocol.consumer.metadata import ConsumerProtocolAssignment, ConsumerProtocolSubscription

from kop.groups.consumer.embedded import EmbeddedProtocolError, encode_assignment, parse_assignment, \
    parse_subscription
from kop.groups.consumer.group import ConsumerGroup
from kop.groups.consumer.member import ClassicProtocols, ConsumerMember, MemberState
from kop.groups.consumer.migration import MigrationPolicy, MigrationRefused, to_classic_group, to_consumer_group
from kop.groups.consumer.records import consumer_group_record, restore_consumer_group
from kop.groups.group import Group, GroupState, Member

T = "t"


def subscription(version: int, owned: list[int] = (), rack: str | None = None) -> bytes:
    fields = dict(version=version, topics=[T], user_data=None)
    if version >= 1:
        fields["owned_partitions"] = [ConsumerProtocolSubscription.TopicPartition(topic=T, partitions=list(owned))]
    if version >= 2:
        fields["generation_id"] = 7
    if version >= 3:
        fields["rack_id"] = rack
    return ConsumerProtocolSubscription(**fields).encode()


def assignment(partitions: list[int], user_data: bytes | None = None) -> bytes:
    return ConsumerProtocolAssignment(version=0, user_data=user_data, assigned_partitions=[
        ConsumerProtocolAssignment.TopicPartition(topic=T, partitions=partitions)]).encode()


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_every_subscription_version_is_read(version):
    sub = parse_subscription(subscription(version, owned=[1, 2], rack="r1"))
    assert (sub.version, sub.topics) == (version, frozenset({T}))
    assert sub.owned == (frozenset({(T, 1), (T, 2)}) if version >= 1 else frozenset())
    assert sub.rack_id == ("r1" if version >= 3 else None)


def test_a_newer_version_is_read_as_3_and_garbage_is_refused():
    newer = struct.pack(">h", 4) + subscription(3, owned=[0])[2:] + b"future fields"
    assert parse_subscription(newer).owned == frozenset({(T, 0)})
    for bad in (b"", b"\x00", b"\xff\xff\x00\x00\x00\x00", b"\x00\x00\x00\x00\x00\x01\x00\x05ab"):
        with pytest.raises(EmbeddedProtocolError):
            parse_subscription(bad)


def test_an_assignment_is_written_in_the_members_version_capped_at_3():
    for version, written in ((0, 0), (2, 2), (7, 3)):
        data = encode_assignment(frozenset({(T, 3), (T, 1)}), version)
        assert struct.unpack_from(">h", data)[0] == written
        assert parse_assignment(data) == (frozenset({(T, 1), (T, 3)}), None)
    assert parse_assignment(b"") == (frozenset(), None)


def classic_group() -> Group:
    group = Group("g", state=GroupState.STABLE, generation_id=5, protocol_type="consumer", protocol_name="range")
    group.add(Member("eager", None, "c1", "/h", 10_000, 20_000, "consumer",
                     [("range", subscription(0)), ("roundrobin", subscription(0))], assignment([0, 1])))
    group.add(Member("coop", "i-2", "c2", "/h", 10_000, 20_000, "consumer",
                     [("range", subscription(1, owned=[2, 3]))], assignment([2])))
    return group


def test_a_classic_group_becomes_a_consumer_group_holding_what_its_members_own():
    group = to_consumer_group(classic_group())
    assert (group.epoch, group.assignment_epoch) == (5, 5)
    eager, coop = group.members["eager"], group.members["coop"]
    assert (eager.epoch, eager.state, eager.assigned) == (5, MemberState.STABLE, frozenset({(T, 0), (T, 1)}))
    # what its assignment says, and what its subscription says it still owns
    assert coop.assigned == frozenset({(T, 2), (T, 3)}) and group.static_members == {"i-2": "coop"}
    assert eager.classic == ClassicProtocols(10_000, (("range", subscription(0)), ("roundrobin", subscription(0))))
    assert group.supports_classic_protocols("consumer", frozenset({"range"}))
    assert not group.supports_classic_protocols("consumer", frozenset({"roundrobin"}))  # coop lacks it


def test_an_assignment_with_an_assignors_user_data_is_not_converted():
    group = classic_group()
    group.members["eager"].assignment = assignment([0], user_data=b"sticky state")
    with pytest.raises(MigrationRefused, match="user data"):
        to_consumer_group(group)


def test_a_consumer_group_of_classic_members_becomes_a_classic_group_with_their_targets():
    group = to_consumer_group(classic_group())
    leaving = ConsumerMember("new", None, "c3", "/h", rebalance_timeout_ms=30_000, subscribed_names=frozenset({T}))
    group.members["new"] = leaving
    group.target = {"eager": frozenset({(T, 0)}), "coop": frozenset({(T, 2)}), "new": frozenset({(T, 1), (T, 3)})}
    assert group.all_classic_except("new") and not group.all_classic_except("eager")
    classic = to_classic_group(group, leaving="new")
    assert (classic.state, classic.generation_id, classic.protocol_name) == (GroupState.STABLE, 5, "range")
    assert list(classic.members) == ["eager", "coop"] and classic.static_members == {"i-2": "coop"}
    assert parse_assignment(classic.members["eager"].assignment)[0] == frozenset({(T, 0)})
    assert struct.unpack_from(">h", classic.members["coop"].assignment)[0] == 1  # coop's subscription version
    with pytest.raises(MigrationRefused):
        to_classic_group(group, leaving=None)  # "new" uses the consumer protocol


def test_the_policy_names_kafkas_values_in_any_case():
    assert [MigrationPolicy.parse(v) for v in ("Disabled", "UPGRADE", "downgrade", "bidirectional")] == \
        list(MigrationPolicy)
    assert [(p.upgrades, p.downgrades) for p in MigrationPolicy] == \
        [(False, False), (True, False), (False, True), (True, True)]


def test_a_stored_consumer_group_reads_back_as_it_was():
    group = ConsumerGroup("g", epoch=9, assignment_epoch=8, assignor="range", partition_counts={T: 4})
    group.members["a"] = ConsumerMember(
        "a", "i-a", "client", "/h", rack_id="r", rebalance_timeout_ms=5000, subscribed_names=frozenset({T}),
        subscribed_regex="^t.*", server_assignor="range", epoch=8, previous_epoch=7,
        state=MemberState.UNREVOKED_PARTITIONS, assigned=frozenset({(T, 0)}), revoking=frozenset({(T, 1)}),
        owned=frozenset({(T, 0), (T, 1)}), regex_topics=frozenset({T}))
    group.members["c"] = ConsumerMember("c", None, "classic", "/h", epoch=9, previous_epoch=8,
                                        assigned=frozenset({(T, 2)}),
                                        classic=ClassicProtocols(6000, (("range", subscription(1, [2])),)))
    group.static_members = {"i-a": "a"}
    group.target = {"a": frozenset({(T, 0)}), "c": frozenset({(T, 1), (T, 2)})}
    record = consumer_group_record(group)
    restored = restore_consumer_group(type(record).FromString(record.SerializeToString()))
    assert restored == group
