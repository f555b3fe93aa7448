"""Online migration between the classic and the consumer group protocols (Kafka 4's
`group.consumer.migration.policy`) on the wire, with hand-made requests against a real kop process: classic members
served by a consumer group (JoinGroup answered at once with the member epoch, SyncGroup with the server's assignment,
Heartbeat asking for a rejoin), the upgrade of a classic group with members when a consumer-protocol member joins,
the downgrade when the last one leaves or times out, the policies that refuse them, and consumer groups' members
restored across a broker restart. After every step no partition is owned by two members."""
import threading
import time

import pytest
from kafka.protocol.consumer.metadata import ConsumerProtocolAssignment, ConsumerProtocolSubscription

from integration.idem_raw import RawKafka
from integration.test_groups_consumer_protocol import TOPIC, Member, settle
from protocol.api import REQUEST_CLASSES as REQ
from protocol.api import RESPONSE_CLASSES as RESP
from protocol.errors import ErrorCode as E

ALL = {(TOPIC, p) for p in range(4)}
FAST = {"group.consumer.session.timeout.ms": "2000", "group.consumer.heartbeat.interval.ms": "500",
        "group.min.session.timeout.ms": "1000"}


@pytest.fixture
def kip848(broker_factory):
    def start(name: str = "data", **config: str):
        broker = broker_factory({**FAST, **config}, name=name)
        conn = RawKafka(broker.port)
        conn.create_topic(TOPIC, 4)
        return broker, conn
    return start


@pytest.fixture
def raw(kip848):
    broker, conn = kip848()
    with conn:
        yield conn


class ClassicMember:
    """A classic consumer driven by hand (JoinGroup v7, SyncGroup v5, Heartbeat v4, LeaveGroup v4). Eager, it gives
    up every partition before it rejoins (its subscription is version 0); cooperative, it keeps its partitions and
    lists them in its subscription (version 1), and gives up only what SyncGroup no longer assigns it."""

    def __init__(self, raw: RawKafka, group: str, protocols: tuple[str, ...] = ("range",),
                 instance_id: str | None = None, cooperative: bool = False, session_timeout_ms: int = 10_000):
        self.raw, self.group, self.protocols, self.instance_id = raw, group, protocols, instance_id
        self.cooperative, self.session_timeout_ms = cooperative, session_timeout_ms
        self.member_id, self.generation, self.protocol_name = "", -1, None
        self.owned: set[tuple[str, int]] = set()

    def subscription(self) -> bytes:
        if not self.cooperative:
            return ConsumerProtocolSubscription(version=0, topics=[TOPIC], user_data=None).encode()
        owned = [ConsumerProtocolSubscription.TopicPartition(topic=TOPIC, partitions=sorted(p for _, p in self.owned))]
        return ConsumerProtocolSubscription(version=1, topics=[TOPIC], user_data=None,
                                            owned_partitions=owned if self.owned else []).encode()

    def join(self, metadata: bytes | None = None):
        if not self.cooperative:
            self.owned = set()  # an eager consumer revokes everything first
        Join = REQ[11][7]
        protocols = [Join.JoinGroupRequestProtocol(name=name, metadata=metadata if metadata is not None
                                                   else self.subscription()) for name in self.protocols]
        for _ in range(2):
            response = self.raw.call(Join(group_id=self.group, session_timeout_ms=self.session_timeout_ms,
                                          rebalance_timeout_ms=10_000, member_id=self.member_id,
                                          group_instance_id=self.instance_id, protocol_type="consumer",
                                          protocols=protocols), RESP[11], 7)
            if response.error_code != E.MEMBER_ID_REQUIRED:
                break
            self.member_id = response.member_id
        if response.error_code == E.NONE:
            self.member_id, self.generation = response.member_id, response.generation_id
            self.protocol_name = response.protocol_name
        return response

    def sync(self, assignments: dict[str, bytes] | None = None):
        Sync = REQ[14][5]
        response = self.raw.call(Sync(
            group_id=self.group, generation_id=self.generation, member_id=self.member_id,
            group_instance_id=self.instance_id, protocol_type="consumer", protocol_name=self.protocol_name,
            assignments=[Sync.SyncGroupRequestAssignment(member_id=m, assignment=a)
                         for m, a in (assignments or {}).items()]), RESP[14], 5)
        if response.error_code == E.NONE:
            assigned = ConsumerProtocolAssignment.decode(response.assignment) if response.assignment else None
            self.owned = {(tp.topic, p) for tp in (assigned.assigned_partitions if assigned else []) for p in
                          tp.partitions}
        return response

    def heartbeat(self) -> int:
        return self.raw.call(REQ[12][4](group_id=self.group, generation_id=self.generation,
                                        member_id=self.member_id, group_instance_id=self.instance_id),
                             RESP[12], 4).error_code

    def rejoin(self) -> None:
        assert self.join().error_code == E.NONE
        assert self.sync().error_code == E.NONE

    def leave(self):
        Leave = REQ[13][4]
        return self.raw.call(Leave(group_id=self.group, members=[
            Leave.MemberIdentity(member_id=self.member_id, group_instance_id=self.instance_id)]), RESP[13], 4)

    def partitions(self) -> set[tuple[str, int]]:
        return set(self.owned)


