"""Several brokers on one PostgreSQL database (kop/cluster): partitions spread over the live brokers, clients sent to
each partition's owner, a paused broker fenced out, and idempotent producers through kill -9 of partition owners.
Real processes, a real PostgreSQL (skipped where its binaries are missing), real clients."""
import asyncio
import threading
import time
import urllib.request

import pytest
from kafka.protocol.consumer.fetch import FetchResponse
from kafka.protocol.consumer.group import (OffsetCommitRequest, OffsetCommitResponse, OffsetFetchRequest,
                                           OffsetFetchResponse)

from integration.clients import kp_consume_all
from integration.fetch_requests import FETCH_VERSION, fetch_request
from integration.idem_raw import RawKafka, plain_batch, read_topic
from integration.idem_stream import (DELIVERY_TIMEOUT_S, Report, check_stream, confluent_reporter,
                                     kafka_python_reports, produce_when_room)
from integration.fault_proxy import CutPolicy
from integration.java_client import java_produce
from integration.pg_cluster import PgCluster, coordinator
from integration.test_groups_offsets import fetch_committed
from integration.waiting import wait_for
from kop.admin.client import AdminClient, topic_resource
from kop.cluster.groups import SHARD_TOPIC, shard_of
from kop.topic_storage import ledger_name
from kop.admin.client import AdminClient, AdminError, group_resource
from kop.cluster.ownership import owner_of
from protocol.errors import ErrorCode


PARTITIONS = 4


@pytest.fixture
def cluster(tmp_path, postgres_url):
    made = PgCluster(str(tmp_path), postgres_url)
    yield made
    made.stop()


def wait_until_served_by_leaders(cluster: PgCluster, topic: str, count: int) -> dict[int, int]:
    """Until the brokers agree on each partition's leader and that leader has it open; the leaders."""
    def settled():
        views = [cluster.leaders(topic, asking=node) for node in cluster.running()]
        if any(view != views[0] or len(view) != count for view in views):
            return None
        return views[0] if all(cluster.serving(topic, p) == leader for p, leader in views[0].items()) else None
    return wait_for(settled, f"the leaders of {topic} to settle")


@pytest.mark.slow  # over 10 s: make test-slow runs it, so make test keeps its budget
def test_three_brokers_share_the_partitions_and_send_clients_to_the_owner(cluster):
    from confluent_kafka import Producer
    cluster.start(3)
    topic, count = "spread", 6
    with RawKafka(cluster.port(1)) as kafka:
        assert kafka.create_topic(topic, count) == ErrorCode.NONE
    leaders = wait_until_served_by_leaders(cluster, topic, count)
    assert leaders == {p: owner_of(f"{topic}-partition-{p}", [1, 2, 3]) for p in range(count)}
    assert set(leaders.values()) == {1, 2, 3}, leaders  # spread over every broker
    cluster.brokers[3].restart()  # it loads the topic at start-up, and opens only its own partitions
    cluster.wait_for_members({1, 2, 3})
    assert wait_until_served_by_leaders(cluster, topic, count) == leaders
    for broker in cluster.brokers.values():  # each is ready: every partition it owns is loaded
        with urllib.request.urlopen(f"{broker.admin_url}/ready", timeout=5) as answer:
            assert answer.status == 200
    for p, leader in leaders.items():  # each broker writes its own partitions only
        other = next(node for node in (1, 2, 3) if node != leader)
        with RawKafka(cluster.port(other)) as kafka:
            refused = kafka.produce(topic, p, plain_batch([b"wrong broker"]))
        assert refused.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER, refused
    # Real clients bootstrapped from one broker each find every partition's owner from Metadata.
    failures = []
    producer = Producer({"bootstrap.servers": cluster.brokers[1].bootstrap, "enable.idempotence": True,
                         "acks": "all"})
    for i in range(60):
        producer.produce(topic, key=b"k%d" % i, value=b"v%d" % i, partition=i % count,
                         on_delivery=lambda err, msg: err is not None and failures.append(err))
    assert producer.flush(30) == 0 and not failures, failures
    got = kp_consume_all(cluster.brokers[2].bootstrap, topic, 60)
    assert sorted(r.value for r in got) == sorted(b"v%d" % i for i in range(60))
    assert {r.partition for r in got} == set(range(count))


