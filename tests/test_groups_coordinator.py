"""The group coordinator in process, on a real broker object with real file storage: the classic group state
machine, its error codes, and committed offsets stored as managed-ledger cursors."""
import asyncio
import dataclasses
import struct
import time

import pytest

from kop.broker import Broker
from kop.config import BrokerConfig
from kop.groups import GroupState, JoinRequest
from kop.groups.membership import Membership
from kop.groups.offsets import COMMIT_TS_KEY, LEADER_EPOCH_KEY, METADATA_KEY, OFFSET_KEY
from kop.ledger import BEFORE_FIRST, Position
from protocol.errors import ErrorCode
from protocol.records import Record, build_batch, split_batches

E = ErrorCode
pytestmark = pytest.mark.timeout(20)  # a coordinator test that waits longer is stuck


def subscription(*topics: str) -> bytes:
    out = struct.pack(">hi", 0, len(topics))
    for t in topics:
        out += struct.pack(">h", len(t)) + t.encode()
    return out + struct.pack(">i", -1)


class Brokers:
    """Started in-process brokers on real file storage in the test's directory; every one is stopped at the end."""

    def __init__(self, data_dir: str) -> None:
        self.data_dir = data_dir
        self.running: list[Broker] = []

    async def start(self, **config) -> Broker:
        return await self._start(BrokerConfig(**{"port": 0, "admin_port": 0, "fsync": False,
                                                 "data_dir": self.data_dir, "group_min_session_timeout_ms": 50,
                                                 **config}))

    async def restart(self, broker: Broker) -> Broker:
        """Stop it and start a broker with the same configuration and data."""
        self.running.remove(broker)
        await broker.stop()
        return await self._start(broker.config)

    async def _start(self, config: BrokerConfig) -> Broker:
        broker = Broker(config)
        await broker.start()
        self.running.append(broker)
        return broker

    async def stop_all(self) -> None:
        while self.running:
            await self.running.pop().stop()


@pytest.fixture
async def brokers(tmp_path):
    started = Brokers(str(tmp_path / "data"))
    yield started
    await started.stop_all()


@pytest.fixture
async def broker(brokers):
    return await brokers.start()


def join_req(member_id="", group="g", instance=None, session=5000, rebalance=5000, protocols=None, v4=True,
             client="c"):
    return JoinRequest(group_id=group, member_id=member_id, group_instance_id=instance,
                       session_timeout_ms=session, rebalance_timeout_ms=rebalance, protocol_type="consumer",
                       protocols=protocols or [("range", subscription("t"))], client_id=client,
                       client_host="/127.0.0.1", require_known_member_id=v4)


async def join_new(groups, **kw):
    """First join of a dynamic member: MEMBER_ID_REQUIRED, then the real join (a future)."""
    first = await groups.join(join_req(**kw))
    assert first.error == E.MEMBER_ID_REQUIRED and first.member_id
    return first.member_id, groups.join(join_req(member_id=first.member_id, **kw))


async def publish(partition, count: int):
    """Append one batch of `count` records; returns its base offset."""
    base = partition.high_watermark
    batch = build_batch([Record(base + i, 1_700_000_000_000, None, b"x") for i in range(count)], base_offset=base)
    header, view = split_batches(batch)[0]
    result = await partition.publish_normal(header, view)
    assert result.error == E.NONE
    return result.base_offset


# ---- membership


async def test_first_member_gets_member_id_then_leads_a_generation_of_one(broker):
    groups = broker.groups
    member, joining = await join_new(groups)
    result = await joining
    assert (result.error, result.generation_id, result.leader_id, result.protocol_name) == \
        (E.NONE, 1, member, "range")
    assert [m.member_id for m in result.members] == [member]
    assert groups.groups["g"].state is GroupState.COMPLETING_REBALANCE
    synced = await groups.sync("g", 1, member, None, "consumer", "range", {member: b"assignment"})
    assert (synced.error, synced.assignment) == (E.NONE, b"assignment")
    assert groups.groups["g"].state is GroupState.STABLE
    assert groups.heartbeat("g", 1, member, None) == E.NONE


async def test_join_v0_to_v3_gets_a_member_id_without_the_extra_round_trip(broker):
    result = await broker.groups.join(join_req(v4=False))
    assert result.error == E.NONE and result.member_id.startswith("c-") and result.generation_id == 1


