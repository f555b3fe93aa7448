"""Where a consumer group resumes, with real clients against a real kop process: after auto-commits (a restarted
consumer starts at the last one, between what it confirmed and what it had read: nothing skipped), with
auto.offset.reset=latest when an offset is committed (the commit wins, not the end of the log), and from a
committed offset that retention has left below the log start (as Kafka: the fetch is OFFSET_OUT_OF_RANGE and
auto.offset.reset applies, since retention does not wait for groups). Also OFFSET_METADATA_TOO_LARGE, counted in
Java String.length() units as Kafka does."""
import time

import pytest

from integration.test_groups_clients import create_topic, kp_subscribe, produce
from integration.test_groups_offsets import fetch_committed, kp_read, wait_for

N = 100
FIRST_READ = 40
SECOND_READ = 10


def kp_member(bootstrap: str, topic: str, group: str, **config):
    """A kafka-python group member subscribed so that its first rebalance is its only one (see kp_subscribe)."""
    from kafka import KafkaConsumer
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, **config)
    kp_subscribe(consumer, topic)
    return consumer


# ---- auto-commit

def _kp_auto_commit_run(bootstrap: str, topic: str, group: str) -> tuple[dict[int, int], list[tuple[int, int]]]:
    """Read FIRST_READ records, wait for an auto-commit to cover them, read SECOND_READ more and stop without a
    final commit (as a crash would). Returns the offsets the auto-commit was seen to cover and every (partition,
    offset) read."""
    from kafka import TopicPartition
    consumer = kp_member(bootstrap, topic, group, enable_auto_commit=True, auto_commit_interval_ms=200,
                         auto_offset_reset="earliest", max_poll_records=10)
    try:
        read = [(r.partition, r.offset) for r in kp_read(consumer, FIRST_READ)]
        covered = _next_offsets(read)
        parts = [TopicPartition(topic, p) for p in (0, 1)]
        consumer.pause(*parts)

        def auto_committed():
            consumer.poll(timeout_ms=100)  # auto-commits run inside poll()
            return all(consumer.committed(TopicPartition(topic, p)) == o for p, o in covered.items())
        wait_for(auto_committed, "an auto-commit of the records read")
        consumer.resume(*parts)
        read += [(r.partition, r.offset) for r in kp_read(consumer, SECOND_READ)]
    finally:
        consumer.close(autocommit=False)
    return covered, read


def _ck_auto_commit_run(bootstrap: str, topic: str, group: str) -> tuple[dict[int, int], list[tuple[int, int]]]:
    from confluent_kafka import Consumer, TopicPartition
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": True,
                         "auto.commit.interval.ms": 200, "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])

    def take(count):
        out = []
        deadline = time.monotonic() + 30
        while len(out) < count and time.monotonic() < deadline:
            out += [(m.partition(), m.offset()) for m in consumer.consume(count - len(out), timeout=0.2)
                    if m.error() is None]
        return out
    try:
        read = take(FIRST_READ)
        covered = _next_offsets(read)
        consumer.pause(consumer.assignment())

        def auto_committed():
            consumer.poll(0.1)
            committed = consumer.committed([TopicPartition(topic, p) for p in covered], timeout=10)
            return {tp.partition: tp.offset for tp in committed} == covered
        wait_for(auto_committed, "an auto-commit of the records read")
        consumer.resume(consumer.assignment())
        read += take(SECOND_READ)
    finally:
        consumer.close()  # librdkafka commits once more on close: the resume point is then all it read
    return covered, read


def _next_offsets(read: list[tuple[int, int]]) -> dict[int, int]:
    return {p: max(o for q, o in read if q == p) + 1 for p in {p for p, _ in read}}


AUTO_COMMIT_RUNS = {"kafka-python": _kp_auto_commit_run, "confluent-kafka": _ck_auto_commit_run}