@pytest.mark.slow  # restarts and moves between brokers: 20-30 s in a loaded make test
def test_a_policy_set_through_one_broker_holds_on_every_broker_and_across_a_restart(cluster):
    """Policies are in the database: a topic's deduplication switched off through broker 1's admin API is what broker
    2, which owns some of its partitions, applies by its next heartbeat, and what it reads after a restart."""
    cluster.start(2)
    topic = "policed"
    with RawKafka(cluster.port(1)) as kafka:
        assert kafka.create_topic(topic, 4) == ErrorCode.NONE
    assert set(wait_until_served_by_leaders(cluster, topic, 4).values()) == {1, 2}
    applied = topic_resource(topic, "deduplicationEnabled")

    def everywhere() -> set:
        return {AdminClient(cluster.brokers[node].admin_url).get(applied, applied=True) for node in (1, 2)}
    assert everywhere() == {True}  # the control: the broker default, before the change
    AdminClient(cluster.brokers[1].admin_url).post(applied, False)
    wait_for(lambda: everywhere() == {False}, "broker 2 to apply the policy set through broker 1")
    cluster.brokers[2].restart()
    cluster.wait_for_members({1, 2})
    assert everywhere() == {False}
    AdminClient(cluster.brokers[2].admin_url).delete(applied)
    wait_for(lambda: everywhere() == {True}, "broker 1 to drop the policy removed through broker 2")


@pytest.mark.slow
def test_a_broker_paused_past_its_lease_cannot_write_again(cluster):
    cluster.start(3)
    topic = "fenced"
    with RawKafka(cluster.port(1)) as kafka:
        assert kafka.create_topic(topic, 3) == ErrorCode.NONE
    paused = wait_until_served_by_leaders(cluster, topic, 3)[0]
    with RawKafka(cluster.port(paused)) as on_paused:
        assert on_paused.produce(topic, 0, plain_batch([b"before"])).error_code == ErrorCode.NONE
        cluster.pause(paused)
        taker = wait_for(lambda: cluster.serving(topic, 0), "another broker to take partition 0 over")
        with RawKafka(cluster.port(taker)) as on_taker:
            assert on_taker.produce(topic, 0, plain_batch([b"after"])).error_code == ErrorCode.NONE
        late = on_paused.send_produce(topic, 0, plain_batch([b"late"]))  # waits in the paused broker's socket
        cluster.resume(paused)
        answer = on_paused.receive_produce(late)
    assert answer.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER, answer
    # The control: the paused broker did try to write it (the database refused), it did not just lack the partition.
    assert "lease expired" in (answer.error_message or ""), answer
    assert "write failed" in cluster.brokers[paused].log_tail(200)
    assert [r.value for r in cluster.read(topic, range(1))] == [b"before", b"after"]
    # Resumed, it registered again and serves as a member: the cluster has three brokers again.
    cluster.wait_for_members({1, 2, 3})


def test_a_lone_broker_paused_past_its_lease_is_refused_even_though_no_one_took_over(cluster):
    """The lease itself fences, not only a new owner's epoch: the write waiting when it wakes is refused by the
    database's clock, unless the broker has registered again and taken its partition back first (which of the two
    its event loop runs first after SIGCONT is not fixed; a write under the new session is a legitimate one). Either
    way it registers again, takes its partitions back as after a crash, and writes resume."""
    cluster.start(1)
    with RawKafka(cluster.port(1)) as kafka:
        assert kafka.create_topic("alone", 1) == ErrorCode.NONE
        assert kafka.produce("alone", 0, plain_batch([b"before"])).error_code == ErrorCode.NONE
        cluster.pause(1)
        time.sleep(4)  # past the 3 s lease
        late = kafka.send_produce("alone", 0, plain_batch([b"late"]))
        cluster.resume(1)
        answer = kafka.receive_produce(late)
        refused = answer.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER
        assert refused or answer.error_code == ErrorCode.NONE, answer
        if refused:
            assert "lease expired" in (answer.error_message or ""), answer
        # Until it has reopened the partition (its next heartbeat) writes are refused, and a client retries.
        wait_for(lambda: kafka.produce("alone", 0, plain_batch([b"after"])).error_code == ErrorCode.NONE,
                 "the broker to take its partition back and accept a write")
    stored = [r.value for r in cluster.read("alone", range(1))]
    assert stored == ([b"before", b"after"] if refused else [b"before", b"late", b"after"]), stored
    assert "the lease ran out" in cluster.brokers[1].log_tail(200)  # the control: it did lose its lease


