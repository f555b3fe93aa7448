"""Committed offsets with every client library against a real kop process: sync and async commits with metadata
survive `kill -9` of the broker, and a restarted consumer resumes exactly at them; auto.offset.reset earliest and
latest; assign-only consumers commit without a group generation; the Reader pattern (assign + seek from the
application's own stored offset, no group) resumes exactly where the application says."""
import asyncio
import time

import pytest

from integration.java_client import java_available, java_unavailable_reason
from integration.test_groups_clients import create_topic, produce
from integration.waiting import wait_for

N = 100




def fetch_committed(bootstrap: str, group: str) -> dict[tuple[str, int], tuple[int, str]]:
    """(topic, partition) -> (offset, metadata) as kafka-python's admin client reads them (OffsetFetch, all)."""
    from kafka.admin import KafkaAdminClient
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        offsets = admin.list_group_offsets({group: None})[group]
        return {(tp.topic, tp.partition): (om.offset, om.metadata) for tp, om in offsets.items()}
    finally:
        admin.close()


# ---- kafka-python

def kp_consumer(bootstrap, group, **extra):
    from kafka import KafkaConsumer
    return KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
                         auto_offset_reset="earliest", session_timeout_ms=6000, heartbeat_interval_ms=1000, **extra)


def kp_read(consumer, count: int, timeout: float = 30.0):
    out = []
    deadline = time.monotonic() + timeout
    while len(out) < count and time.monotonic() < deadline:
        for batch in consumer.poll(timeout_ms=200, max_records=count - len(out)).values():
            out.extend(batch)
    return out


def test_kafka_python_commits_survive_kill_9_and_the_group_resumes_there(broker):
    from kafka import TopicPartition
    from kafka.structs import OffsetAndMetadata
    topic, group = "kp-commits", "kp-commit-group"
    create_topic(broker.bootstrap, topic, 2)
    produce(broker.bootstrap, topic, 0, N, partitions=2)
    tp0, tp1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    consumer = kp_consumer(broker.bootstrap, group)
    consumer.partitions_for_topic(topic)  # metadata before joining: no second rebalance right after the first
    consumer.subscribe([topic])
    kp_read(consumer, 40)
    # Joined before it had the topic's metadata, the member joins again once it has it: a commit in between is
    # answered REBALANCE_IN_PROGRESS, as Kafka answers it. Wait for the assignment of both partitions.
    wait_for(lambda: consumer.poll(timeout_ms=50) is not None and consumer.assignment() == {tp0, tp1},
             "both partitions assigned")
    consumer.commit({tp0: OffsetAndMetadata(20, "sync-meta", -1)})
    acked = []
    consumer.commit_async({tp1: OffsetAndMetadata(15, "async-meta", -1)},
                          callback=lambda offsets, error: acked.append(error))
    wait_for(lambda: consumer.poll(timeout_ms=50) is not None and acked, "the async commit")
    assert acked == [None]
    consumer.close(autocommit=False)
    broker.kill()
    broker.start()
    assert fetch_committed(broker.bootstrap, group) == {(topic, 0): (20, "sync-meta"), (topic, 1): (15, "async-meta")}
    resumed = kp_consumer(broker.bootstrap, group)
    resumed.partitions_for_topic(topic)
    resumed.subscribe([topic])
    records = kp_read(resumed, N - 35, timeout=60)
    resumed.close(autocommit=False)
    firsts = {p: min(r.offset for r in records if r.partition == p) for p in (0, 1)}
    assert firsts == {0: 20, 1: 15}
    assert len(records) == N - 35 and len({(r.partition, r.offset) for r in records}) == N - 35


# ---- confluent-kafka