async def test_second_member_triggers_a_rebalance_both_rejoin_and_the_follower_waits_for_the_leader(broker):
    groups = broker.groups
    a, joining = await join_new(groups)
    await joining
    await groups.sync("g", 1, a, None, None, None, {a: b"all"})
    b, b_joining = await join_new(groups)
    assert groups.groups["g"].state is GroupState.PREPARING_REBALANCE
    assert not b_joining.done()  # waits for the old member to rejoin
    assert groups.heartbeat("g", 1, a, None) == E.REBALANCE_IN_PROGRESS
    assert (await groups.sync("g", 1, a, None, None, None, {})).error == E.REBALANCE_IN_PROGRESS
    # a commit of the old generation is still allowed before rejoining (eager protocol)
    assert groups.validate_commit("g", 1, a, None) == E.NONE
    a_result = await groups.join(join_req(member_id=a))
    b_result = await b_joining
    assert a_result.generation_id == b_result.generation_id == 2
    assert a_result.leader_id == b_result.leader_id == a
    assert sorted(m.member_id for m in a_result.members) == sorted([a, b]) and b_result.members == ()
    assert groups.validate_commit("g", 2, a, None) == E.REBALANCE_IN_PROGRESS  # CompletingRebalance
    follower = groups.sync("g", 2, b, None, None, None, {})
    await asyncio.sleep(0)
    assert not follower.done()
    leader = await groups.sync("g", 2, a, None, None, None, {a: b"p0", b: b"p1"})
    assert (leader.assignment, (await follower).assignment) == (b"p0", b"p1")
    assert groups.heartbeat("g", 1, a, None) == E.ILLEGAL_GENERATION
    assert groups.validate_commit("g", 1, a, None) == E.ILLEGAL_GENERATION


async def test_a_commit_while_completing_a_rebalance_checks_the_member_and_generation_first(broker):
    """As Kafka orders it: a member the group does not have (one whose coordinator moved, or whose session expired)
    is told UNKNOWN_MEMBER_ID, one of an older generation ILLEGAL_GENERATION, and only a current member
    REBALANCE_IN_PROGRESS. kafka-python treats REBALANCE_IN_PROGRESS as "rejoin" and keeps its positions for the
    partitions it gets back, behind what the members of the generations it missed committed."""
    groups = broker.groups
    a, joining = await join_new(groups)
    await joining
    await groups.sync("g", 1, a, None, None, None, {a: b"all"})
    b, b_joining = await join_new(groups)
    await groups.join(join_req(member_id=a))
    await b_joining
    assert groups.groups["g"].state is GroupState.COMPLETING_REBALANCE  # the control: generation 2, not synced
    assert groups.validate_commit("g", 2, "gone-member", None) == E.UNKNOWN_MEMBER_ID
    assert groups.validate_commit("g", 1, a, None) == E.ILLEGAL_GENERATION
    assert groups.validate_commit("g", 2, a, None) == E.REBALANCE_IN_PROGRESS


async def test_a_rebalance_while_a_generation_is_being_stored_does_not_strand_the_next_generations_sync():
    """Generation 1's store is still in flight when a second member joins and generation 2 forms: the leader's
    SyncGroup for generation 2 starts its own store, so both members get their assignments without waiting for
    a client timeout."""
    gate = asyncio.Event()
    stored = []

    async def slow_store(group, assignments):
        stored.append(group.generation_id)
        if len(stored) == 1:
            await gate.wait()  # generation 1's fsync takes a while

    membership = Membership({}, 0, 10, 60_000, 100, slow_store)
    try:
        first = await membership.join(join_req(v4=False, client="a"))
        a = first.member_id
        sync_1 = membership.sync("g", 1, a, None, None, None, {a: b"all"})
        await asyncio.sleep(0)  # generation 1's store has started
        b_joining = membership.join(join_req(v4=False, client="b"))
        assert (await sync_1).error == E.REBALANCE_IN_PROGRESS
        rejoined = await membership.join(join_req(member_id=a))
        b = (await b_joining).member_id
        assert rejoined.generation_id == 2
        leader = membership.sync("g", 2, a, None, None, None, {a: b"p0", b: b"p1"})
        follower = membership.sync("g", 2, b, None, None, None, {})
        await asyncio.sleep(0)
        gate.set()  # generation 1's store ends after the group moved on
        results = await asyncio.wait_for(asyncio.gather(leader, follower), 5)
        assert [(r.error, r.assignment) for r in results] == [(E.NONE, b"p0"), (E.NONE, b"p1")]
        assert stored == [1, 2]
    finally:
        membership.close()


