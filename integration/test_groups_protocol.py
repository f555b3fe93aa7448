"""The group APIs on the wire, version by version, against a real kop process with hand-made requests: what
ApiVersions advertises, v0/v1 simple offset commits, multi-group
OffsetFetch, batched FindCoordinator, JoinGroup before and after MEMBER_ID_REQUIRED, batch LeaveGroup by instance id,
DescribeGroups before and after v6, ListGroups filters, and the error codes for reserved and unknown groups."""
import time

import pytest

from integration.idem_raw import RawKafka
from protocol.api import REQUEST_CLASSES as REQ
from protocol.api import RESPONSE_CLASSES as RESP
from protocol.errors import ErrorCode as E

TOPIC = "wire"
SERVED = {8: (0, 9), 9: (0, 9), 10: (0, 6), 11: (0, 9), 12: (0, 4), 13: (0, 5), 14: (0, 5), 15: (0, 6),
          16: (0, 5), 42: (0, 2), 47: (0, 0)}


def call(raw: RawKafka, api_key: int, version: int, **fields):
    return raw.call(REQ[api_key][version](**fields), RESP[api_key], version)


@pytest.fixture
def raw(broker):
    with RawKafka(broker.port) as conn:
        conn.create_topic(TOPIC, 2)
        yield conn


def commit_v(raw, version, group, offset, **extra):
    Req = REQ[8][version]
    Part = Req.OffsetCommitRequestTopic.OffsetCommitRequestPartition
    fields = dict(group_id=group, topics=[Req.OffsetCommitRequestTopic(
        name=TOPIC, partitions=[Part(partition_index=0, committed_offset=offset, committed_metadata="meta",
                                     **({"commit_timestamp": 1234} if version == 1 else {}))])])
    if version >= 1:
        fields.update(generation_id_or_member_epoch=-1, member_id="")
    fields.update(extra)
    return raw.call(Req(**fields), RESP[8], version)


def test_api_versions_advertise_the_group_apis(raw):
    response = call(raw, 18, 3, client_software_name="t", client_software_version="1")
    served = {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}
    assert {k: served.get(k) for k in SERVED} == SERVED


@pytest.mark.parametrize("version", [0, 1, 2, 8])
def test_simple_commit_without_a_group_generation_round_trips(raw, version):
    group = f"simple-v{version}"
    response = commit_v(raw, version, group, 1 + version)
    assert [p.error_code for t in response.topics for p in t.partitions] == [E.NONE]
    Req = REQ[9][1]
    fetched = raw.call(Req(group_id=group, topics=[Req.OffsetFetchRequestTopic(name=TOPIC, partition_indexes=[0, 1])]),
                       RESP[9], 1)
    parts = {p.partition_index: (p.committed_offset, p.metadata, p.error_code) for p in fetched.topics[0].partitions}
    assert parts == {0: (1 + version, "meta", E.NONE), 1: (-1, "", E.NONE)}
    listed = call(raw, 16, 0)
    assert (group, "") in [(g.group_id, g.protocol_type) for g in listed.groups]


def test_offset_fetch_v8_answers_several_groups_and_all_partitions(raw):
    commit_v(raw, 2, "multi-a", 7)
    commit_v(raw, 2, "multi-b", 9)
    Req = REQ[9][8]
    Group = Req.OffsetFetchRequestGroup
    response = raw.call(Req(require_stable=True, groups=[
        Group(group_id="multi-a", topics=None),
        Group(group_id="multi-b", topics=[Group.OffsetFetchRequestTopics(name=TOPIC, partition_indexes=[0, 1])]),
        Group(group_id="nobody", topics=None),
        Group(group_id="pulsar.dedup", topics=None)]), RESP[9], 8)
    got = {g.group_id: (g.error_code, {(t.name, p.partition_index): p.committed_offset
                                       for t in g.topics for p in t.partitions}) for g in response.groups}
    assert got == {"multi-a": (E.NONE, {(TOPIC, 0): 7}),
                   "multi-b": (E.NONE, {(TOPIC, 0): 9, (TOPIC, 1): -1}),
                   "nobody": (E.NONE, {}),
                   "pulsar.dedup": (E.INVALID_GROUP_ID, {})}