LEASE_OUTLASTING_A_PAUSE = {"broker.session.timeout.ms": "15000"}  # a paused broker keeps its session


def a_partition_a_third_broker_would_take(cluster: PgCluster, topic: str) -> tuple[int, int]:
    """Two brokers whose leases outlast a pause, and a topic of 12 partitions: one that broker 3 would own if it
    joined, with a record `before` stored, and the broker that owns it now."""
    cluster.start(2, config=LEASE_OUTLASTING_A_PAUSE)
    with RawKafka(cluster.port(1)) as kafka:
        assert kafka.create_topic(topic, 12) == ErrorCode.NONE
    wait_until_served_by_leaders(cluster, topic, 12)
    moving = next(p for p in range(12) if owner_of(f"{topic}-partition-{p}", [1, 2, 3]) == 3)
    owner = owner_of(f"{topic}-partition-{moving}", [1, 2])
    with RawKafka(cluster.port(owner)) as kafka:
        assert kafka.produce(topic, moving, plain_batch([b"before"])).error_code == ErrorCode.NONE
    return moving, owner


def a_third_broker_takes(cluster: PgCluster, topic: str, moving: int, value: bytes) -> None:
    """Broker 3 joins, takes the partition over and stores `value` there, while its previous owner is paused."""
    cluster.add(3, config=LEASE_OUTLASTING_A_PAUSE)
    with RawKafka(cluster.port(3)) as on_new:
        wait_for(lambda: on_new.produce(topic, moving, plain_batch([value])).error_code == ErrorCode.NONE,
                 "the joining broker to take the partition over and store a record")
    # The control: the record is stored, after the one the previous owner stored before its pause.
    assert [r.value for r in read_topic(cluster.port(3), topic, [moving])] == [b"before", value]


@pytest.mark.slow  # restarts and moves between brokers: 20-30 s in a loaded make test
def test_a_partition_moved_to_a_joining_broker_is_not_read_from_its_previous_owner(cluster):
    """The previous owner, paused while a new broker joins and takes a partition over and a record is written there,
    does not answer a read it finds waiting when it wakes from the state it had: its view of the live brokers is too
    old to serve reads by (and once renewed, it shows the partition moved)."""
    topic = "handover"
    moving, previous = a_partition_a_third_broker_would_take(cluster, topic)
    with RawKafka(cluster.port(previous)) as on_previous:
        cluster.pause(previous)
        try:
            a_third_broker_takes(cluster, topic, moving, b"after")
            waiting = on_previous.send(fetch_request([(topic, moving, 1)]))
        finally:
            cluster.resume(previous)
        answer = on_previous.receive(waiting, FetchResponse, FETCH_VERSION).responses[0].partitions[0]
    # Not "nothing after offset 1, the end is 1" from the state it had before the move.
    assert answer.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER, answer