def no_partition_shared(*members) -> None:
    seen: dict[tuple[str, int], object] = {}
    for m in members:
        for tp in m.partitions():
            assert tp not in seen, f"{tp} owned by two members"
            seen[tp] = m


def group_type(raw: RawKafka, group: str) -> tuple[str, str] | None:
    listed = raw.call(REQ[16][5](states_filter=[], types_filter=[]), RESP[16], 5)
    return next(((g.group_type, g.group_state) for g in listed.groups if g.group_id == group), None)


def describe(raw: RawKafka, group: str):
    return raw.call(REQ[69][1](group_ids=[group], include_authorized_operations=False), RESP[69], 1).groups[0]


def classic_rounds(members: list[ClassicMember], consumers: list[Member], rounds: int = 6) -> None:
    """Heartbeat everyone; a classic member told to rebalance rejoins (as the clients do); check ownership."""
    for _ in range(rounds):
        for c in consumers:
            assert c.heartbeat().error_code == E.NONE
        for m in members:
            error = m.heartbeat()
            if error in (E.REBALANCE_IN_PROGRESS, E.ILLEGAL_GENERATION):
                m.rejoin()
            else:
                assert error == E.NONE
        no_partition_shared(*members, *consumers)


def test_a_classic_member_joins_a_consumer_group_and_is_assigned_by_the_server(raw):
    a = Member(raw, "g-mixed")
    assert a.join().member_epoch == 1 and a.partitions() == ALL
    c = ClassicMember(raw, "g-mixed")
    joined = c.join()
    # answered at once: never the leader, its epoch as the generation, the member's first protocol
    assert (joined.error_code, joined.generation_id, joined.leader, joined.members, joined.protocol_name) == \
        (E.NONE, 2, "", [], "range")
    assert c.sync().error_code == E.NONE and c.partitions() == set()  # a still holds every partition
    assert c.heartbeat() == E.NONE  # nothing to fetch yet: it waits
    a.heartbeat(owned={TOPIC: [0, 1, 2, 3]})  # a learns it keeps two, still owns four
    assert c.heartbeat() == E.NONE
    assert a.heartbeat().member_epoch == 2  # a reports the two revoked
    assert c.heartbeat() == E.REBALANCE_IN_PROGRESS  # its partitions are free: rejoin to get them
    c.rejoin()
    assert c.generation == 2 and len(c.partitions()) == 2
    no_partition_shared(a, c)
    assert a.partitions() | c.partitions() == ALL
    assert c.heartbeat() == E.NONE
    assert group_type(raw, "g-mixed") == ("consumer", "Stable")
    described = describe(raw, "g-mixed")
    assert sorted((m.member_type, len(m.assignment.topic_partitions[0].partitions)) for m in described.members) == \
        [(0, 2), (1, 2)]  # 0: a classic member, 1: a consumer-protocol member
    # DescribeGroups shows each member's subscription and partitions in the classic encoding
    classic_view = raw.call(REQ[15][5](groups=["g-mixed"], include_authorized_operations=False), RESP[15], 5)
    for m in classic_view.groups[0].members:
        assert ConsumerProtocolSubscription.decode(m.member_metadata).topics == [TOPIC]
        assert len(ConsumerProtocolAssignment.decode(m.member_assignment).partitions()) == 2


