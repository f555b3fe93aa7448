"""KIP-848's consumer group protocol on the wire, with hand-made ConsumerGroupHeartbeat requests against a real kop
process: joining and the epochs, the reconciliation (a partition is given to its new member only after its previous
owner reported it revoked), fencing (FENCED_MEMBER_EPOCH, UNKNOWN_MEMBER_ID), static members (epoch -2 and
UNRELEASED_INSTANCE_ID), both assignors, new partitions picked up, member epochs on OffsetCommit/OffsetFetch, and
classic and consumer-protocol groups side by side (their migration: test_groups_migration_protocol)."""
import time
import uuid

import pytest
from kafka.protocol.consumer.metadata import ConsumerProtocolAssignment, ConsumerProtocolSubscription

from integration.idem_raw import RawKafka, plain_batch
from protocol.api import REQUEST_CLASSES as REQ
from protocol.api import RESPONSE_CLASSES as RESP
from protocol.errors import ErrorCode as E

TOPIC = "kip848"
HB = 68
HB_V = 1


@pytest.fixture
def raw(broker_factory):
    broker = broker_factory({"group.consumer.session.timeout.ms": "2000",
                             "group.consumer.heartbeat.interval.ms": "500"})
    with RawKafka(broker.port) as conn:
        conn.create_topic(TOPIC, 4)
        yield conn


class Member:
    """One consumer-protocol member driven by hand: it remembers its id, epoch and what it owns."""

    def __init__(self, raw: RawKafka, group: str, instance_id: str | None = None, assignor: str | None = None,
                 topics: tuple[str, ...] = (TOPIC,)) -> None:
        self.raw, self.group, self.instance_id, self.assignor, self.topics = raw, group, instance_id, assignor, topics
        self.member_id = str(uuid.uuid4())
        self.epoch = 0
        self.owned: dict[str, list[int]] = {}
        self.topic_ids: dict[str, uuid.UUID] = {}

    def heartbeat(self, epoch: int | None = None, owned: dict[str, list[int]] | None = None, **extra):
        Req = REQ[HB][HB_V]
        epoch = self.epoch if epoch is None else epoch
        owned = self.owned if owned is None else owned
        fields = dict(group_id=self.group, member_id=self.member_id, member_epoch=epoch,
                      instance_id=self.instance_id, rebalance_timeout_ms=5000,
                      subscribed_topic_names=list(self.topics), server_assignor=self.assignor,
                      topic_partitions=[Req.TopicPartitions(topic_id=self._id(t), partitions=p)
                                        for t, p in owned.items() if p])
        fields.update(extra)
        response = self.raw.call(Req(**fields), RESP[HB], HB_V)
        if response.error_code == E.NONE and epoch >= 0:
            self.epoch = response.member_epoch
            if response.assignment is not None:  # the client gives up what it lost at once
                self._learn_ids()
                names = {v: k for k, v in self.topic_ids.items()}
                self.owned = {names[tp.topic_id]: sorted(tp.partitions)
                              for tp in response.assignment.topic_partitions}
        return response

    def _learn_ids(self) -> None:
        Req = REQ[3][12]
        meta = self.raw.call(Req(topics=None, allow_auto_topic_creation=False), RESP[3], 12)
        self.topic_ids = {t.name: t.topic_id for t in meta.topics}

    def _id(self, topic: str) -> uuid.UUID:
        if topic not in self.topic_ids:
            self._learn_ids()
        return self.topic_ids[topic]

    def join(self):
        self.epoch = 0
        self.owned = {}
        return self.heartbeat(epoch=0)

    def partitions(self) -> set[tuple[str, int]]:
        return {(t, p) for t, ps in self.owned.items() for p in ps}


def settle(members: list[Member], rounds: int = 8) -> None:
    for _ in range(rounds):
        for m in members:
            assert m.heartbeat().error_code == E.NONE


def test_api_versions_list_the_consumer_group_apis(raw):
    response = raw.call(REQ[18][3](client_software_name="t", client_software_version="1"), RESP[18], 3)
    served = {k.api_key: (k.min_version, k.max_version) for k in response.api_keys}
    assert served[68] == (0, 1) and served[69] == (0, 1)