@pytest.mark.slow
def test_a_partition_owner_paused_while_another_took_its_partition_and_left_serves_it_from_the_database(cluster):
    """The owner of a partition is paused (not past its lease) while a broker joins, takes the partition over, stores
    a record there and leaves again. Resumed, the paused broker's view of the live brokers is what it was before, so
    the partition is its own again: it answers reads from what the database holds now, never from the state it had
    before the pause (an end offset behind the records another broker stored), and it takes writes again (its old
    opening of the partition is fenced out by the other broker's)."""
    topic = "regained-partition"
    moving, paused = a_partition_a_third_broker_would_take(cluster, topic)
    cluster.pause(paused)
    try:
        a_third_broker_takes(cluster, topic, moving, b"moved")
        cluster.brokers[3].stop()  # a clean stop ends its lease: the paused broker owns the partition again
    finally:
        cluster.resume(paused)
    ends: list[int | str] = []

    def answered() -> bool:
        with RawKafka(cluster.port(paused)) as kafka:
            try:
                ends.append(kafka.end_offsets(topic, [moving])[moving])
            except RuntimeError as refused:  # NOT_LEADER_OR_FOLLOWER while it takes the partition again
                ends.append(str(refused))
                return False
        return True
    wait_for(answered, "the resumed broker to serve the partition again")
    assert ends[-1] == 2, ends  # not 1, the end it had before the pause

    def written() -> bool:
        with RawKafka(cluster.port(paused)) as kafka:
            return kafka.produce(topic, moving, plain_batch([b"back"])).error_code == ErrorCode.NONE
    wait_for(written, "the resumed broker to take writes to the partition again")
    assert [r.value for r in read_topic(cluster.port(paused), topic, [moving])] == [b"before", b"moved", b"back"]


def commit_offset(port: int, group: str, topic: str, offset: int) -> int:
    """A simple (generation -1) OffsetCommit v5 of partition 0; its error code."""
    Topic = OffsetCommitRequest[5].OffsetCommitRequestTopic
    request = OffsetCommitRequest[5](group_id=group, generation_id_or_member_epoch=-1, member_id="", topics=[
        Topic(name=topic, partitions=[Topic.OffsetCommitRequestPartition(partition_index=0, committed_offset=offset,
                                                                         committed_metadata="")])])
    with RawKafka(port, timeout=10) as kafka:
        return kafka.call(request, OffsetCommitResponse, 5).topics[0].partitions[0].error_code


def committed_offset(port: int, group: str, topic: str) -> tuple[int, int]:
    """OffsetFetch v5 of partition 0 from the broker on `port`: (error code, committed offset)."""
    request = OffsetFetchRequest[5](group_id=group, topics=[
        OffsetFetchRequest.OffsetFetchRequestTopic(name=topic, partition_indexes=[0])])
    with RawKafka(port, timeout=10) as kafka:
        answer = kafka.call(request, OffsetFetchResponse, 5)
    if answer.error_code != ErrorCode.NONE:
        return answer.error_code, -1
    partition = answer.topics[0].partitions[0]
    return partition.error_code, partition.committed_offset


@pytest.mark.slow
def test_a_coordinator_paused_while_another_coordinated_its_group_and_left_answers_the_newer_offset(cluster):
    """A group's coordinator is paused (not past its lease) while a broker joins, takes the group's shard over, stores
    a later commit and leaves again. Resumed, the paused broker's view of the live brokers is what it was before, so
    it coordinates the group again: from the offsets the database holds now, not the ones it had cached (it answered
    the group's own earlier commit, and a member that resumed from there committed the group backwards)."""
    lease = {"broker.session.timeout.ms": "15000"}  # the pause does not end the lease: no new session
    cluster.start(2, config=lease)
    topic = "regained"
    with RawKafka(cluster.port(1)) as kafka:
        assert kafka.create_topic(topic, 1) == ErrorCode.NONE
    wait_until_served_by_leaders(cluster, topic, 1)

    def shard_owner(group: str, nodes: list[int]) -> int:
        return owner_of(ledger_name(SHARD_TOPIC, shard_of(group)), nodes)

    group = next(g for g in (f"regained-{i}" for i in range(1000)) if shard_owner(g, [1, 2, 3]) == 3)
    paused = shard_owner(group, [1, 2])
    wait_for(lambda: commit_offset(cluster.port(paused), group, topic, 5) == ErrorCode.NONE,
             "the group's coordinator to store the first commit")
    assert committed_offset(cluster.port(paused), group, topic) == (ErrorCode.NONE, 5)
    cluster.pause(paused)
    try:
        cluster.add(3, config=lease)
        wait_for(lambda: commit_offset(cluster.port(3), group, topic, 9) == ErrorCode.NONE,
                 "the joining broker to take the group over and store a later commit")
        # The control: the joining broker coordinated the group, and from the database it read the first commit.
        assert committed_offset(cluster.port(3), group, topic) == (ErrorCode.NONE, 9)
        cluster.brokers[3].stop()  # a clean stop ends its lease: the paused broker owns the shard again
    finally:
        cluster.resume(paused)
    answers: list[tuple[int, int]] = []

    def answered() -> bool:
        answers.append(committed_offset(cluster.port(paused), group, topic))
        return answers[-1][0] == ErrorCode.NONE
    wait_for(answered, "the resumed broker to coordinate the group again")
    assert answers[-1] == (ErrorCode.NONE, 9), answers
    assert {code for code, _ in answers} <= {ErrorCode.NONE, ErrorCode.NOT_COORDINATOR,
                                             ErrorCode.COORDINATOR_LOAD_IN_PROGRESS}, answers