def test_reserved_group_ids_are_refused(raw):
    response = commit_v(raw, 8, "pulsar.replicator.x", 1)
    assert [p.error_code for t in response.topics for p in t.partitions] == [E.INVALID_GROUP_ID]
    join = call(raw, 11, 5, group_id="pulsar.dedup", session_timeout_ms=10000, rebalance_timeout_ms=10000,
                member_id="", group_instance_id=None, protocol_type="consumer", protocols=[])
    assert join.error_code == E.INVALID_GROUP_ID


def test_find_coordinator_single_batched_and_by_key_type(broker, raw):
    v0 = call(raw, 10, 0, key="g")
    assert (v0.error_code, v0.node_id, v0.port) == (E.NONE, 1, broker.port)
    txn = call(raw, 10, 3, key="txn-1", key_type=1)
    assert (txn.error_code, txn.port) == (E.NONE, broker.port)
    batched = call(raw, 10, 4, key_type=0, coordinator_keys=["a", "b"])
    assert [(c.key, c.error_code, c.port) for c in batched.coordinators] == [("a", E.NONE, broker.port),
                                                                            ("b", E.NONE, broker.port)]
    share = call(raw, 10, 6, key_type=2, coordinator_keys=["s"])
    assert [c.error_code for c in share.coordinators] == [E.INVALID_REQUEST]


def join(raw, version, group, member_id="", instance=None, protocols=(("range", b"\x00\x00"),), session=10000):
    Req = REQ[11][version]
    fields = dict(group_id=group, session_timeout_ms=session, member_id=member_id, protocol_type="consumer",
                  protocols=[Req.JoinGroupRequestProtocol(name=n, metadata=m) for n, m in protocols])
    if version >= 1:
        fields["rebalance_timeout_ms"] = session
    if version >= 5:
        fields["group_instance_id"] = instance
    return raw.call(Req(**fields), RESP[11], version)


def test_join_v0_then_sync_heartbeat_and_leave(raw):
    joined = join(raw, 0, "old-join")
    assert (joined.error_code, joined.generation_id, joined.leader) == (E.NONE, 1, joined.member_id)
    assert [m.member_id for m in joined.members] == [joined.member_id]
    Sync = REQ[14][0]
    synced = raw.call(Sync(group_id="old-join", generation_id=1, member_id=joined.member_id, assignments=[
        Sync.SyncGroupRequestAssignment(member_id=joined.member_id, assignment=b"mine")]), RESP[14], 0)
    assert (synced.error_code, synced.assignment) == (E.NONE, b"mine")
    assert call(raw, 12, 0, group_id="old-join", generation_id=1, member_id=joined.member_id).error_code == E.NONE
    assert call(raw, 12, 0, group_id="old-join", generation_id=9, member_id=joined.member_id).error_code == \
        E.ILLEGAL_GENERATION
    assert call(raw, 13, 0, group_id="old-join", member_id=joined.member_id).error_code == E.NONE
    assert call(raw, 13, 1, group_id="old-join", member_id=joined.member_id).error_code == E.UNKNOWN_MEMBER_ID
    described = call(raw, 15, 0, groups=["old-join"]).groups[0]
    assert (described.group_state, described.members) == ("Empty", [])


def test_join_v4_asks_for_the_member_id_first(raw):
    first = join(raw, 4, "new-join")
    assert first.error_code == E.MEMBER_ID_REQUIRED and first.member_id
    second = join(raw, 4, "new-join", member_id=first.member_id)
    assert (second.error_code, second.member_id, second.generation_id) == (E.NONE, first.member_id, 1)
    bad = join(raw, 9, "new-join", session=10)
    assert bad.error_code == E.INVALID_SESSION_TIMEOUT