def test_a_classic_member_in_a_consumer_group_gets_kafkas_answers(raw):
    a = Member(raw, "g-errors")
    a.join()
    c = ClassicMember(raw, "g-errors")
    c.join()
    assert c.sync().error_code == E.NONE
    generation = c.generation
    c.generation = generation + 1
    assert c.heartbeat() == E.ILLEGAL_GENERATION
    assert c.sync().error_code == E.ILLEGAL_GENERATION
    c.generation = generation
    beat = raw.call(REQ[12][4](group_id="g-errors", generation_id=a.epoch, member_id=a.member_id,
                               group_instance_id=None), RESP[12], 4)
    assert beat.error_code == E.UNKNOWN_MEMBER_ID  # a consumer-protocol member is no classic member
    assert ClassicMember(raw, "g-errors", protocols=("roundrobin",)).join().error_code == \
        E.INCONSISTENT_GROUP_PROTOCOL  # not a protocol every classic member supports
    assert ClassicMember(raw, "g-errors").join(metadata=b"\x00\x00\x00").error_code == E.INCONSISTENT_GROUP_PROTOCOL
    def commit(version: int, member_id: str, generation: int) -> int:
        Req = REQ[8][version]
        request = Req(group_id="g-errors", generation_id_or_member_epoch=generation, member_id=member_id,
                      group_instance_id=None, topics=[Req.OffsetCommitRequestTopic(name=TOPIC, partitions=[
                          Req.OffsetCommitRequestTopic.OffsetCommitRequestPartition(
                              partition_index=0, committed_offset=0, committed_leader_epoch=-1,
                              committed_metadata="")])])
        return raw.call(request, RESP[8], version).topics[0].partitions[0].error_code
    assert commit(8, c.member_id, c.generation) == E.NONE
    assert commit(8, c.member_id, c.generation - 1) == E.ILLEGAL_GENERATION  # a classic member's generation
    assert commit(9, a.member_id, a.epoch - 1) == E.STALE_MEMBER_EPOCH
    assert commit(8, a.member_id, a.epoch) == E.UNSUPPORTED_VERSION  # a consumer-protocol member commits with v9
    assert c.leave().members[0].error_code == E.NONE
    assert c.heartbeat() == E.UNKNOWN_MEMBER_ID
    assert a.heartbeat().member_epoch == 3 and a.partitions() == ALL  # the leave moved the group on


def test_a_classic_group_with_members_becomes_a_consumer_group_when_a_consumer_member_joins(kip848):
    """The online upgrade: the classic members keep their partitions until they rejoin, so the newcomer never gets
    a partition a classic member still consumes; then the partitions spread over all three."""
    broker, raw = kip848()
    with raw, RawKafka(broker.port) as other:
        upgrade_with_members(raw, other)


def upgrade_with_members(raw: RawKafka, other: RawKafka) -> None:
    c1, c2 = ClassicMember(raw, "g-up"), ClassicMember(other, "g-up")
    classic_two_member_generation(c1, c2)
    assert group_type(raw, "g-up") == ("classic", "Stable")
    a = Member(raw, "g-up")
    joined = a.join()
    assert joined.error_code == E.NONE and joined.member_epoch == c1.generation + 1
    assert a.partitions() == set(), "the newcomer got partitions the classic members still own"
    assert group_type(raw, "g-up") == ("consumer", "Reconciling")
    no_partition_shared(c1, c2, a)
    classic_rounds([c1, c2], [a])
    for _ in range(4):
        a.heartbeat()
        no_partition_shared(c1, c2, a)
    assert c1.partitions() | c2.partitions() | a.partitions() == ALL
    assert sorted(len(m.partitions()) for m in (c1, c2, a)) == [1, 1, 2]
    assert group_type(raw, "g-up") == ("consumer", "Stable")