def test_confluent_commits_survive_kill_9_and_the_group_resumes_there(broker):
    from confluent_kafka import Consumer, TopicPartition
    topic, group = "ck-commits", "ck-commit-group"
    create_topic(broker.bootstrap, topic, 2)
    produce(broker.bootstrap, topic, 0, N, partitions=2)
    conf = {"bootstrap.servers": broker.bootstrap, "group.id": group, "enable.auto.commit": False,
            "auto.offset.reset": "earliest"}
    acked = []
    consumer = Consumer({**conf, "on_commit": lambda err, parts: acked.append((err, parts))})
    consumer.subscribe([topic])
    got = 0
    deadline = time.monotonic() + 30
    while got < 40 and time.monotonic() < deadline:
        got += len([m for m in consumer.consume(40 - got, timeout=0.5) if m.error() is None])
    consumer.commit(offsets=[TopicPartition(topic, 0, 30, metadata="ck-sync")], asynchronous=False)
    consumer.commit(offsets=[TopicPartition(topic, 1, 12, metadata="ck-async")], asynchronous=True)
    def async_acked():
        consumer.poll(0.05)  # serves the on_commit callback
        return any(tp.partition == 1 for _, parts in acked for tp in parts)
    wait_for(async_acked, "the async commit")
    assert all(err is None for err, _ in acked)
    consumer.close()
    broker.kill()
    broker.start()
    resumed = Consumer(conf)
    committed = resumed.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], timeout=20)
    assert [(tp.offset, tp.metadata) for tp in committed] == [(30, "ck-sync"), (12, "ck-async")]
    resumed.subscribe([topic])
    seen = []
    deadline = time.monotonic() + 30
    while len(seen) < N - 42 and time.monotonic() < deadline:
        seen += [(m.partition(), m.offset()) for m in resumed.consume(50, timeout=0.5) if m.error() is None]
    resumed.close()
    assert min(o for p, o in seen if p == 0) == 30 and min(o for p, o in seen if p == 1) == 12
    assert len(seen) == len(set(seen)) == N - 42


# ---- aiokafka

def test_aiokafka_commits_survive_kill_9_and_the_group_resumes_there(broker):
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.structs import OffsetAndMetadata
    topic, group = "aio-commits", "aio-commit-group"
    create_topic(broker.bootstrap, topic, 2)
    produce(broker.bootstrap, topic, 0, N, partitions=2)
    tp0, tp1 = TopicPartition(topic, 0), TopicPartition(topic, 1)

    def consumer():
        return AIOKafkaConsumer(topic, bootstrap_servers=broker.bootstrap, group_id=group, enable_auto_commit=False,
                                auto_offset_reset="earliest")

    async def first():
        c = consumer()
        await c.start()
        try:
            await c.getmany(timeout_ms=2000)
            await c.commit({tp0: OffsetAndMetadata(33, "aio-meta"), tp1: OffsetAndMetadata(7, "")})
        finally:
            await c.stop()

    async def second():
        c = consumer()
        await c.start()
        try:
            committed = (await c.committed(tp0), await c.committed(tp1))
            seen = []
            deadline = time.monotonic() + 30
            while len(seen) < N - 40 and time.monotonic() < deadline:
                for batch in (await c.getmany(timeout_ms=500)).values():
                    seen += [(m.partition, m.offset) for m in batch]
            return committed, seen
        finally:
            await c.stop()

    asyncio.run(first())
    broker.kill()
    broker.start()
    assert fetch_committed(broker.bootstrap, group)[(topic, 0)] == (33, "aio-meta")
    committed, seen = asyncio.run(second())
    assert committed == (33, 7)
    assert min(o for p, o in seen if p == 0) == 33 and min(o for p, o in seen if p == 1) == 7
    assert len(seen) == len(set(seen)) == N - 40


# ---- Java