GROUP_PROTOCOLS = {
    "classic": {"session.timeout.ms": 10_000, "heartbeat.interval.ms": 500},
    # KIP-848: the new coordinator restores the member at its epoch and it heartbeats on
    "consumer": {"group.protocol": "consumer"},
}


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["kill", "pause"])
@pytest.mark.parametrize("protocol", sorted(GROUP_PROTOCOLS))
def test_a_consumer_group_keeps_consuming_and_its_offsets_when_its_coordinator_is_killed_or_paused(cluster, protocol,
                                                                                                  fault):
    """The group's coordinator is killed, or paused (SIGSTOP) past its lease and resumed (SIGCONT) once another
    broker coordinates the group: the consumer goes on from its committed offsets, nothing lost and nothing read
    again. A resumed coordinator joins again, takes the group's shard back and coordinates it (not NOT_COORDINATOR
    for ever): a new member starts after the offsets committed meanwhile, through it."""
    from confluent_kafka import Consumer, KafkaException, Producer
    cluster.start(3)
    topic, group = "grouped", f"survivors-{protocol}"
    commit_errors: list[str] = []
    with RawKafka(cluster.port(1)) as kafka:
        assert kafka.create_topic(topic, PARTITIONS) == ErrorCode.NONE
    wait_until_served_by_leaders(cluster, topic, PARTITIONS)
    named = {coordinator(cluster.port(node), group) for node in (1, 2, 3)}
    assert named == {owner_of(f"__consumer_offsets-partition-{shard_of(group)}", [1, 2, 3])}, named
    victim = named.pop()
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "enable.idempotence": True})

    def produce(first: int, count: int) -> None:
        for i in range(first, first + count):
            producer.produce(topic, key=b"k%d" % i, value=b"v%d" % i)
        assert producer.flush(60) == 0

    def consume(consumer, wanted: set[bytes], timeout: float) -> set[bytes]:
        seen: set[bytes] = set()
        deadline = time.monotonic() + timeout
        while not wanted <= seen and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                seen.add(message.value())
                try:
                    consumer.commit(message, asynchronous=False)
                except KafkaException as exc:  # e.g. UNKNOWN_MEMBER_ID while it rejoins: read again from the last
                    commit_errors.append(exc.args[0].name())
        return seen

    config = {"bootstrap.servers": cluster.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
              "enable.auto.commit": False, **GROUP_PROTOCOLS[protocol]}
    consumer = Consumer(config)
    consumer.subscribe([topic])
    try:
        produce(0, 100)
        assert consume(consumer, {b"v%d" % i for i in range(100)}, 60) >= {b"v%d" % i for i in range(100)}
        if fault == "kill":
            cluster.brokers[victim].kill()
        else:
            cluster.pause(victim)
        try:
            moved_to = wait_for(lambda: next((c for n in cluster.running() if (c := coordinator(cluster.port(n), group))
                                              not in (-1, victim)), None), "another broker to coordinate the group")
        finally:
            if fault == "pause":
                cluster.resume(victim)  # past its lease: its writes are refused, it joins again
        produce(100, 100)  # the same consumer, its coordinator gone: it finds the new one and goes on
        wanted = {b"v%d" % i for i in range(100, 200)}
        after = consume(consumer, wanted, 90)
        # All of them, and nothing read before: the new coordinator loaded the offsets committed through the old.
        assert after == wanted, (sorted(wanted - after)[:5], sorted(after - wanted)[:5])
    finally:
        consumer.close()
    assert moved_to != victim
    if fault == "pause":  # the control: it did lose its lease; then it takes the group's shard back
        assert "the lease ran out" in cluster.brokers[victim].log_tail(400)
        wait_for(lambda: {coordinator(cluster.port(n), group) for n in cluster.running()} == {victim},
                 "the resumed broker to coordinate the group again")
    # The offsets it committed through the new coordinator hold: a new member of the group starts after them.
    produce(200, 10)
    consumer = Consumer(config)
    consumer.subscribe([topic])
    try:
        later = consume(consumer, {b"v%d" % i for i in range(200, 210)}, 60)
    finally:
        consumer.close()
    assert later == {b"v%d" % i for i in range(200, 210)}, sorted(later - {b"v%d" % i for i in range(200, 210)})