async def test_a_retried_leader_sync_does_not_store_its_generation_twice():
    stored = []

    async def store(group, assignments):
        stored.append(group.generation_id)
        await asyncio.sleep(0.01)

    membership = Membership({}, 0, 10, 60_000, 100, store)
    try:
        a = (await membership.join(join_req(v4=False))).member_id
        first = membership.sync("g", 1, a, None, None, None, {a: b"x"})
        retried = membership.sync("g", 1, a, None, None, None, {a: b"x"})
        assert (await first).error == E.REBALANCE_IN_PROGRESS  # superseded by the retry
        assert ((await retried).error, stored) == (E.NONE, [1])
    finally:
        membership.close()


async def test_a_sync_answered_after_a_slow_store_gives_the_member_a_whole_session_from_the_answer():
    """As Kafka's propagateAssignment: the member sent nothing while it waited, so its session starts again when it
    gets its assignment, not when it asked for it."""
    gate = asyncio.Event()

    async def slow_store(group, assignments):
        await gate.wait()

    membership = Membership({}, 0, 10, 60_000, 100, slow_store)
    try:
        a = (await membership.join(join_req(v4=False, session=1000))).member_id
        synced = membership.sync("g", 1, a, None, None, None, {a: b"all"})
        await asyncio.sleep(0.5)  # half the session goes by in the store
        answered_after = asyncio.get_running_loop().time()
        gate.set()
        assert (await synced).error == E.NONE
        session = membership.timers._handles[("session", "g", a)]
        assert session.when() >= answered_after + 1.0  # a whole session from the answer (counted from the request
        # it would end 0.5 s after answered_after)
    finally:
        membership.close()


async def test_a_member_that_stops_heartbeating_is_removed_and_the_rest_rebalance(broker):
    groups = broker.groups
    a, ja = await join_new(groups, session=5000)
    await ja
    await groups.sync("g", 1, a, None, None, None, {})
    b, jb = await join_new(groups, session=200)
    await groups.join(join_req(member_id=a, session=5000))
    await jb
    await asyncio.gather(groups.sync("g", 2, a, None, None, None, {}), groups.sync("g", 2, b, None, None, None, {}))
    for _ in range(10):  # a heartbeats, b is silent
        await asyncio.sleep(0.05)
        groups.heartbeat("g", groups.groups["g"].generation_id, a, None)
    group = groups.groups["g"]
    assert not group.has(b)
    assert group.state is GroupState.PREPARING_REBALANCE
    rejoined = await groups.join(join_req(member_id=a))
    assert (rejoined.generation_id, [m.member_id for m in rejoined.members]) == (3, [a])


async def test_rebalance_timeout_drops_a_member_that_does_not_rejoin(broker):
    groups = broker.groups
    a, ja = await join_new(groups, rebalance=300)
    await ja
    await groups.sync("g", 1, a, None, None, None, {})
    b, jb = await join_new(groups, rebalance=300)
    result = await jb  # a never rejoins: after the rebalance timeout, b is alone
    assert (result.generation_id, result.leader_id, [m.member_id for m in result.members]) == (2, b, [b])
    assert groups.heartbeat("g", 2, a, None) == E.UNKNOWN_MEMBER_ID


async def test_a_member_that_never_syncs_is_removed_after_the_rebalance_timeout(broker):
    groups = broker.groups
    a, ja = await join_new(groups, rebalance=200)
    await ja
    await groups.sync("g", 1, a, None, None, None, {})
    b, jb = await join_new(groups, rebalance=200)
    await groups.join(join_req(member_id=a, rebalance=200))
    await jb
    follower = await asyncio.wait_for(groups.sync("g", 2, b, None, None, None, {}), 5)
    assert follower.error == E.REBALANCE_IN_PROGRESS  # the leader never sent its assignment
    assert not groups.groups["g"].has(a)