@pytest.mark.skipif(not java_available(), reason=java_unavailable_reason())
@pytest.mark.parametrize("commit", ["sync", "async"])
@pytest.mark.slow  # two JVM consumers around a kill -9: 10-20 s each
def test_java_commits_survive_kill_9_and_the_group_resumes_there(broker, commit):
    from integration.test_groups_java import java_group_consume
    topic, group = f"java-commits-{commit}", f"java-commit-group-{commit}"
    create_topic(broker.bootstrap, topic, 2)
    produce(broker.bootstrap, topic, 0, N, partitions=2)
    first = java_group_consume(broker.bootstrap, topic, group, max_records=30, commit=commit, timeout=60)
    assert len(first.records) == 30
    broker.kill()
    broker.start()
    expected = {p: max([r.offset + 1 for r in first.records if r.partition == p], default=0) for p in (0, 1)}
    committed = fetch_committed(broker.bootstrap, group)
    assert {p: committed.get((topic, p), (0, ""))[0] for p in (0, 1)} == expected
    second = java_group_consume(broker.bootstrap, topic, group, max_records=N - 30, idle_ms=3000, timeout=60)
    assert sorted((r.partition, r.offset) for r in first.records + second.records) == \
        sorted((i % 2, i // 2) for i in range(N))


# ---- auto.offset.reset

@pytest.mark.parametrize("reset", ["earliest", "latest"])
def test_auto_offset_reset_applies_only_without_a_committed_offset(broker, reset):
    from confluent_kafka import Consumer
    from kafka import KafkaConsumer
    topic = f"reset-{reset}"
    create_topic(broker.bootstrap, topic, 1)
    produce(broker.bootstrap, topic, 0, 10, partitions=1)
    ck = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"ck-{reset}", "auto.offset.reset": reset,
                   "enable.auto.commit": False})
    ck.subscribe([topic])
    kp = KafkaConsumer(topic, bootstrap_servers=broker.bootstrap, group_id=f"kp-{reset}", auto_offset_reset=reset,
                       enable_auto_commit=False)
    ck_seen, kp_seen = [], []

    def assigned():
        ck_seen.extend(m.value().decode() for m in ck.consume(10, timeout=0.2) if m.error() is None)
        kp_seen.extend(r.value.decode() for b in kp.poll(timeout_ms=200).values() for r in b)
        return ck.assignment() and kp.assignment()
    wait_for(assigned, "both consumers to join")
    for tp in kp.assignment():
        kp.position(tp)  # resolves the reset now
    deadline = time.monotonic() + 2  # librdkafka resolves its reset right after the assignment; no API shows it
    while time.monotonic() < deadline:
        ck_seen.extend(m.value().decode() for m in ck.consume(10, timeout=0.2) if m.error() is None)
    produce(broker.bootstrap, topic, 10, 5, partitions=1)

    def drained():
        ck_seen.extend(m.value().decode() for m in ck.consume(10, timeout=0.2) if m.error() is None)
        kp_seen.extend(r.value.decode() for b in kp.poll(timeout_ms=200).values() for r in b)
        return "14" in ck_seen and "14" in kp_seen
    wait_for(drained, "the new records")
    ck.close()
    kp.close(autocommit=False)
    expected = [str(i) for i in (range(15) if reset == "earliest" else range(10, 15))]
    assert ck_seen == expected and kp_seen == expected


# ---- assign-only consumers and the Reader pattern

def test_assign_only_consumers_commit_without_a_generation(broker):
    from confluent_kafka import Consumer, TopicPartition as CkTP
    from kafka import KafkaConsumer, TopicPartition
    from kafka.structs import OffsetAndMetadata
    topic = "assigned"
    create_topic(broker.bootstrap, topic, 1)
    produce(broker.bootstrap, topic, 0, 10, partitions=1)
    kp = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id="kp-assign", enable_auto_commit=False)
    kp.assign([TopicPartition(topic, 0)])
    kp.commit({TopicPartition(topic, 0): OffsetAndMetadata(4, "kp", -1)})
    kp.close(autocommit=False)
    ck = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "ck-assign", "enable.auto.commit": False})
    ck.assign([CkTP(topic, 0, 0)])
    ck.commit(offsets=[CkTP(topic, 0, 6, metadata="ck")], asynchronous=False)
    ck.close()
    assert fetch_committed(broker.bootstrap, "kp-assign") == {(topic, 0): (4, "kp")}
    # librdkafka sends the metadata string with its terminating NUL; the broker keeps what it was given
    assert fetch_committed(broker.bootstrap, "ck-assign") == {(topic, 0): (6, "ck\x00")}
    from kafka.admin import KafkaAdminClient
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    listed = {g["group_id"]: (g["protocol_type"], g["group_state"]) for g in admin.list_groups()}
    admin.close()
    assert listed == {"kp-assign": ("", "Empty"), "ck-assign": ("", "Empty")}