@pytest.mark.parametrize("lib", list(AUTO_COMMIT_RUNS))
def test_a_restarted_auto_committing_consumer_resumes_at_its_last_auto_commit(broker, lib):
    topic, group = f"auto-{lib}", f"auto-group-{lib}"
    create_topic(broker.bootstrap, topic, 2)
    produce(broker.bootstrap, topic, 0, N, partitions=2)
    covered, first = AUTO_COMMIT_RUNS[lib](broker.bootstrap, topic, group)
    assert len(first) == FIRST_READ + SECOND_READ
    read_up_to = _next_offsets(first)
    committed = {p: o for (_, p), (o, _) in fetch_committed(broker.bootstrap, group).items()}
    for p, offset in committed.items():
        assert covered.get(p, 0) <= offset <= read_up_to.get(p, 0), (p, covered, committed, read_up_to)
    second = kp_member(broker.bootstrap, topic, group, enable_auto_commit=True, auto_commit_interval_ms=200,
                       auto_offset_reset="earliest")
    resumed = [(r.partition, r.offset) for r in kp_read(second, N - sum(committed.values()))]
    second.close()
    end = N // 2
    assert {p: min((o for q, o in resumed if q == p), default=end) for p in (0, 1)} == \
        {p: committed.get(p, 0) for p in (0, 1)}
    # nothing skipped; read twice only what came after the last auto-commit
    assert sorted(set(first) | set(resumed)) == sorted((i % 2, i // 2) for i in range(N))
    assert len(resumed) == len(set(resumed)) == N - sum(committed.values())


# ---- auto.offset.reset=latest with a committed offset

@pytest.mark.parametrize("lib", ["confluent-kafka", "kafka-python"])
def test_latest_reset_resumes_at_the_committed_offset_not_at_the_end(broker, lib):
    from confluent_kafka import Consumer
    from kafka import KafkaConsumer, TopicPartition
    from kafka.structs import OffsetAndMetadata
    topic, group = f"latest-{lib}", f"latest-group-{lib}"
    create_topic(broker.bootstrap, topic, 1)
    produce(broker.bootstrap, topic, 0, 10, partitions=1)
    committer = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=group, enable_auto_commit=False)
    committer.commit({TopicPartition(topic, 0): OffsetAndMetadata(3, "", -1)})
    committer.close(autocommit=False)
    seen: list[int] = []
    if lib == "confluent-kafka":
        consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "auto.offset.reset": "latest",
                             "enable.auto.commit": False})
        consumer.subscribe([topic])

        def drained():
            seen.extend(m.offset() for m in consumer.consume(10, timeout=0.2) if m.error() is None)
            return len(seen) >= 7
        wait_for(drained, "the records after the commit")
        consumer.close()
    else:
        consumer = kp_member(broker.bootstrap, topic, group, auto_offset_reset="latest", enable_auto_commit=False)
        seen += [r.offset for r in kp_read(consumer, 7)]
        consumer.close(autocommit=False)
    assert seen == list(range(3, 10))


# ---- a committed offset below the log start