async def test_leave_group_rebalances_and_reports_each_member(broker):
    groups = broker.groups
    a, ja = await join_new(groups)
    await ja
    await groups.sync("g", 1, a, None, None, None, {})
    error, per_member = groups.leave("g", [(a, None), ("ghost", None)])
    assert (error, per_member) == (E.NONE, [E.NONE, E.UNKNOWN_MEMBER_ID])
    group = groups.groups["g"]
    assert (group.state, group.generation_id) == (GroupState.EMPTY, 2)
    assert groups.leave("nosuch", [("x", None)]) == (E.NONE, [E.UNKNOWN_MEMBER_ID])


async def test_the_leader_rejoining_a_stable_group_triggers_a_rebalance_a_follower_does_not(broker):
    groups = broker.groups
    a, ja = await join_new(groups)
    await ja
    await groups.sync("g", 1, a, None, None, None, {})
    b, jb = await join_new(groups)
    await groups.join(join_req(member_id=a))
    await jb
    await asyncio.gather(groups.sync("g", 2, a, None, None, None, {}), groups.sync("g", 2, b, None, None, None, {}))
    same = await groups.join(join_req(member_id=b))
    assert (same.error, same.generation_id, groups.groups["g"].state) == (E.NONE, 2, GroupState.STABLE)
    leader = groups.join(join_req(member_id=a))
    assert groups.groups["g"].state is GroupState.PREPARING_REBALANCE
    await groups.join(join_req(member_id=b))
    assert (await leader).generation_id == 3


async def test_static_member_rejoins_without_rebalance_and_fences_its_old_id(broker):
    groups = broker.groups
    first = await groups.join(join_req(instance="i-1"))  # static members skip MEMBER_ID_REQUIRED
    assert first.error == E.NONE and first.member_id.startswith("i-1-")
    await groups.sync("g", 1, first.member_id, "i-1", None, None, {first.member_id: b"mine"})
    again = await groups.join(join_req(instance="i-1"))  # restarted: no member id
    group = groups.groups["g"]
    assert (again.error, again.generation_id, group.state) == (E.NONE, 1, GroupState.STABLE)
    assert again.member_id != first.member_id
    assert again.leader_id == first.member_id  # the old leader id: do not reassign
    synced = await groups.sync("g", 1, again.member_id, "i-1", None, None, {})
    assert synced.assignment == b"mine"
    assert groups.heartbeat("g", 1, first.member_id, "i-1") == E.FENCED_INSTANCE_ID
    assert groups.validate_commit("g", 1, first.member_id, "i-1") == E.FENCED_INSTANCE_ID
    assert groups.heartbeat("g", 1, again.member_id, "i-1") == E.NONE
    # a change of the group's protocol does force a rebalance
    changed = groups.join(join_req(instance="i-1", protocols=[("roundrobin", subscription("t")),
                                                              ("range", subscription("t"))]))
    result = await changed
    assert (result.generation_id, result.protocol_name) == (2, "roundrobin")


async def test_static_leader_rejoining_with_v9_is_told_to_skip_assignment(broker):
    groups = broker.groups
    first = await groups.join(join_req(instance="i-1"))
    await groups.sync("g", 1, first.member_id, "i-1", None, None, {})
    again = await groups.join(dataclasses.replace(join_req(instance="i-1"), supports_skip_assignment=True))
    assert again.skip_assignment and again.leader_id == again.member_id and len(again.members) == 1


async def test_error_codes_for_bad_requests(broker):
    groups = broker.groups
    assert (await groups.join(join_req(group="pulsar.dedup"))).error == E.INVALID_GROUP_ID
    assert (await groups.join(join_req(group=""))).error == E.INVALID_GROUP_ID
    assert (await groups.join(join_req(session=10))).error == E.INVALID_SESSION_TIMEOUT
    assert (await groups.join(join_req(session=10 ** 8))).error == E.INVALID_SESSION_TIMEOUT
    assert (await groups.join(join_req(member_id="stranger"))).error == E.UNKNOWN_MEMBER_ID
    a, ja = await join_new(groups)
    await ja
    other = join_req(protocols=[("other", b"")])
    assert (await groups.join(other)).error == E.INCONSISTENT_GROUP_PROTOCOL
    assert groups.heartbeat("g", 1, "stranger", None) == E.UNKNOWN_MEMBER_ID
    assert groups.heartbeat("nosuch", 1, "x", None) == E.UNKNOWN_MEMBER_ID
    assert (await groups.sync("g", 1, a, None, "consumer", "roundrobin", {})).error == \
        E.INCONSISTENT_GROUP_PROTOCOL
    assert groups.validate_commit("g", -1, "", None) == E.UNKNOWN_MEMBER_ID  # only members commit to a live group
    await groups.sync("g", 1, a, None, None, None, {})
    assert groups.validate_commit("nosuch", 3, "x", None) == E.ILLEGAL_GENERATION
    assert groups.validate_commit("g", -1, "", None) == E.UNKNOWN_MEMBER_ID  # simple commit, live group
    assert await groups.delete_groups(["g", "nosuch", "pulsar.x"]) == [
        ("g", E.NON_EMPTY_GROUP), ("nosuch", E.GROUP_ID_NOT_FOUND), ("pulsar.x", E.INVALID_GROUP_ID)]
    groups.loaded = False
    assert (await groups.join(join_req())).error == E.COORDINATOR_LOAD_IN_PROGRESS
    assert groups.validate_commit("g", -1, "", None) == E.COORDINATOR_LOAD_IN_PROGRESS
    groups.loaded = True