def assignment(partitions: set[tuple[str, int]]) -> bytes:
    return ConsumerProtocolAssignment(version=0, user_data=None, assigned_partitions=[
        ConsumerProtocolAssignment.TopicPartition(topic=TOPIC, partitions=sorted(p for _, p in partitions))]
        if partitions else []).encode()


def classic_two_member_generation(c1: ClassicMember, c2: ClassicMember) -> None:
    """A classic group led by c1 with every partition, then c2 (on a connection of its own) joins: both rejoin and
    c1 assigns two partitions each."""
    assert c1.join().error_code == E.NONE  # the leader of a generation of one
    assert c1.sync({c1.member_id: assignment(ALL)}).error_code == E.NONE and c1.partitions() == ALL
    answers = {}
    joiner = threading.Thread(target=lambda: answers.setdefault("c2", c2.join()))
    joiner.start()
    deadline = time.monotonic() + 10
    while c1.heartbeat() != E.REBALANCE_IN_PROGRESS:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    leader = c1.join()
    joiner.join(10)
    assert leader.error_code == answers["c2"].error_code == E.NONE and leader.leader == c1.member_id
    halves = {c1.member_id: {(TOPIC, 0), (TOPIC, 1)}, c2.member_id: {(TOPIC, 2), (TOPIC, 3)}}
    syncer = threading.Thread(target=lambda: answers.setdefault("sync", c2.sync()))
    syncer.start()
    assert c1.sync({m: assignment(p) for m, p in halves.items()}).error_code == E.NONE
    syncer.join(10)
    assert answers["sync"].error_code == E.NONE
    assert c1.partitions() == halves[c1.member_id] and c2.partitions() == halves[c2.member_id]


def test_the_upgrade_is_refused_with_migration_disabled_but_classic_members_still_join_consumer_groups(kip848):
    broker, raw = kip848(**{"group.consumer.migration.policy": "disabled"})
    with raw:
        c = ClassicMember(raw, "g-classic")
        c.join()
        assert c.sync({c.member_id: assignment(ALL)}).error_code == E.NONE
        refused = Member(raw, "g-classic").join()
        assert (refused.error_code, refused.error_message) == \
            (E.GROUP_ID_NOT_FOUND, "Cannot upgrade classic group g-classic to consumer group because the online "
                                   "upgrade is disabled.")
        assert group_type(raw, "g-classic") == ("classic", "Stable") and c.heartbeat() == E.NONE
        # classic members join a consumer group under every policy (Kafka 4 serves mixed groups)
        a = Member(raw, "g-consumer")
        a.join()
        assert ClassicMember(raw, "g-consumer").join().error_code == E.NONE
        # and the last consumer-protocol member leaving does not make it a classic group
        assert a.heartbeat(epoch=-1).error_code == E.NONE
        assert group_type(raw, "g-consumer") == ("consumer", "Reconciling")


def test_a_heartbeat_that_cannot_join_leaves_the_classic_group_as_it_was(kip848):
    """As in Kafka, where a refused join writes nothing: a full group, or a request no group accepts."""
    broker, raw = kip848(**{"group.max.size": "2"})
    with raw, RawKafka(broker.port) as other:
        c1, c2 = ClassicMember(raw, "g-full"), ClassicMember(other, "g-full")
        classic_two_member_generation(c1, c2)
        full = Member(raw, "g-full").join()
        assert (full.error_code, full.error_message) == \
            (E.GROUP_MAX_SIZE_REACHED, "The consumer group has reached its maximum capacity of 2 members.")
        assert Member(raw, "g-full", assignor="sticky").join().error_code == E.UNSUPPORTED_ASSIGNOR
        assert group_type(raw, "g-full") == ("classic", "Stable")
        assert c1.heartbeat() == c2.heartbeat() == E.NONE


