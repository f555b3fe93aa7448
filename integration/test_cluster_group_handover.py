"""A consumer group's members keep their partitions when their coordinator's broker is killed (kop/cluster/groups.py):
the broker that takes the group's shard over restores the group from its latest generation record (classic: the
generation, members and assignments; KIP-848: the members' epochs and assignments), so members that find it
heartbeat on without a rebalance, as with Kafka's coordinator loading a group from `__consumer_offsets`. Real
processes, a real PostgreSQL, kafka-python and confluent-kafka (librdkafka) members, classic and consumer protocol."""
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from integration.pg_cluster import PgCluster, coordinator
from integration.test_cluster import wait_until_served_by_leaders
from integration.test_cluster_transactions import group_coordinator, named
from integration.waiting import wait_for
from integration.idem_raw import RawKafka
from protocol.errors import ErrorCode

NODES = [1, 2, 3]
PARTITIONS = 6
MEMBERS = 2
SESSION_MS = 20_000  # classic members: longer than a failover (a lease of 3 s, then the shard's load)


@pytest.fixture
def cluster(tmp_path, postgres_url):
    made = PgCluster(str(tmp_path), postgres_url)
    yield made
    made.stop()


@dataclass
class MemberLog:
    """What one member did: the records it consumed and every change of its assignment, in order."""
    consumed: list[tuple[int, int, bytes]] = field(default_factory=list)
    changes: list[tuple[str, frozenset[int]]] = field(default_factory=list)  # ("assigned" | "revoked" | "lost", ...)
    member_id: str = ""  # as the member's own thread last read it (a client is not shared across threads)
    failure: BaseException | None = None

    @property
    def assignment(self) -> frozenset[int]:
        owned: set[int] = set()
        for kind, partitions in self.changes:
            owned = owned | partitions if kind == "assigned" else owned - partitions
        return frozenset(owned)


def kafka_python_member(bootstrap: str, topic: str, group: str, stop: threading.Event, log: MemberLog) -> None:
    from kafka import ConsumerRebalanceListener, KafkaConsumer

    class Listener(ConsumerRebalanceListener):
        def on_partitions_revoked(self, revoked):
            log.changes.append(("revoked", frozenset(tp.partition for tp in revoked)))

        def on_partitions_assigned(self, assigned):
            log.changes.append(("assigned", frozenset(tp.partition for tp in assigned)))

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
                             auto_offset_reset="earliest", session_timeout_ms=SESSION_MS, heartbeat_interval_ms=500,
                             reconnect_backoff_max_ms=500)
    consumer.subscribe([topic], listener=Listener())
    try:
        while not stop.is_set():
            batch = consumer.poll(timeout_ms=200)
            log.member_id = consumer._coordinator._generation.member_id
            for records in batch.values():
                log.consumed.extend((r.partition, r.offset, r.value) for r in records)
            if batch:
                try:
                    consumer.commit(timeout_ms=5000)
                except Exception:  # noqa: BLE001 - its coordinator moving: the next commit carries these offsets
                    pass
    finally:
        consumer.close(autocommit=False)


def confluent_member(protocol: str) -> Callable:
    def run(bootstrap: str, topic: str, group: str, stop: threading.Event, log: MemberLog) -> None:
        from confluent_kafka import Consumer, KafkaException
        config = {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                  "auto.offset.reset": "earliest", "reconnect.backoff.max.ms": 500}
        if protocol == "consumer":
            config["group.protocol"] = "consumer"
        else:
            config |= {"session.timeout.ms": SESSION_MS, "heartbeat.interval.ms": 500}
        consumer = Consumer(config)
        changes = {"assigned": "on_assign", "revoked": "on_revoke", "lost": "on_lost"}
        callbacks = {callback: (lambda kind: lambda _c, tps: log.changes.append(
            (kind, frozenset(tp.partition for tp in tps))))(kind) for kind, callback in changes.items()}
        consumer.subscribe([topic], **callbacks)
        try:
            while not stop.is_set():
                message = consumer.poll(0.2)
                log.member_id = consumer.memberid() or ""
                if message is None or message.error() is not None:
                    continue
                log.consumed.append((message.partition(), message.offset(), message.value()))
                try:
                    consumer.commit(message, asynchronous=True)
                except KafkaException:  # its coordinator moving: a later commit carries this offset
                    pass
        finally:
            consumer.close()
    return run


CLIENTS = {"kafka-python-classic": kafka_python_member, "confluent-classic": confluent_member("classic"),
           "confluent-consumer": confluent_member("consumer")}


def produce(bootstrap: str, topic: str, first: int, count: int) -> list[bytes]:
    from confluent_kafka import Producer
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    sent = [b"v%d" % i for i in range(first, first + count)]
    for i, value in enumerate(sent):
        producer.produce(topic, value, partition=i % PARTITIONS)
    assert producer.flush(90) == 0
    return sent


@pytest.mark.slow
@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_members_keep_their_partitions_and_read_each_record_once_when_their_coordinator_is_killed(cluster, client):
    cluster.start(3)
    topic = "handed-over"
    with RawKafka(cluster.port(1)) as kafka:
        assert kafka.create_topic(topic, PARTITIONS) == ErrorCode.NONE
    wait_until_served_by_leaders(cluster, topic, PARTITIONS)
    victim = 2
    group = named(f"handover-{client}", victim, group_coordinator)
    assert coordinator(cluster.port(1), group) == victim
    stop = threading.Event()
    logs = [MemberLog() for _ in range(MEMBERS)]

    def member(log: MemberLog) -> None:
        try:
            CLIENTS[client](cluster.bootstrap, topic, group, stop, log)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            log.failure = exc
    threads = [threading.Thread(target=member, args=(log,), daemon=True) for log in logs]
    for thread in threads:
        thread.start()
    try:
        sent = produce(cluster.bootstrap, topic, 0, 300)

        def settled() -> bool:
            owned = [log.assignment for log in logs]
            return all(owned) and frozenset().union(*owned) == frozenset(range(PARTITIONS)) \
                and sum(len(log.consumed) for log in logs) >= len(sent)
        wait_for(settled, "both members to own partitions and read the first records", 90)
        before = [(log.member_id, log.assignment, len(log.changes)) for log in logs]
        cluster.brokers[victim].kill()
        moved_to = wait_for(lambda: next((c for n in cluster.running() if (c := coordinator(cluster.port(n), group))
                                          not in (-1, victim)), None), "another broker to coordinate the group", 30)
        sent += produce(cluster.bootstrap, topic, 300, 300)
        wait_for(lambda: {v for log in logs for _p, _o, v in log.consumed} >= set(sent),
                 "the members to read the records sent after the kill", 90)
        time.sleep(2)  # a rebalance the move caused would show by now (members heartbeat every 0.5 s)
        after = [(log.member_id, log.assignment, len(log.changes)) for log in logs]
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    assert moved_to != victim
    assert [log.failure for log in logs] == [None] * MEMBERS
    assert after == before, [log.changes for log in logs]  # the same members, partitions, no revocation
    read = Counter(v for log in logs for _p, _o, v in log.consumed)
    assert set(read) == set(sent) and max(read.values()) == 1, [v for v, n in read.items() if n > 1][:5]