async def test_a_heartbeat_while_the_coordinator_loads_is_answered_as_kafka_answers_it(broker):
    """Kafka's coordinators answer NONE (a member's next heartbeat after the load tells it what to do); aiokafka's
    consumer dies of COORDINATOR_LOAD_IN_PROGRESS on a heartbeat ("Unexpected exception in heartbeat task"), which
    the cluster soak met when a coordinator shard moved."""
    groups = broker.groups
    a, ja = await join_new(groups)
    await ja
    await groups.sync("g", 1, a, None, None, None, {})
    groups.loaded = False
    assert (await groups.join(join_req())).error == E.COORDINATOR_LOAD_IN_PROGRESS  # the control: it is loading
    assert groups.heartbeat("g", 1, a, None) == E.NONE
    groups.loaded = True
    assert groups.heartbeat("g", 1, a, None) == E.NONE


async def test_list_and_describe_groups_with_filters(broker):
    groups = broker.groups
    a, ja = await join_new(groups, group="live")
    await ja
    await groups.sync("live", 1, a, None, None, None, {a: b"asg"})
    await broker.topics.create("t", 1, {})
    assert groups.validate_commit("simple", -1, "", None) == E.NONE
    assert await groups.commit("simple", "t", 0, 0) == E.NONE
    listed = {g.group_id: (g.protocol_type, g.state) for g in groups.list_groups()}
    assert listed == {"live": ("consumer", "Stable"), "simple": ("", "Empty")}
    assert [g.group_id for g in groups.list_groups(states=["empty"])] == ["simple"]
    assert groups.list_groups(types=["consumer"]) == []
    d = groups.describe("live")
    assert (d.state, d.protocol_data, d.members[0].assignment) == ("Stable", "range", b"asg")
    assert groups.describe("nosuch").error == E.GROUP_ID_NOT_FOUND


# ---- committed offsets as cursors


async def test_commit_is_a_cursor_at_the_last_consumed_entry_with_the_exact_offset_in_its_properties(broker):
    groups = broker.groups
    topic = await broker.topics.create("t", 1, {})
    partition = topic.partitions[0]
    for _ in range(3):
        await publish(partition, 10)  # entries hold offsets 0-9, 10-19, 20-29
    assert groups.validate_commit("g", -1, "", None) == E.NONE
    assert await groups.commit("g", "t", 0, 25, leader_epoch=4, metadata="meta") == E.NONE
    cursor = partition.ledger.cursors["g"]
    assert cursor.mark_delete_position == partition.ledger.position_of_index(24)
    assert cursor.properties[OFFSET_KEY] == 25 and cursor.properties[LEADER_EPOCH_KEY] == 4
    assert cursor.properties[COMMIT_TS_KEY] > 0 and cursor.string_properties[METADATA_KEY] == "meta"
    fetched = groups.fetch_offset("g", "t", 0)
    assert (fetched.offset, fetched.leader_epoch, fetched.metadata) == (25, 4, "meta")
    # backwards: the cursor is reset to the earlier entry
    assert await groups.commit("g", "t", 0, 5) == E.NONE
    assert cursor.mark_delete_position == partition.ledger.position_of_index(4)
    assert await groups.commit("g", "t", 0, 0) == E.NONE
    assert cursor.mark_delete_position == BEFORE_FIRST
    # beyond the end: clamped to the last confirmed entry, the offset kept exactly
    assert await groups.commit("g", "t", 0, 1000) == E.NONE
    assert cursor.mark_delete_position == partition.ledger.last_confirmed
    assert groups.fetch_offset("g", "t", 0).offset == 1000
    assert await groups.commit("g", "nosuch", 0, 1) == E.UNKNOWN_TOPIC_OR_PARTITION
    assert await groups.commit("g", "t", 0, 1, metadata="x" * 5000) == E.OFFSET_METADATA_TOO_LARGE