def test_a_consumer_group_becomes_classic_again_when_its_last_consumer_member_leaves(raw):
    a, b = Member(raw, "g-down"), Member(raw, "g-down")
    a.join()
    b.join()
    settle([a, b])
    c = ClassicMember(raw, "g-down", cooperative=True)
    c.rejoin()
    classic_rounds([c], [a, b], rounds=8)
    assert len(c.partitions()) == 1 or len(c.partitions()) == 2
    assert b.heartbeat(epoch=-1).error_code == E.NONE  # one consumer-protocol member still there
    assert group_type(raw, "g-down")[0] == "consumer"
    classic_rounds([c], [a], rounds=6)
    assert a.heartbeat(epoch=-1).error_code == E.NONE  # the last one: the group becomes classic and rebalances
    assert group_type(raw, "g-down") == ("classic", "PreparingRebalance")
    assert c.heartbeat() in (E.REBALANCE_IN_PROGRESS, E.ILLEGAL_GENERATION)
    joined = c.join()  # now a classic rebalance: c leads and assigns
    assert joined.error_code == E.NONE and joined.leader == c.member_id and len(joined.members) == 1
    assert c.sync({c.member_id: assignment(ALL)}).error_code == E.NONE
    assert group_type(raw, "g-down") == ("classic", "Stable") and c.heartbeat() == E.NONE


@pytest.mark.slow  # two brokers and a session timeout: about 8 s
def test_the_downgrade_follows_a_session_timeout_and_respects_the_policy(kip848):
    broker, raw = kip848(**{"group.consumer.migration.policy": "upgrade"})
    with raw:
        a = Member(raw, "g-stay")
        a.join()
        c = ClassicMember(raw, "g-stay", session_timeout_ms=10_000)
        c.rejoin()
        assert a.heartbeat(epoch=-1).error_code == E.NONE
        assert group_type(raw, "g-stay")[0] == "consumer"  # no downgrade under `upgrade`
    broker, raw = kip848("other", **{"group.consumer.migration.policy": "downgrade"})
    with raw:
        a = Member(raw, "g-timeout")
        a.join()
        c = ClassicMember(raw, "g-timeout", session_timeout_ms=10_000)
        c.rejoin()
        deadline = time.monotonic() + 10  # a stops heartbeating: its 2 s session runs out
        while group_type(raw, "g-timeout")[0] == "consumer":
            assert time.monotonic() < deadline, "the consumer member's session never ran out"
            assert c.heartbeat() in (E.NONE, E.REBALANCE_IN_PROGRESS)
            time.sleep(0.3)
        assert group_type(raw, "g-timeout") == ("classic", "PreparingRebalance")


@pytest.mark.slow  # a kill -9 and a restart: about 6 s
@pytest.mark.file_storage(reason="on PostgreSQL the brokers form a cluster, whose coordinator takes a group over "
                                  "with its epoch, not its members (they rejoin), classic and consumer groups alike")
def test_consumer_group_members_are_restored_after_a_kill_mid_revocation(kip848):
    """Before, kop kept consumer groups' membership in memory: after a restart every member was unknown, and a member
    whose partitions were being revoked lost them to the first member to rejoin."""
    broker, raw = kip848()
    a, b = Member(raw, "g-restart"), Member(raw, "g-restart")
    a.join()
    b.join()
    kept = a.heartbeat(owned={TOPIC: [0, 1, 2, 3]})  # a is told to revoke two, and still owns four
    assert kept.member_epoch == 1 and len(a.partitions()) == 2
    raw.close()
    broker.restart(hard=True)  # kill -9: only what was stored before each answer counts
    with RawKafka(broker.port) as again:
        a.raw = b.raw = again
        beat = b.heartbeat()  # b is still waiting: a has not reported its revocation
        assert (beat.error_code, beat.member_epoch, b.partitions()) == (E.NONE, 2, set())
        assert a.heartbeat(owned={TOPIC: [0, 1, 2, 3]}).member_epoch == 1  # still revoking after the restart
        assert b.heartbeat().error_code == E.NONE and b.partitions() == set()
        assert a.heartbeat().member_epoch == 2  # now a reports the two revoked
        assert b.heartbeat().error_code == E.NONE and len(b.partitions()) == 2
        no_partition_shared(a, b)
        assert a.partitions() | b.partitions() == ALL