def test_a_coordinators_offsets_go_with_their_topic_and_a_topic_created_again_has_none(cluster):
    from kafka import KafkaConsumer, TopicPartition
    from kafka.admin import KafkaAdminClient
    from kafka.structs import OffsetAndMetadata
    cluster.start(1)
    bootstrap = cluster.brokers[1].bootstrap
    with RawKafka(cluster.port(1)) as kafka:
        assert kafka.create_topic("again", 1) == ErrorCode.NONE
        assert kafka.produce("again", 0, plain_batch([b"a", b"b", b"c"])).error_code == ErrorCode.NONE
    tp = TopicPartition("again", 0)
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id="g-again", enable_auto_commit=False)
    consumer.commit({tp: OffsetAndMetadata(2, "", -1)})
    consumer.close()
    assert fetch_committed(bootstrap, "g-again")[("again", 0)][0] == 2  # the control: it was committed
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.delete_topics(["again"])
    finally:
        admin.close()
    with RawKafka(cluster.port(1)) as kafka:
        assert wait_for(lambda: kafka.create_topic("again", 1) == ErrorCode.NONE, "the topic created again")
    assert ("again", 0) not in fetch_committed(bootstrap, "g-again")


# ---- kill -9 of the owner of busy partitions and connection cuts, idempotent producers of the four clients

KILLS = 3
PACE = 50  # values between two short sleeps: about a thousand a second per producer
JAVA_ROUND = 1500  # values per run of the Java harness: each run is a new idempotent producer
CUTS = CutPolicy(every=40, max_cuts=25)  # per broker's proxy: a Produce response lost, its connection closed


def paced_confluent(bootstrap: str, topic: str, running: threading.Event, values: list[bytes],
                    out: list[Report]) -> None:
    from confluent_kafka import Producer
    reports: dict[bytes, Report] = {}
    on_delivery = confluent_reporter(reports)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                         "linger.ms": 5, "message.timeout.ms": DELIVERY_TIMEOUT_S * 1000, "retry.backoff.ms": 50,
                         "reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 500})
    while running.is_set():
        value = f"{topic}-{len(values)}".encode()
        values.append(value)
        produce_when_room(producer, topic, key=b"k%d" % len(values), value=value, on_delivery=on_delivery)
        if len(values) % PACE == 0:
            time.sleep(0.05)
    producer.flush(DELIVERY_TIMEOUT_S + 10)
    out.extend(reports.get(v) or Report(v, None, None, "NoReport") for v in values)


