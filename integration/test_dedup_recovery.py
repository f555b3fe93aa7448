"""The PIP-6 core at a real broker where its state is being rebuilt or was partly lost: batches answered while dedup
recovers, the snapshot cap, a full replay over an era without dedup, a duplicate's original log-append time, and a
write stuck on the disk. Batches that must be retried exactly are hand-made Produce v9 requests; the streams are
confluent-kafka's idempotent producer with five requests in flight."""
import glob
import os
import threading
import time

import pytest
from confluent_kafka import Producer

from integration.idem_raw import RawKafka, idempotent_batch, plain_batch, read_topic
from integration.test_dedup_cursor_damage import damage_length_field, dedup_records
from integration.test_dedup_policies import admin, partition_stats, set_topic_dedup, snapshot_at_last_entry
from integration.waiting import wait_until
from protocol.errors import ErrorCode

FAILPOINTS = {"adminFailpointsEnabled": "true"}


def failpoint(broker, topic: str, **faults) -> None:
    admin(broker).post(f"/admin/v2/kop/failpoints/{topic}/0", faults)


def values(prefix: str, count: int) -> list[bytes]:
    return [b"%s-%d" % (prefix.encode(), i) for i in range(count)]


def produce(kafka: RawKafka, topic: str, pid: int, seq: int, value: bytes, **options):
    return kafka.produce(topic, 0, idempotent_batch([value], producer_id=pid, epoch=0, base_sequence=seq), **options)


def answer(reply) -> tuple[ErrorCode, int]:
    return ErrorCode(reply.error_code), reply.base_offset



def ten_stored_with_dedup_off(broker, kafka: RawKafka, topic: str, count: int) -> tuple[int, list[bytes]]:
    """A new topic with deduplication off, and a producer id whose sequences 0-9 are stored at offsets 0-9; returns
    the producer id and the `count` values its batches carry (value i for sequence i)."""
    assert kafka.create_topic(topic) == ErrorCode.NONE
    set_topic_dedup(broker, topic, False)
    pid = kafka.init_producer_id().producer_id
    sent = values(topic, count)
    for seq in range(10):
        assert answer(produce(kafka, topic, pid, seq, sent[seq])) == (ErrorCode.NONE, seq)
    return pid, sent

def test_a_batch_answered_while_dedup_recovers_is_not_overtaken_by_its_follower(start_broker):
    """The reproduction: dedup enabled at run time knows nothing of the producer; seq 10 is answered 'being
    recovered'; were seq 11 taken once the state is ready, the resend of 10 would be called a duplicate: lost."""
    broker = start_broker(FAILPOINTS)
    topic = "enabled-mid-stream"
    with RawKafka(broker.port) as kafka, RawKafka(broker.port) as other:
        pid, sent = ten_stored_with_dedup_off(broker, kafka, topic, 12)
        # A write held on the disk keeps the recovery of the runtime enable waiting for it.
        failpoint(broker, topic, hold_flushes=True)
        held = other.send_produce(topic, 0, plain_batch([b"held"]))
        enabling = threading.Thread(target=set_topic_dedup, args=(broker, topic, True))
        enabling.start()
        assert wait_until(lambda: partition_stats(broker, topic)["deduplicationStatus"] == "Recovering", 10)
        assert answer(produce(kafka, topic, pid, 10, sent[10])) == (ErrorCode.REQUEST_TIMED_OUT, -1)
        failpoint(broker, topic, hold_flushes=False)
        enabling.join(30)
        assert answer(other.receive_produce(held)) == (ErrorCode.NONE, 10)
        assert partition_stats(broker, topic)["deduplicationStatus"] == "Enabled"
        # Pipelined behind 10: the same retriable answer until 10 is resent.
        assert answer(produce(kafka, topic, pid, 11, sent[11])) == (ErrorCode.REQUEST_TIMED_OUT, -1)
        assert answer(produce(kafka, topic, pid, 10, sent[10])) == (ErrorCode.NONE, 11)
        assert answer(produce(kafka, topic, pid, 11, sent[11])) == (ErrorCode.NONE, 12)
    assert [r.value for r in read_topic(broker.port, topic, [0])] == sent[:10] + [b"held"] + sent[10:]


