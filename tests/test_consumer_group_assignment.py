"""KIP-848's server-side assignors and member reconciliation (kop.groups.consumer), as pure functions: balance,
stickiness, range's contiguous co-partitioned shares, and the rule that a partition gets a new owner only after the
previous one revoked it."""
from kop.groups.consumer.assignors import range_assignor, uniform_assignor
from kop.groups.consumer.group import ConsumerGroup
from kop.groups.consumer.member import ConsumerMember, MemberState


def flat(assignment):
    return {m: {(t, p) for t, ps in per_topic.items() for p in ps} for m, per_topic in assignment.items()}


def test_uniform_balances_and_moves_only_what_it_must():
    subs = {m: frozenset({"t"}) for m in "ab"}
    first = uniform_assignor(subs, {"t": 6}, {})
    assert sorted(len(s) for s in flat(first).values()) == [3, 3]
    subs["c"] = frozenset({"t"})
    second = flat(uniform_assignor(subs, {"t": 6}, first))
    assert sorted(len(s) for s in second.values()) == [2, 2, 2]
    for member in "ab":  # each kept two of its three
        assert len(second[member] & flat(first)[member]) == 2
    assert set().union(*second.values()) == {("t", p) for p in range(6)}


def test_uniform_respects_different_subscriptions():
    subs = {"a": frozenset({"t", "u"}), "b": frozenset({"u"})}
    target = flat(uniform_assignor(subs, {"t": 2, "u": 2}, {}))
    # only a may take t's partitions, so u's go to b: two each
    assert target == {"a": {("t", 0), ("t", 1)}, "b": {("u", 0), ("u", 1)}}


def test_range_gives_contiguous_shares_with_the_same_numbers_on_every_topic():
    subs = {m: frozenset({"t", "u"}) for m in ("m2", "m1")}
    target = range_assignor(subs, {"t": 5, "u": 5}, {})
    assert target["m1"] == {"t": {0, 1, 2}, "u": {0, 1, 2}}
    assert target["m2"] == {"t": {3, 4}, "u": {3, 4}}


def group_of(*members: str) -> ConsumerGroup:
    group = ConsumerGroup("g")
    for member_id in members:
        group.members[member_id] = ConsumerMember(member_id, None, "c", "/h", subscribed_names=frozenset({"t"}))
    return group


def test_a_partition_changes_owner_only_after_the_owner_revoked_it():
    group = group_of("a")
    group.bump({"t": 2})
    a = group.members["a"]
    group.reconcile(a)
    assert (a.epoch, a.assigned) == (1, {("t", 0), ("t", 1)})
    a.owned = a.assigned
    group.members["b"] = b = ConsumerMember("b", None, "c", "/h", subscribed_names=frozenset({"t"}))
    group.bump({"t": 2})
    group.reconcile(b)
    assert (b.epoch, b.assigned, b.state) == (2, frozenset(), MemberState.UNRELEASED_PARTITIONS)
    group.reconcile(a)  # a is told to revoke one; it keeps epoch 1 until it reports it gone
    assert (a.epoch, a.state, len(a.revoking)) == (1, MemberState.UNREVOKED_PARTITIONS, 1)
    group.reconcile(b)
    assert b.assigned == frozenset()  # still held by a
    group.reconcile(a)
    assert a.state is MemberState.UNREVOKED_PARTITIONS  # a has not reported yet
    a.owned = a.assigned
    group.reconcile(a)
    assert (a.epoch, a.state, a.revoking) == (2, MemberState.STABLE, frozenset())
    group.reconcile(b)
    assert (b.epoch, b.state, len(b.assigned)) == (2, MemberState.STABLE, 1)
    assert not a.assigned & b.assigned