def paced_kafka_python(bootstrap: str, topic: str, running: threading.Event, values: list[bytes],
                       out: list[Report]) -> None:
    from kafka import KafkaProducer
    producer = KafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, acks="all", linger_ms=5,
                             retry_backoff_ms=50, reconnect_backoff_ms=50, reconnect_backoff_max_ms=500,
                             request_timeout_ms=10_000, delivery_timeout_ms=DELIVERY_TIMEOUT_S * 1000)
    futures = []
    try:
        while running.is_set():
            value = f"{topic}-{len(values)}".encode()
            values.append(value)
            futures.append(producer.send(topic, key=b"k%d" % len(values), value=value))
            if len(values) % PACE == 0:
                time.sleep(0.05)
        producer.flush(DELIVERY_TIMEOUT_S + 10)
        out.extend(kafka_python_reports(values, futures))
    finally:
        producer.close(timeout=10)


def paced_aiokafka(bootstrap: str, topic: str, running: threading.Event, values: list[bytes],
                   out: list[Report]) -> None:
    from aiokafka import AIOKafkaProducer

    async def go() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, acks="all", linger_ms=5,
                                    retry_backoff_ms=50, request_timeout_ms=10_000)
        await producer.start()
        futures = []
        try:
            while running.is_set():
                value = f"{topic}-{len(values)}".encode()
                values.append(value)
                futures.append(await producer.send(topic, key=b"k%d" % len(values), value=value))
                if len(values) % PACE == 0:
                    await asyncio.sleep(0.05)
            results = await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True),
                                             DELIVERY_TIMEOUT_S + 10)
        finally:
            await asyncio.wait_for(producer.stop(), 15)
        for value, md in zip(values, results):
            out.append(Report(value, None, None, type(md).__name__) if isinstance(md, BaseException)
                       else Report(value, md.partition, md.offset if md.offset >= 0 else None, None))
    asyncio.run(go())


def rounds_of_java(bootstrap: str, topic: str, running: threading.Event, values: list[bytes],
                   out: list[Report]) -> None:
    """The Java client, one harness run (a new idempotent producer) of JAVA_ROUND values after another."""
    prefix = f"{topic}-"
    while running.is_set():
        first = len(values)
        values.extend(f"{prefix}{i}".encode() for i in range(first, first + JAVA_ROUND))
        deliveries = java_produce(bootstrap, topic, JAVA_ROUND, idempotence=True, max_in_flight=5, key_prefix="k",
                                  value_prefix=prefix, start_index=first,
                                  extra_props={"retry.backoff.ms": 50, "reconnect.backoff.ms": 50,
                                               "reconnect.backoff.max.ms": 500},
                                  timeout=DELIVERY_TIMEOUT_S + 30)
        by_value = {d.value.encode(): d for d in deliveries}
        out.extend(Report(v, d.partition, d.offset if d.ok else None, d.error) if (d := by_value.get(v)) else
                   Report(v, None, None, "NoReport") for v in values[first:])


@pytest.mark.slow
def test_idempotent_producers_of_every_client_lose_and_duplicate_nothing_through_cuts_and_owner_kills(
        tmp_path, postgres_url):
    cluster = PgCluster(str(tmp_path), postgres_url, cuts=CUTS)
    try:
        cluster.start(3)
        run_the_four_clients_through_kills(cluster)
    finally:
        cluster.stop()