@pytest.mark.slow  # a kill -9 and a restart: about 6 s
@pytest.mark.file_storage(reason="on PostgreSQL the brokers form a cluster, whose coordinator takes a group over "
                                  "with its epoch, not its members (they rejoin), classic and consumer groups alike")
def test_a_mixed_group_goes_on_after_a_kill(kip848):
    broker, raw = kip848()
    a = Member(raw, "g-mixed-restart")
    a.join()
    c = ClassicMember(raw, "g-mixed-restart", cooperative=True)
    c.rejoin()
    classic_rounds([c], [a])
    before = (a.epoch, a.partitions(), c.generation, c.partitions())
    assert len(c.partitions()) == 2
    raw.close()
    broker.restart(hard=True)
    with RawKafka(broker.port) as again:
        a.raw = c.raw = again
        assert c.heartbeat() == E.NONE  # the classic member is known, in its generation
        assert a.heartbeat().error_code == E.NONE
        assert (a.epoch, a.partitions(), c.generation, c.partitions()) == before
        assert group_type(again, "g-mixed-restart") == ("consumer", "Stable")
        b = Member(again, "g-mixed-restart")
        b.join()  # a third member after the restart: the partitions spread without sharing
        classic_rounds([c], [a, b])
        assert a.partitions() | b.partitions() | c.partitions() == ALL


def test_a_static_classic_member_restarting_with_the_consumer_protocol_takes_its_place(kip848):
    """The rolling upgrade of static members: the instance comes back speaking the other protocol, under a new member
    id, with its partitions and no rebalance; the old member id is fenced."""
    broker, raw = kip848()
    with raw, RawKafka(broker.port) as other:
        c1 = ClassicMember(raw, "g-static-up", instance_id="i-1")
        c2 = ClassicMember(other, "g-static-up", instance_id="i-2")
        classic_two_member_generation(c1, c2)
        held = c1.partitions()
        again = Member(raw, "g-static-up", instance_id="i-1")
        joined = again.join()
        assert joined.error_code == E.NONE and group_type(raw, "g-static-up")[0] == "consumer"
        assert again.partitions() == held  # c1's partitions, at once: the same instance, restarted
        assert c1.heartbeat() == E.FENCED_INSTANCE_ID
        classic_rounds([c2], [again])
        assert again.partitions() | c2.partitions() == ALL


def test_a_static_classic_member_replacing_the_last_consumer_member_makes_the_group_classic(raw):
    a = Member(raw, "g-replace", instance_id="i-1")
    a.join()
    c = ClassicMember(raw, "g-replace")
    c.rejoin()
    classic_rounds([c], [a])
    taken_over = ClassicMember(raw, "g-replace", instance_id="i-1")
    joined = taken_over.join()  # the consumer-protocol static member restarts as a classic consumer
    assert joined.error_code == E.NONE
    # every member is classic now: a classic group, which rebalances before anyone starts on a's partitions
    assert group_type(raw, "g-replace") == ("classic", "PreparingRebalance")
    assert taken_over.sync().error_code in (E.REBALANCE_IN_PROGRESS, E.ILLEGAL_GENERATION)
    assert c.heartbeat() in (E.REBALANCE_IN_PROGRESS, E.ILLEGAL_GENERATION)
    assert a.heartbeat().error_code == E.GROUP_ID_NOT_FOUND  # the replaced member is gone with its protocol