def test_leave_v3_removes_static_members_by_instance_id(broker, raw):
    with RawKafka(broker.port) as other:
        a = join(raw, 5, "statics", instance="i-a")
        assert a.error_code == E.NONE and a.member_id.startswith("i-a-")
        pending_b = other.send(REQ[11][5](group_id="statics", session_timeout_ms=10000, rebalance_timeout_ms=10000,
                                          member_id="", group_instance_id="i-b", protocol_type="consumer",
                                          protocols=[REQ[11][5].JoinGroupRequestProtocol(name="range",
                                                                                         metadata=b"")]))
        time.sleep(0.2)  # b waits in the rebalance for a to rejoin
        rejoined = join(raw, 5, "statics", member_id=a.member_id, instance="i-a")
        b = other.receive(pending_b, RESP[11], 5)
        assert rejoined.generation_id == b.generation_id == 2
    Req = REQ[13][3]
    left = raw.call(Req(group_id="statics", members=[
        Req.MemberIdentity(member_id="", group_instance_id="i-a"),
        Req.MemberIdentity(member_id="someone-else", group_instance_id="i-b"),
        Req.MemberIdentity(member_id="", group_instance_id="i-c")]), RESP[13], 3)
    assert left.error_code == E.NONE
    assert [(m.group_instance_id, m.error_code) for m in left.members] == [
        ("i-a", E.NONE), ("i-b", E.FENCED_INSTANCE_ID), ("i-c", E.UNKNOWN_MEMBER_ID)]


def test_describe_groups_unknown_group_before_and_after_v6(raw):
    old = call(raw, 15, 5, groups=["ghost"], include_authorized_operations=True).groups[0]
    assert (old.error_code, old.group_state) == (E.NONE, "Dead")
    new = call(raw, 15, 6, groups=["ghost"], include_authorized_operations=False).groups[0]
    assert new.error_code == E.GROUP_ID_NOT_FOUND and new.error_message


def test_list_groups_state_and_type_filters(raw):
    commit_v(raw, 2, "empty-one", 1)
    joined = join(raw, 0, "busy-one")
    assert joined.error_code == E.NONE  # CompletingRebalance until it syncs
    states = {g.group_id: g.group_state for g in call(raw, 16, 4, states_filter=[]).groups}
    assert states == {"empty-one": "Empty", "busy-one": "CompletingRebalance"}
    assert [g.group_id for g in call(raw, 16, 4, states_filter=["Empty"]).groups] == ["empty-one"]
    typed = call(raw, 16, 5, states_filter=[], types_filter=["classic"]).groups
    assert sorted((g.group_id, g.group_type) for g in typed) == [("busy-one", "classic"), ("empty-one", "classic")]
    assert call(raw, 16, 5, states_filter=[], types_filter=["consumer"]).groups == []


def test_offset_delete_and_delete_groups_error_codes(raw):
    Req = REQ[47][0]
    missing = raw.call(Req(group_id="nobody", topics=[Req.OffsetDeleteRequestTopic(
        name=TOPIC, partitions=[Req.OffsetDeleteRequestTopic.OffsetDeleteRequestPartition(partition_index=0)])]),
        RESP[47], 0)
    assert missing.error_code == E.GROUP_ID_NOT_FOUND
    commit_v(raw, 2, "doomed", 3)
    commit_v(raw, 2, "emptied", 3)
    deleted = raw.call(Req(group_id="emptied", topics=[Req.OffsetDeleteRequestTopic(
        name=TOPIC, partitions=[Req.OffsetDeleteRequestTopic.OffsetDeleteRequestPartition(partition_index=0)])]),
        RESP[47], 0)
    assert (deleted.error_code, deleted.topics[0].partitions[0].error_code) == (E.NONE, E.NONE)
    # as in Kafka, a group whose last offset was deleted is gone at once
    results = call(raw, 42, 2, groups_names=["doomed", "doomed", "emptied", "pulsar.dedup"]).results
    assert [(r.group_id, r.error_code) for r in results] == [
        ("doomed", E.NONE), ("doomed", E.GROUP_ID_NOT_FOUND), ("emptied", E.GROUP_ID_NOT_FOUND),
        ("pulsar.dedup", E.INVALID_GROUP_ID)]