def test_a_partition_moves_only_after_its_owner_revoked_it(raw):
    a = Member(raw, "g-reconcile")
    joined = a.join()
    assert joined.error_code == E.NONE and joined.member_epoch == 1 and joined.heartbeat_interval_ms == 500
    assert a.partitions() == {(TOPIC, p) for p in range(4)}
    b = Member(raw, "g-reconcile")
    b_join = b.join()
    assert b_join.member_epoch == 2 and b.partitions() == set()  # every target partition is still a's
    # a learns what it keeps, but still reports owning all four (its revocation is not done): it keeps epoch 1
    kept = a.heartbeat(owned={TOPIC: list(range(4))})
    assert kept.member_epoch == 1 and len(a.partitions()) == 2
    still = a.heartbeat(owned={TOPIC: list(range(4))})
    assert still.member_epoch == 1
    assert b.heartbeat().error_code == E.NONE and b.partitions() == set()  # a still holds b's share
    moved = a.heartbeat()  # now it reports only what it kept: it moves to epoch 2
    assert moved.member_epoch == 2
    assert b.heartbeat().member_epoch == 2
    assert len(b.partitions()) == 2 and not b.partitions() & a.partitions()
    assert a.partitions() | b.partitions() == {(TOPIC, p) for p in range(4)}
    described = raw.call(REQ[69][1](group_ids=["g-reconcile"], include_authorized_operations=False), RESP[69], 1)
    group = described.groups[0]
    assert (group.error_code, group.group_state, group.group_epoch, group.assignor_name) == \
        (E.NONE, "Stable", 2, "uniform")
    assert sorted(len(m.assignment.topic_partitions[0].partitions) for m in group.members) == [2, 2]


def test_epoch_fencing_and_unknown_members(raw):
    a = Member(raw, "g-fence")
    a.join()
    assert a.heartbeat(epoch=a.epoch + 1).error_code == E.FENCED_MEMBER_EPOCH
    rejoined = a.join()  # a fenced member rejoins with epoch 0 and its id, owning nothing
    assert (rejoined.error_code, rejoined.member_epoch) == (E.NONE, 1) and len(a.partitions()) == 4
    b = Member(raw, "g-fence")
    b.join()
    a.heartbeat(owned={})
    assert a.heartbeat(epoch=a.epoch + 5).error_code == E.FENCED_MEMBER_EPOCH
    stranger = Member(raw, "g-fence")
    assert stranger.heartbeat(epoch=3).error_code == E.UNKNOWN_MEMBER_ID
    assert stranger.heartbeat(epoch=-1).error_code == E.UNKNOWN_MEMBER_ID
    assert Member(raw, "g-nowhere").heartbeat(epoch=1).error_code == E.UNKNOWN_MEMBER_ID
    invalid = Member(raw, "g-fence").heartbeat(epoch=0, rebalance_timeout_ms=-1)
    assert invalid.error_code == E.INVALID_REQUEST
    assert Member(raw, "").heartbeat(epoch=0).error_code == E.INVALID_REQUEST
    unsupported = Member(raw, "g-fence", assignor="sticky").heartbeat(epoch=0)
    assert unsupported.error_code == E.UNSUPPORTED_ASSIGNOR


def test_a_member_that_stops_heartbeating_is_removed_and_its_partitions_go_to_the_others(raw):
    a, b = Member(raw, "g-session"), Member(raw, "g-session")
    a.join()
    b.join()
    settle([a, b])
    assert len(a.partitions()) == 2
    deadline = time.monotonic() + 10
    while len(a.partitions()) < 4 and time.monotonic() < deadline:  # b is silent: its session (2 s) runs out
        assert a.heartbeat().error_code == E.NONE
        time.sleep(0.3)
    assert a.partitions() == {(TOPIC, p) for p in range(4)}
    assert b.heartbeat().error_code == E.UNKNOWN_MEMBER_ID  # control: b was removed, not a's view alone


def test_a_static_member_that_leaves_for_now_gets_its_partitions_back(raw):
    a, b = Member(raw, "g-static", instance_id="i-a"), Member(raw, "g-static", instance_id="i-b")
    a.join()
    b.join()
    settle([a, b])
    mine = b.partitions()
    assert len(mine) == 2
    impostor = Member(raw, "g-static", instance_id="i-b")
    assert impostor.join().error_code == E.UNRELEASED_INSTANCE_ID
    assert b.heartbeat(epoch=-2).member_epoch == -2
    settle([a], rounds=3)
    assert len(a.partitions()) == 2  # b's partitions wait for it
    back = Member(raw, "g-static", instance_id="i-b")
    assert back.join().error_code == E.NONE
    assert back.partitions() == mine
    assert b.heartbeat().error_code == E.UNKNOWN_MEMBER_ID  # the old member id is gone