async def test_concurrent_commits_of_one_partition_land_in_request_order(broker):
    groups = broker.groups
    topic = await broker.topics.create("t", 1, {})
    for _ in range(5):
        await publish(topic.partitions[0], 2)
    groups.validate_commit("g", -1, "", None)
    offsets = [8, 2, 10, 4, 6]
    results = await asyncio.gather(*[groups.commit("g", "t", 0, o) for o in offsets])
    assert results == [E.NONE] * 5
    assert groups.fetch_offset("g", "t", 0).offset == 6
    assert topic.partitions[0].ledger.cursors["g"].mark_delete_position == \
        topic.partitions[0].ledger.position_of_index(5)


async def test_groups_with_offsets_survive_a_restart_and_deleting_a_group_drops_its_cursors(brokers):
    broker = await brokers.start()
    topic = await broker.topics.create("t", 2, {})
    await publish(topic.partitions[0], 3)
    a, ja = await join_new(broker.groups, group="g")
    await ja
    await broker.groups.sync("g", 1, a, None, None, None, {})
    assert broker.groups.validate_commit("g", 1, a, None) == E.NONE
    assert await broker.groups.commit("g", "t", 0, 3, metadata="m") == E.NONE
    assert broker.groups.validate_commit("other", -1, "", None) == E.NONE
    assert await broker.groups.commit("other", "t", 1, 0) == E.NONE

    broker = await brokers.restart(broker)
    groups = broker.groups
    listed = {g.group_id: (g.protocol_type, g.state) for g in groups.list_groups()}
    assert listed == {"g": ("consumer", "Stable"), "other": ("", "Empty")}  # its member is restored
    assert groups.fetch_offset("g", "t", 0).metadata == "m"
    assert groups.heartbeat("g", 1, a, None) == E.NONE  # the member goes on in its generation
    assert groups.validate_commit("g", 1, a, None) == E.NONE
    assert groups.heartbeat("g", 1, "old-member", None) == E.UNKNOWN_MEMBER_ID
    assert groups.validate_commit("g", 1, "old-member", None) == E.UNKNOWN_MEMBER_ID
    assert await groups.delete_groups(["g"]) == [("g", E.NON_EMPTY_GROUP)]
    assert groups.leave("g", [(a, None)]) == (E.NONE, [E.NONE])
    assert await groups.delete_groups(["g"]) == [("g", E.NONE)]
    assert "g" not in broker.topics.partition("t", 0).ledger.cursors

    broker = await brokers.restart(broker)
    assert [g.group_id for g in broker.groups.list_groups()] == ["other"]
    assert broker.groups.fetch_offset("g", "t", 0) is None
    await broker.topics.delete("t")
    assert broker.groups.list_groups() == []  # its offsets went with the topic


async def test_a_restart_restores_members_their_assignments_and_sessions_and_an_emptied_group_stays_empty(brokers):
    """As Kafka's coordinator loads groups from __consumer_offsets: members go on in their generation with their
    assignments; one that never comes back expires after its session timeout (a rebalance, then Empty); a group
    that became empty before the restart comes back empty."""
    broker = await brokers.start()
    await broker.topics.create("t", 2, {})
    a, ja = await join_new(broker.groups, group="kept", session=400)
    await ja
    assert (await broker.groups.sync("kept", 1, a, None, None, None, {a: b"a's share"})).error == E.NONE
    b, jb = await join_new(broker.groups, group="emptied")
    await jb
    assert (await broker.groups.sync("emptied", 1, b, None, None, None, {b: b"b's"})).error == E.NONE
    assert broker.groups.leave("emptied", [(b, None)]) == (E.NONE, [E.NONE])
    await asyncio.sleep(0.1)  # the empty generation is stored in the background

    broker = await brokers.restart(broker)
    groups = broker.groups
    kept = groups.groups["kept"]
    assert (kept.state, kept.generation_id, kept.leader_id, kept.protocol_name) == \
        (GroupState.STABLE, 1, a, "range")
    assert kept.get(a).assignment == b"a's share"
    assert kept.subscribed_topics == frozenset({"t"})
    assert (groups.groups["emptied"].state, groups.groups["emptied"].members) == (GroupState.EMPTY, {})
    assert groups.heartbeat("emptied", 1, b, None) == E.UNKNOWN_MEMBER_ID
    deadline = time.monotonic() + 5
    while kept.members:  # a never heartbeats again: its session ends
        assert time.monotonic() < deadline, "the restored member never expired"
        await asyncio.sleep(0.05)
    assert kept.state is GroupState.EMPTY and kept.generation_id == 2