def test_an_idempotent_client_loses_nothing_when_dedup_is_enabled_and_its_recovery_fails(start_broker):
    """confluent-kafka, five requests in flight, one record per request: dedup is enabled at run time and its first
    recovery fails (a read error), so every batch is answered 'being recovered' until the retried recovery succeeds
    mid-pipeline. Control: the broker did answer batches that way."""
    broker = start_broker(FAILPOINTS)
    topic = "recovery-fails"
    with RawKafka(broker.port) as kafka:
        assert kafka.create_topic(topic) == ErrorCode.NONE
    set_topic_dedup(broker, topic, False)
    count, enable_at = 600, 200
    reports: dict[bytes, tuple[str | None, int]] = {}
    lock = threading.Lock()

    def on_delivery(err, msg) -> None:
        with lock:
            reports[msg.value()] = (None if err is None else err.name(), msg.offset())

    producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "acks": "all",
                         "max.in.flight.requests.per.connection": 5, "linger.ms": 0, "batch.num.messages": 1,
                         "message.timeout.ms": 60_000, "retry.backoff.ms": 20})
    sent = values(topic, count)
    for i, value in enumerate(sent):
        if i == enable_at:
            failpoint(broker, topic, replay_read_failures=1)
            set_topic_dedup(broker, topic, True)
        producer.produce(topic, value=value, partition=0, on_delivery=on_delivery)
        producer.poll(0)
        if i % 50 == 49:
            producer.flush(30)
    assert producer.flush(90) == 0

    assert partition_stats(broker, topic)["deduplicationStatus"] == "Enabled"
    errors = {v: r for v, r in reports.items() if r[0] is not None}
    assert len(reports) == count and not errors, list(errors.items())[:5]
    stored = read_topic(broker.port, topic, [0])
    assert [r.value for r in stored] == sent  # none lost, none twice, in order
    assert all(reports[r.value][1] == r.offset for r in stored)
    assert [r.base_sequence for r in stored] == list(range(count))
    log = open(broker.log_path).read()
    assert "dedup recovery failed" in log and "rejected (7)" in log  # the control: the window was there


def test_the_snapshot_cap_keeps_the_newest_producers_across_kill_9(start_broker):
    """With more producers than brokerDeduplicationMaxNumberOfProducers, those left out of the snapshot lose their
    state in a crash: they must be the ones written longest ago, not the newest and busiest."""
    # Time snapshots every second: the last one is taken at the last entry.
    broker = start_broker({"brokerDeduplicationMaxNumberOfProducers": "2",
                           "brokerDeduplicationSnapshotFrequencyInSeconds": "1",
                           "brokerDeduplicationSnapshotIntervalSeconds": "1"})
    topic = "capped"
    with RawKafka(broker.port) as kafka:
        assert kafka.create_topic(topic) == ErrorCode.NONE
        old, older, busy = (kafka.init_producer_id().producer_id for _ in range(3))
        assert answer(produce(kafka, topic, old, 0, b"old")) == (ErrorCode.NONE, 0)
        assert answer(produce(kafka, topic, older, 0, b"older")) == (ErrorCode.NONE, 1)
        busy_values = values("busy", 6)
        for seq, value in enumerate(busy_values):
            assert answer(produce(kafka, topic, busy, seq, value)) == (ErrorCode.NONE, 2 + seq)
    assert wait_until(lambda: snapshot_at_last_entry(broker, topic), 10)
    broker.kill()
    broker.start()
    with RawKafka(broker.port) as kafka:
        # The busy producer's retry of a batch the replay no longer covers: its original offset, not a new record.
        assert answer(produce(kafka, topic, busy, 2, busy_values[2])) == (ErrorCode.NONE, 4)
    assert len(read_topic(broker.port, topic, [0])) == 8