@pytest.mark.parametrize("assignor,expected", [("range", [{0, 1}, {2, 3}]), ("uniform", None)])
def test_assignors_and_new_partitions(raw, assignor, expected):
    group = f"g-{assignor}"
    a, b = Member(raw, group, assignor=assignor), Member(raw, group, assignor=assignor)
    a.join()
    b.join()
    settle([a, b])
    got = sorted(({p for _, p in m.partitions()} for m in (a, b)), key=min)
    if expected is not None:
        first = min((a, b), key=lambda m: m.member_id)
        assert {p for _, p in first.partitions()} == {0, 1}
        assert got == expected
    assert sorted(len(s) for s in got) == [2, 2]
    Req = REQ[37][3]
    grown = raw.call(Req(topics=[Req.CreatePartitionsTopic(name=TOPIC, count=6, assignments=None)],
                         timeout_ms=5000, validate_only=False), RESP[37], 3)
    assert grown.results[0].error_code == E.NONE
    settle([a, b])
    assert a.partitions() | b.partitions() == {(TOPIC, p) for p in range(6)}
    assert sorted(len(m.partitions()) for m in (a, b)) == [3, 3]


def test_the_brokers_assignors_setting_names_the_default_and_the_assignors_members_may_ask_for(broker_factory):
    broker = broker_factory({"group.consumer.assignors": "range"})  # range alone: the default, and the only one
    with RawKafka(broker.port) as conn:
        conn.create_topic(TOPIC, 4)
        a, b = Member(conn, "g-default"), Member(conn, "g-default")
        a.join()
        b.join()
        settle([a, b])
        first = min((a, b), key=lambda m: m.member_id)
        assert {p for _, p in first.partitions()} == {0, 1}  # range's contiguous share, without asking for it
        described = conn.call(REQ[69][1](group_ids=["g-default"], include_authorized_operations=False), RESP[69], 1)
        assert described.groups[0].assignor_name == "range"
        refused = Member(conn, "g-other", assignor="uniform").join()  # not one the broker offers
        assert (refused.error_code, refused.error_message) == \
            (E.UNSUPPORTED_ASSIGNOR, "ServerAssignor uniform is not supported. Supported assignors: range.")


def test_offset_commit_and_fetch_check_the_member_epoch(raw):
    a = Member(raw, "g-commit")
    a.join()
    Req = REQ[8][9]
    Part = Req.OffsetCommitRequestTopic.OffsetCommitRequestPartition

    def commit(member_id, epoch):
        response = raw.call(Req(group_id="g-commit", generation_id_or_member_epoch=epoch, member_id=member_id,
                                topics=[Req.OffsetCommitRequestTopic(name=TOPIC, partitions=[
                                    Part(partition_index=0, committed_offset=7, committed_metadata="")])]),
                            RESP[8], 9)
        return response.topics[0].partitions[0].error_code

    assert commit(a.member_id, a.epoch + 1) == E.STALE_MEMBER_EPOCH
    assert commit("nobody", a.epoch) == E.UNKNOWN_MEMBER_ID
    assert commit("", -1) == E.UNKNOWN_MEMBER_ID  # not from outside while it has members
    assert commit(a.member_id, a.epoch) == E.NONE
    Fetch = REQ[9][9]
    Group = Fetch.OffsetFetchRequestGroup

    def fetch(member_id, epoch):
        response = raw.call(Fetch(groups=[Group(group_id="g-commit", member_id=member_id, member_epoch=epoch,
                                                topics=[Group.OffsetFetchRequestTopics(name=TOPIC,
                                                                                       partition_indexes=[0])])],
                                  require_stable=False), RESP[9], 9)
        return response.groups[0]

    assert fetch(a.member_id, a.epoch + 1).error_code == E.STALE_MEMBER_EPOCH
    ok = fetch(a.member_id, a.epoch)
    assert ok.error_code == E.NONE and ok.topics[0].partitions[0].committed_offset == 7
    assert fetch(None, -1).topics[0].partitions[0].committed_offset == 7  # an admin client's fetch