async def test_offset_delete_refuses_topics_a_live_consumer_group_subscribes_to(broker):
    groups = broker.groups
    for name in ("t", "u"):
        await broker.topics.create(name, 1, {})
    a, ja = await join_new(groups)
    await ja
    await groups.sync("g", 1, a, None, None, None, {})
    for name in ("t", "u"):
        assert await groups.commit("g", name, 0, 0) == E.NONE
    error, results = await groups.delete_offsets("g", [("t", 0), ("u", 0), ("nosuch", 0)])
    assert error == E.NONE
    assert results == {("t", 0): E.GROUP_SUBSCRIBED_TO_TOPIC, ("u", 0): E.NONE,
                       ("nosuch", 0): E.UNKNOWN_TOPIC_OR_PARTITION}
    assert groups.fetch_offset("g", "u", 0) is None and groups.fetch_offset("g", "t", 0) is not None
    assert (await groups.delete_offsets("nosuch", [("t", 0)]))[0] == E.GROUP_ID_NOT_FOUND


async def test_sweep_forgets_empty_groups_without_offsets(broker):
    groups = broker.groups
    a, ja = await join_new(groups)
    await ja
    groups.leave("g", [(a, None)])
    assert [g.state for g in groups.list_groups()] == ["Empty"]
    groups.sweep()
    assert groups.list_groups() == []


async def test_offset_delete_of_the_last_offset_and_refused_commits_leave_no_empty_group_behind(broker):
    groups = broker.groups
    await broker.topics.create("t", 1, {})
    assert groups.validate_commit("g", -1, "", None) == E.NONE
    assert await groups.commit("g", "t", 0, 3) == E.NONE
    assert await groups.delete_offsets("g", [("t", 0)]) == (E.NONE, {("t", 0): E.NONE})
    assert groups.list_groups() == [] and groups.describe("g").error == E.GROUP_ID_NOT_FOUND
    # commits that are refused create no group
    assert groups.validate_commit("h", -1, "", None) == E.NONE
    assert await groups.commit("h", "nosuch", 0, 1) == E.UNKNOWN_TOPIC_OR_PARTITION
    assert await groups.commit("h", "t", 0, 1, metadata="x" * 4097) == E.OFFSET_METADATA_TOO_LARGE
    assert groups.list_groups() == []


async def test_offset_metadata_is_limited_in_java_string_length_not_bytes(broker):
    """Kafka compares String.length() (UTF-16 code units) with offset.metadata.max.bytes."""
    groups = broker.groups
    await broker.topics.create("t", 1, {})
    groups.validate_commit("g", -1, "", None)
    assert await groups.commit("g", "t", 0, 1, metadata="\u00e9" * 4096) == E.NONE  # 8192 UTF-8 bytes
    assert await groups.commit("g", "t", 0, 1, metadata="\U0001F600" * 2048) == E.NONE  # surrogate pairs
    assert await groups.commit("g", "t", 0, 1, metadata="\U0001F600" * 2048 + "x") == \
        E.OFFSET_METADATA_TOO_LARGE
    assert groups.fetch_offset("g", "t", 0).metadata == "\U0001F600" * 2048