def run_the_four_clients_through_kills(cluster: PgCluster) -> None:
    streams = {"failover-ck": paced_confluent, "failover-kp": paced_kafka_python, "failover-aio": paced_aiokafka,
               "failover-java": rounds_of_java}
    with RawKafka(cluster.port(1)) as kafka:
        for topic in streams:
            assert kafka.create_topic(topic, PARTITIONS) == ErrorCode.NONE
    for topic in streams:
        wait_until_served_by_leaders(cluster, topic, PARTITIONS)
    running = threading.Event()
    running.set()
    sent: dict[str, list[bytes]] = {topic: [] for topic in streams}
    reports: dict[str, list[Report]] = {topic: [] for topic in streams}
    threads = [threading.Thread(target=run, args=(cluster.bootstrap, topic, running, sent[topic], reports[topic]),
                                daemon=True) for topic, run in streams.items()]
    for thread in threads:
        thread.start()
    failovers = []
    try:
        for _ in range(KILLS):
            time.sleep(3)  # the producers write to every partition meanwhile
            owned = {node: 0 for node in cluster.running()}
            for topic in streams:
                for leader in cluster.leaders(topic).values():
                    owned[leader] += 1
            victim = max(owned, key=owned.get)
            moved = {(topic, p) for topic in streams for p, leader in cluster.leaders(topic).items()
                     if leader == victim}
            progress = {topic: len(sent[topic]) for topic in streams}
            cluster.brokers[victim].kill()
            killed = time.monotonic()
            for topic, p in sorted(moved):  # the survivors take the victim's partitions over
                wait_for(lambda: cluster.serving(topic, p) not in (None, victim), f"{topic}-{p} to move", 30)
            failovers.append(time.monotonic() - killed)
            cluster.brokers[victim].start(timeout=60)
            cluster.wait_for_members({1, 2, 3})
            time.sleep(1)
            # The control: every producer was sending across the kill.
            assert all(len(sent[topic]) > progress[topic] for topic in streams), "a producer stopped sending"
    finally:
        time.sleep(2)
        running.clear()
        for thread in threads:
            thread.join(DELIVERY_TIMEOUT_S + 60)
    assert not any(thread.is_alive() for thread in threads), "a producer did not finish"
    cuts = sum(proxy.stats().cuts for proxy in cluster.proxies.values())
    assert cuts > 0, "no connection was cut"  # the control: responses were lost, and their batches retried
    for topic in streams:
        check = check_stream(sent[topic], reports[topic], cluster.read(topic, range(PARTITIONS)))
        print(f"\n[{topic}: {KILLS} kills, {cuts} cuts, failover {', '.join(f'{s:.1f}' for s in failovers)} s] "
              f"{check.summary()}")
        assert check.lost == 0 and check.foreign == 0 and check.duplicated == 0, check.summary()
        assert check.out_of_order == 0 and check.holes == 0 and check.offset_mismatches == 0, check.summary()
        assert check.failed == 0 and check.stored == len(sent[topic]), check.summary()


def test_a_groups_replicated_flag_is_set_by_its_coordinator_and_goes_with_the_group(cluster):
    """PIP-33 on PostgreSQL: the coordinators' store carries a group's replicated flag in its cursor rows. Only the
    group's coordinator sets it (another broker answers 409), and the broker that takes the group over after a kill
    knows it, from the rows and from the flag's record."""
    from kafka import KafkaConsumer, TopicPartition
    from kafka.structs import OffsetAndMetadata
    cluster.start(2)
    with RawKafka(cluster.port(1)) as kafka:
        assert kafka.create_topic("flagged", 1) == ErrorCode.NONE
    wait_until_served_by_leaders(cluster, "flagged", 1)
    consumer = KafkaConsumer(bootstrap_servers=cluster.bootstrap, group_id="flag-app", enable_auto_commit=False)
    consumer.commit({TopicPartition("flagged", 0): OffsetAndMetadata(0, "", -1)})
    consumer.close()
    owner = wait_for(lambda: next((c for n in cluster.running() if (c := coordinator(cluster.port(n), "flag-app"))
                                   in (1, 2)), None), "the group's coordinator")
    other = 3 - owner
    path = group_resource("flag-app", "replicated")
    with pytest.raises(AdminError) as refused:
        AdminClient(cluster.brokers[other].admin_url).post(path, True)
    assert refused.value.status == 409, refused.value
    changed = AdminClient(cluster.brokers[owner].admin_url).post(path, True)
    assert changed["partitionsChanged"] == 1
    assert AdminClient(cluster.brokers[owner].admin_url).get(path) is True
    assert AdminClient(cluster.brokers[other].admin_url).get(path) is False  # control: only its coordinator knows
    cluster.brokers[owner].kill()
    assert wait_for(lambda: AdminClient(cluster.brokers[other].admin_url).get(path) is True,
                    "the new coordinator to know the group's flag", 30)