def test_classic_and_consumer_protocol_groups_share_the_group_ids(raw):
    """A group id is one kind or the other; online migration (test_groups_migration_protocol) changes the kind of a
    group with members, the offline migration that of an empty one."""
    a = Member(raw, "g-kind")
    a.join()
    Join = REQ[11][7]
    beat = raw.call(REQ[12][4](group_id="g-kind", generation_id=1, member_id="m", group_instance_id=None),
                    RESP[12], 4)
    assert beat.error_code == E.UNKNOWN_MEMBER_ID
    listed = raw.call(REQ[16][5](states_filter=[], types_filter=["consumer"]), RESP[16], 5)
    assert [(g.group_id, g.group_type, g.group_state) for g in listed.groups] == [("g-kind", "consumer", "Stable")]
    classic = raw.call(REQ[15][5](groups=["g-kind"], include_authorized_operations=False), RESP[15], 5).groups[0]
    assert (classic.protocol_type, classic.protocol_data, len(classic.members)) == ("consumer", "uniform", 1)
    # the member's subscription and partitions in the classic encoding, as a classic member's would read (before, a
    # second version header made both unreadable)
    described = classic.members[0]
    assert ConsumerProtocolSubscription.decode(described.member_metadata).topics == [TOPIC]
    assert sorted(p for _, p in ConsumerProtocolAssignment.decode(described.member_assignment).partitions()) == \
        [0, 1, 2, 3]
    # a classic group whose member's subscription is not the consumer protocol's cannot become a consumer group
    join = raw.call(Join(group_id="g-classic", session_timeout_ms=10000, rebalance_timeout_ms=10000,
                         member_id="", group_instance_id=None, protocol_type="consumer",
                         protocols=[Join.JoinGroupRequestProtocol(name="range", metadata=b"")]), RESP[11], 7)
    join = raw.call(Join(group_id="g-classic", session_timeout_ms=10000, rebalance_timeout_ms=10000,
                         member_id=join.member_id, group_instance_id=None, protocol_type="consumer",
                         protocols=[Join.JoinGroupRequestProtocol(name="range", metadata=b"")]), RESP[11], 7)
    assert join.error_code == E.NONE
    refused = Member(raw, "g-classic").join()
    assert refused.error_code == E.GROUP_ID_NOT_FOUND and "Cannot upgrade" in refused.error_message
    described = raw.call(REQ[69][0](group_ids=["g-classic", "g-none"], include_authorized_operations=False),
                         RESP[69], 0)
    assert [g.error_code for g in described.groups] == [E.GROUP_ID_NOT_FOUND, E.GROUP_ID_NOT_FOUND]
    # the last member leaves: the empty group becomes a classic one when a classic member joins
    assert a.heartbeat(epoch=-1).error_code == E.NONE
    join = raw.call(Join(group_id="g-kind", session_timeout_ms=10000, rebalance_timeout_ms=10000, member_id="",
                         group_instance_id=None, protocol_type="consumer",
                         protocols=[Join.JoinGroupRequestProtocol(name="range", metadata=b"")]), RESP[11], 7)
    assert join.error_code == E.MEMBER_ID_REQUIRED
    listed = raw.call(REQ[16][5](states_filter=[], types_filter=["classic"]), RESP[16], 5)
    assert sorted(g.group_id for g in listed.groups) == ["g-classic", "g-kind"]


def test_metrics_and_topic_stats_show_a_consumer_group(start_broker):
    import json
    from integration.test_metrics import get, sample, scrape
    broker = start_broker()
    with RawKafka(broker.port) as conn:
        conn.create_topic(TOPIC, 4)
        a, b = Member(conn, "g-metrics"), Member(conn, "g-metrics")
        a.join()
        b.join()
        conn.produce(TOPIC, 0, plain_batch([b"x"] * 5))
        Req = REQ[8][9]
        committed = conn.call(Req(group_id="g-metrics", generation_id_or_member_epoch=a.epoch, member_id=a.member_id,
                                  group_instance_id=None, topics=[Req.OffsetCommitRequestTopic(name=TOPIC, partitions=[
                                      Req.OffsetCommitRequestTopic.OffsetCommitRequestPartition(
                                          partition_index=0, committed_offset=2, committed_leader_epoch=-1,
                                          committed_metadata="")])]), RESP[8], 9)
        assert committed.topics[0].partitions[0].error_code == E.NONE
    samples = scrape(broker)
    assert sample(samples, "kop_consumer_group_rebalances_total", group="g-metrics") == 2
    # a consumer-protocol group's offsets and lag are shown as a classic group's are (before, they were left out)
    labels = dict(group="g-metrics", topic=TOPIC, partition="0")
    assert sample(samples, "kop_consumer_group_committed_offset", **labels) == 2
    assert sample(samples, "kop_consumer_group_lag", **labels) == 3
    status, body = get(broker, f"/admin/v2/persistent/public/default/{TOPIC}-partition-0/stats")
    assert status == 200
    subscription = json.loads(body)["subscriptions"]["g-metrics"]  # `kop admin topics stats` lists it
    assert (subscription["committedOffset"], subscription["msgBacklog"]) == (2, 3)