@pytest.mark.file_storage
def test_a_full_replay_over_an_era_without_dedup_does_not_move_a_producer_backwards(start_broker):
    """While dedup was off a retried batch was stored twice (seq 5 after 9). A full replay (the dedup cursor lost
    to damage) must leave the producer at 9: its retry of 6 is a duplicate, its next batch 10 is next."""
    broker = start_broker({"brokerDeduplicationEntriesInterval": "1000000"})
    topic = "replayed"
    with RawKafka(broker.port) as kafka:
        pid, sent = ten_stored_with_dedup_off(broker, kafka, topic, 11)
        assert answer(produce(kafka, topic, pid, 5, sent[5])) == (ErrorCode.NONE, 10)  # dedup off: stored again
    set_topic_dedup(broker, topic, True)  # the cursor's one record: at the end of the log
    broker.kill()
    [path] = glob.glob(os.path.join(broker.data_dir, "ledgers", "*", "*", f"{topic}-partition-0", "cursors.log"))
    damage_length_field(path, dedup_records(path)[-1][0])  # lost: the recovery replays the whole log
    broker.start()
    with RawKafka(broker.port) as kafka:
        assert answer(produce(kafka, topic, pid, 6, sent[6])) == (ErrorCode.NONE, 6)  # its original offset
        assert answer(produce(kafka, topic, pid, 10, sent[10])) == (ErrorCode.NONE, 11)
    assert [r.value for r in read_topic(broker.port, topic, [0])] == sent[:10] + [sent[5], sent[10]]


def test_a_duplicate_on_a_log_append_time_topic_is_answered_with_the_original_append_time(start_broker):
    broker = start_broker()
    topic = "append-time"
    with RawKafka(broker.port) as kafka:
        assert kafka.create_topic(topic, configs={"message.timestamp.type": "LogAppendTime"}) == ErrorCode.NONE
        pid = kafka.init_producer_id().producer_id
        first = produce(kafka, topic, pid, 0, b"a")
        assert first.error_code == ErrorCode.NONE and first.log_append_time_ms > 0
        time.sleep(0.02)  # the clock moves on: a new append time would differ
        again = produce(kafka, topic, pid, 0, b"a")
        assert (again.error_code, again.base_offset) == (ErrorCode.NONE, 0)
        assert again.log_append_time_ms == first.log_append_time_ms
        [stored] = kafka.read_partition(topic, 0)
        assert stored.value == b"a"


def test_a_retry_of_a_write_stuck_on_the_disk_times_out_retriably_then_gets_the_original_offset(start_broker):
    broker = start_broker(FAILPOINTS)
    topic = "stuck"
    with RawKafka(broker.port) as kafka, RawKafka(broker.port) as retrier:
        assert kafka.create_topic(topic) == ErrorCode.NONE
        pid = kafka.init_producer_id().producer_id
        assert answer(produce(kafka, topic, pid, 0, b"a")) == (ErrorCode.NONE, 0)
        failpoint(broker, topic, hold_flushes=True)
        stuck = kafka.send_produce(topic, 0, idempotent_batch([b"b"], producer_id=pid, epoch=0, base_sequence=1))
        assert retrier.end_offsets(topic, [0]) == {0: 1}  # not durable, not visible
        # The client gave up on the request and sent the batch again: it waits for the original, then times out.
        retried = produce(retrier, topic, pid, 1, b"b", timeout_ms=300)
        assert answer(retried) == (ErrorCode.REQUEST_TIMED_OUT, -1)
        failpoint(broker, topic, hold_flushes=False)
        assert answer(kafka.receive_produce(stuck)) == (ErrorCode.NONE, 1)
        assert answer(produce(retrier, topic, pid, 1, b"b")) == (ErrorCode.NONE, 1)
    assert [r.value for r in read_topic(broker.port, topic, [0])] == [b"a", b"b"]