def test_reader_pattern_resumes_from_the_applications_own_offset(broker):
    """Effectively-once: the application stores each output together with the next offset, crashes without any
    commit, and a new reader seeks to the stored offset; the output holds every record exactly once."""
    from aiokafka import AIOKafkaConsumer, TopicPartition as AioTP
    from confluent_kafka import Consumer, TopicPartition as CkTP
    from kafka import KafkaConsumer, TopicPartition
    topic = "reader"
    create_topic(broker.bootstrap, topic, 1)
    produced = produce(broker.bootstrap, topic, 0, 60, partitions=1)
    output: list[str] = []
    stored = {"next": 0}  # written atomically with output in a real application

    def kp_reader(limit):
        c = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None, enable_auto_commit=False)
        c.assign([TopicPartition(topic, 0)])
        c.seek(TopicPartition(topic, 0), stored["next"])
        for r in kp_read(c, limit):
            output.append(r.value.decode())
            stored["next"] = r.offset + 1
        c.close()

    def ck_reader(limit):
        c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "unused-reader", "enable.auto.commit": False})
        c.assign([CkTP(topic, 0, stored["next"])])
        deadline = time.monotonic() + 20
        taken = 0
        while taken < limit and time.monotonic() < deadline:
            for m in c.consume(limit - taken, timeout=0.3):
                if m.error() is None:
                    output.append(m.value().decode())
                    stored["next"] = m.offset() + 1
                    taken += 1
        c.close()

    async def aio_reader(limit):
        c = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None, enable_auto_commit=False)
        await c.start()
        try:
            c.assign([AioTP(topic, 0)])
            c.seek(AioTP(topic, 0), stored["next"])
            taken = 0
            deadline = time.monotonic() + 20
            while taken < limit and time.monotonic() < deadline:
                for batch in (await c.getmany(timeout_ms=300, max_records=limit - taken)).values():
                    for m in batch:
                        output.append(m.value.decode())
                        stored["next"] = m.offset + 1
                        taken += 1
        finally:
            await c.stop()

    kp_reader(17)
    ck_reader(21)
    asyncio.run(aio_reader(22))
    assert output == produced
    # nobody committed: the readers left no group behind
    from kafka.admin import KafkaAdminClient
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    assert admin.list_groups() == []
    admin.close()


# ---- members across a broker crash

@pytest.mark.parametrize("lib", ["confluent-kafka", "kafka-python"])
def test_live_members_rejoin_after_kill_9_and_nothing_is_skipped(broker_factory, lib):
    """Membership is not stored: after a crash the members learn they are unknown, rejoin, and resume at the
    committed offsets (kept in the cursors)."""
    from integration.test_groups_clients import ThreadMember, check_deliveries, wait_balanced, wait_delivered
    broker = broker_factory({"group.min.session.timeout.ms": "1000"})
    topic, group = f"crash-{lib}", f"crash-group-{lib}"
    create_topic(broker.bootstrap, topic)
    produced = produce(broker.bootstrap, topic, 0, 120)
    members = [ThreadMember(lib, broker.bootstrap, topic, group, name) for name in "ab"]
    try:
        wait_balanced(members, "two members")
        wait_delivered(members, produced)
        broker.kill()
        broker.start()
        produced += produce(broker.bootstrap, topic, 120, 120)
        wait_delivered(members, produced, timeout=60)
        from kafka.admin import KafkaAdminClient
        admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
        try:
            def rejoined():
                g = admin.describe_groups([group])[group]
                return g["group_state"] == "Stable" and len(g["members"]) == 2
            wait_for(rejoined, "both members to rejoin the restarted broker")
        finally:
            admin.close()
        wait_balanced(members, "two members after the restart")
    finally:
        for m in members:
            m.leave()
    check_deliveries(members, produced)