def test_every_acknowledged_commit_survives_kill_9_in_the_middle_of_a_commit_stream(broker):
    """Commits pipelined for many groups; the broker is killed right after some of them were acknowledged. After the
    restart every group reads back its last acknowledged offset or a later one it sent, never an earlier one."""
    groups = [f"stream-{i}" for i in range(20)]
    sent: dict[str, list[int]] = {g: [] for g in groups}
    acked: dict[str, int] = {}
    with RawKafka(broker.port) as conn:
        conn.create_topic(TOPIC, 2)
        pending = []
        for offset in range(1, 31):
            for group in groups:
                Req = REQ[8][8]
                Part = Req.OffsetCommitRequestTopic.OffsetCommitRequestPartition
                cid = conn.send(Req(group_id=group, generation_id_or_member_epoch=-1, member_id="",
                                    topics=[Req.OffsetCommitRequestTopic(name=TOPIC, partitions=[
                                        Part(partition_index=0, committed_offset=offset, committed_metadata="")])]))
                sent[group].append(offset)
                pending.append((cid, group, offset))
        for cid, group, offset in pending[:400]:  # two thirds acknowledged, the rest still in flight
            response = conn.receive(cid, RESP[8], 8)
            assert response.topics[0].partitions[0].error_code == E.NONE
            acked[group] = offset
        broker.kill()
    broker.start()
    with RawKafka(broker.port) as conn:
        Req = REQ[9][8]
        fetched = conn.call(Req(groups=[Req.OffsetFetchRequestGroup(group_id=g, topics=None) for g in groups]),
                            RESP[9], 8)
    for group in fetched.groups:
        (offset,) = [p.committed_offset for t in group.topics for p in t.partitions]
        assert offset >= acked[group.group_id] and offset in sent[group.group_id], (group.group_id, offset)


@pytest.mark.slow  # 5-13 s of restarts, retention or snapshot rounds: make test-slow
def test_generation_ids_keep_rising_across_kill_9(broker):
    """Kafka keeps a group's generation in __consumer_offsets; kop keeps it in its generation log. A member of a
    pre-crash generation must not be mistaken for a member of the new one, so ids never repeat after a restart."""
    Sync = REQ[14][0]
    with RawKafka(broker.port) as conn:
        conn.create_topic(TOPIC, 2)
        for expected in (1, 2):  # two stable generations: a join, then a rejoin of the same member
            joined = join(conn, 0, "gen-crash", member_id="" if expected == 1 else joined.member_id)
            assert (joined.error_code, joined.generation_id) == (E.NONE, expected)
            synced = conn.call(Sync(group_id="gen-crash", generation_id=expected, member_id=joined.member_id,
                                    assignments=[Sync.SyncGroupRequestAssignment(member_id=joined.member_id,
                                                                                 assignment=b"a")]), RESP[14], 0)
            assert synced.error_code == E.NONE
        old_member = joined.member_id
        broker.kill()
    broker.start()
    with RawKafka(broker.port) as conn:
        rejoined = join(conn, 0, "gen-crash")
        assert (rejoined.error_code, rejoined.generation_id) == (E.NONE, 3)
        assert rejoined.member_id != old_member
        synced = conn.call(Sync(group_id="gen-crash", generation_id=3, member_id=rejoined.member_id,
                                assignments=[Sync.SyncGroupRequestAssignment(member_id=rejoined.member_id,
                                                                             assignment=b"a")]), RESP[14], 0)
        assert synced.error_code == E.NONE
        stale = commit_v(conn, 2, "gen-crash", 5, generation_id_or_member_epoch=2, member_id=old_member)
        assert [p.error_code for t in stale.topics for p in t.partitions] == [E.UNKNOWN_MEMBER_ID]