@pytest.fixture
def aged_group(broker_factory):
    """A topic that retention has trimmed past offset 2 (to `start`, then 3 more records, offsets 20-22), and groups
    that committed offset 2 before that."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic
    from kafka import KafkaConsumer, TopicPartition
    from kafka.structs import OffsetAndMetadata
    broker = broker_factory({"log.segment.bytes": "2000", "retention_check_interval_ms": "300",
                             "brokerDeduplicationEnabled": "false"})
    topic, tp = "aged", TopicPartition("aged", 0)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1, config={"retention.ms": "500"})])[topic].result(10)
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(20):  # old timestamps: retention may delete every ledger but the one being written
        producer.produce(topic, value=str(i).encode() * 250, timestamp=1_700_000_000_000 + i)
        assert producer.flush(10) == 0
    for group in ("aged-ck-earliest", "aged-ck-error", "aged-kp-earliest", "aged-kp-latest"):
        committer = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=group, enable_auto_commit=False)
        committer.commit({tp: OffsetAndMetadata(2, "", -1)})
        committer.close(autocommit=False)
    reader = KafkaConsumer(bootstrap_servers=broker.bootstrap)
    try:
        wait_for(lambda: reader.beginning_offsets([tp])[tp] > 2,
                 "retention to move the log start past the committed offset")
        # retention has done its part: the fresh records below must outlive the slowest member's join
        altered = admin.alter_configs([ConfigResource("topic", topic, set_config={"retention.ms": "-1"})])
        altered[ConfigResource("topic", topic)].result(10)
        produce(broker.bootstrap, topic, 20, 3, partitions=1)  # fresh records: the log start may have reached the end
        time.sleep(1.0)  # a retention pass that began before the change (every 300 ms) has ended: the start holds
        start = reader.beginning_offsets([tp])[tp]
    finally:
        reader.close()
    return broker, tp, start


def _ck_first(bootstrap: str, topic: str, group: str, reset: str):
    """The first record, or error event, a confluent member of the group gets; a record is committed."""
    from confluent_kafka import Consumer
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": reset,
                         "enable.auto.commit": False})
    consumer.subscribe([topic])
    try:
        msg = wait_for(lambda: consumer.poll(0.2), f"a first record or error for {group}")
        if msg.error() is None:
            consumer.commit(msg, asynchronous=False)
        return msg
    finally:
        consumer.close()


def test_a_committed_offset_below_the_log_start_is_out_of_range_and_auto_offset_reset_applies(aged_group):
    from confluent_kafka import KafkaError
    broker, tp, start = aged_group
    earliest = _ck_first(broker.bootstrap, tp.topic, "aged-ck-earliest", "earliest")
    assert earliest.error() is None and earliest.offset() == start
    assert fetch_committed(broker.bootstrap, "aged-ck-earliest")[(tp.topic, 0)][0] == start + 1
    refused = _ck_first(broker.bootstrap, tp.topic, "aged-ck-error", "error")
    assert refused.error().code() == KafkaError._AUTO_OFFSET_RESET
    assert "out of range" in refused.error().str().lower()
    kp = kp_member(broker.bootstrap, tp.topic, "aged-kp-earliest", auto_offset_reset="earliest",
                   enable_auto_commit=False)
    assert kp_read(kp, 1)[0].offset == start
    kp.close(autocommit=False)
    kp = kp_member(broker.bootstrap, tp.topic, "aged-kp-latest", auto_offset_reset="latest",
                   enable_auto_commit=False)
    # the committed offset 2 is the position first; the out-of-range fetch moves it to the end
    wait_for(lambda: kp.poll(timeout_ms=100) == {} and kp.assignment() and kp.position(tp) == 23,
             "the latest reset")
    produce(broker.bootstrap, tp.topic, 23, 1, partitions=1)
    assert [r.offset for r in kp_read(kp, 1)] == [23]
    kp.close(autocommit=False)
    # a group that did not commit since keeps its offset: the broker never moves a group's offset itself
    assert fetch_committed(broker.bootstrap, "aged-ck-error")[(tp.topic, 0)][0] == 2


# ---- offset metadata size

def test_kafka_python_commit_with_too_much_metadata_gets_offset_metadata_too_large(broker):
    from kafka import KafkaConsumer, TopicPartition
    from kafka.admin import KafkaAdminClient
    from kafka.errors import OffsetMetadataTooLargeError
    from kafka.structs import OffsetAndMetadata
    topic = "meta-size"
    create_topic(broker.bootstrap, topic, 1)
    tp = TopicPartition(topic, 0)
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id="meta-size", enable_auto_commit=False)
    consumer.assign([tp])
    at_limit = "\u00e9" * 4096  # 4096 UTF-16 units (Kafka's String.length()), 8192 UTF-8 bytes: accepted
    consumer.commit({tp: OffsetAndMetadata(2, at_limit, -1)})
    with pytest.raises(OffsetMetadataTooLargeError):
        consumer.commit({tp: OffsetAndMetadata(4, "x" * 4097, -1)})
    consumer.close(autocommit=False)
    assert fetch_committed(broker.bootstrap, "meta-size") == {(topic, 0): (2, at_limit)}
    refused = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id="meta-size-refused",
                            enable_auto_commit=False)
    refused.assign([tp])
    with pytest.raises(OffsetMetadataTooLargeError):
        refused.commit({tp: OffsetAndMetadata(1, "\U0001F600" * 2049, -1)})  # 4098 UTF-16 units
    refused.close(autocommit=False)
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        assert [g["group_id"] for g in admin.list_groups()] == ["meta-size"]  # a refused commit makes no group
    finally:
        admin.close()