async def test_a_commit_racing_delete_groups_lands_before_and_is_deleted_or_after_and_is_kept(brokers):
    """The index of committed partitions always matches the durable cursors, before and after a restart."""
    def visible(groups):
        return ([g.group_id for g in groups.list_groups()],
                {tp: c.offset for tp, c in groups.fetch_all_offsets("g").items()})

    broker = await brokers.start()
    groups = broker.groups
    await broker.topics.create("t", 3, {})
    assert groups.validate_commit("g", -1, "", None) == E.NONE
    assert await groups.commit("g", "t", 0, 1) == E.NONE
    assert groups.validate_commit("g", -1, "", None) == E.NONE
    before = groups.commit("g", "t", 1, 2)  # handed to the cursor, not durable yet
    deleting = asyncio.ensure_future(groups.delete_groups(["g"]))
    await asyncio.sleep(0)  # the deletion is under way
    assert groups.validate_commit("g", -1, "", None) == E.COORDINATOR_NOT_AVAILABLE
    assert (await groups.join(join_req(v4=False))).error == E.COORDINATOR_NOT_AVAILABLE
    assert groups.fetch_all_offsets("g") == {} and groups.list_groups() == []
    assert (await before, await deleting) == (E.NONE, [("g", E.NONE)])
    assert all("g" not in p.ledger.cursors for p in broker.topics.topics["t"].partitions)
    # the client's retry lands after the deletion, in a new group
    assert groups.validate_commit("g", -1, "", None) == E.NONE
    assert await groups.commit("g", "t", 2, 7) == E.NONE
    expected = (["g"], {("t", 2): 7})
    assert visible(groups) == expected
    broker = await brokers.restart(broker)
    assert visible(broker.groups) == expected


async def test_offset_delete_racing_a_commit_of_the_same_partition_deletes_it(brokers):
    broker = await brokers.start()
    groups = broker.groups
    await broker.topics.create("t", 2, {})
    groups.validate_commit("g", -1, "", None)
    assert await groups.commit("g", "t", 0, 1) == E.NONE
    in_flight = groups.commit("g", "t", 1, 5)
    deleted = await groups.delete_offsets("g", [("t", 1)])
    assert (await in_flight, deleted) == (E.NONE, (E.NONE, {("t", 1): E.NONE}))
    assert {tp: c.offset for tp, c in groups.fetch_all_offsets("g").items()} == {("t", 0): 1}
    broker = await brokers.restart(broker)
    assert {tp: c.offset for tp, c in broker.groups.fetch_all_offsets("g").items()} == {("t", 0): 1}


async def test_the_sweep_keeps_a_group_whose_first_commit_is_in_flight(broker):
    groups = broker.groups
    await broker.topics.create("t", 1, {})
    assert groups.validate_commit("g", -1, "", None) == E.NONE
    committing = groups.commit("g", "t", 0, 4)
    groups.sweep()
    assert await committing == E.NONE
    assert [g.group_id for g in groups.list_groups()] == ["g"]
    assert {tp: c.offset for tp, c in groups.fetch_all_offsets("g").items()} == {("t", 0): 4}


async def test_a_full_group_refuses_new_members_but_takes_back_a_static_member(brokers):
    broker = await brokers.start(group_max_size=2)
    groups = broker.groups
    a, ja = await join_new(groups, client="a")
    static = groups.join(join_req(instance="i-1"))
    _, joined = await asyncio.gather(ja, static)
    await asyncio.gather(groups.sync("g", 1, a, None, None, None, {}),
                         groups.sync("g", 1, joined.member_id, "i-1", None, None, {}))
    assert (await groups.join(join_req(client="c"))).error == E.GROUP_MAX_SIZE_REACHED
    assert (await groups.join(join_req(client="c", v4=False))).error == E.GROUP_MAX_SIZE_REACHED
    # a static member restarting takes its own place, which is not a new one
    assert (await groups.join(join_req(instance="i-1"))).error == E.NONE
    groups.leave("g", [(a, None)])
    assert (await groups.join(join_req(client="c"))).error == E.MEMBER_ID_REQUIRED


async def test_position_for_offset_uses_before_first_for_zero(broker):
    topic = await broker.topics.create("t", 1, {})
    from kop.groups.offsets import position_for_offset
    ledger = topic.partitions[0].ledger
    assert position_for_offset(ledger, 0) == BEFORE_FIRST
    assert position_for_offset(ledger, 7) == ledger.last_confirmed  # empty: nothing to point at
    await publish(topic.partitions[0], 2)
    assert position_for_offset(ledger, 1) == position_for_offset(ledger, 2) == ledger.position_of_index(0)
    assert isinstance(position_for_offset(ledger, 2), Position)
