"""PIP-6 deduplication driven through the admin API of a real broker: runtime disable and enable, snapshots by
entry count and by time, recovery from snapshot + replay after a crash, and write-failure fencing under a real
idempotent client. Batches that must be retried exactly are hand-made ProduceRequest v9s (kafka-python's protocol
classes); the stream is confluent-kafka's."""
import threading
import time

import pytest

from integration.broker_process import BrokerProcess
from integration.idem_raw import RawKafka, idempotent_batch, read_topic
from dedup import kafka_snapshot
from integration.waiting import wait_until
from kop.admin.client import AdminClient, topic_resource
from protocol.errors import ErrorCode

DEDUP_CURSOR = "pulsar.dedup"


def admin(broker: BrokerProcess) -> AdminClient:
    return AdminClient(broker.admin_url)


def partition_stats(broker: BrokerProcess, topic: str) -> dict:
    return admin(broker).get(topic_resource(f"{topic}-partition-0", "stats"))


def internal_stats(broker: BrokerProcess, topic: str) -> dict:
    return admin(broker).get(topic_resource(f"{topic}-partition-0", "internalStats"))


def snapshot_at_last_entry(broker: BrokerProcess, topic: str) -> bool:
    """Whether the partition's dedup snapshot is at its last entry (a recovery now replays nothing after it)."""
    stats = internal_stats(broker, topic)
    return stats["cursors"][DEDUP_CURSOR]["markDeletePosition"] == stats["lastConfirmedEntry"]


def set_topic_dedup(broker: BrokerProcess, topic: str, enabled: bool) -> None:
    admin(broker).post(topic_resource(topic, "deduplicationEnabled"), enabled)


def entry_id(position: str) -> tuple[int, int]:
    ledger, entry = position.split(":")
    return int(ledger), int(entry)


def stored_values(broker: BrokerProcess, topic: str) -> list[bytes]:
    return [r.value for r in read_topic(broker.port, topic, [0])]


def send(kafka: RawKafka, topic: str, pid: int, seq: int, values: list[bytes]) -> int:
    """One idempotent batch (epoch 0); must be answered NONE; returns the base offset it was answered with."""
    answer = kafka.produce(topic, 0, idempotent_batch(values, producer_id=pid, epoch=0, base_sequence=seq))
    assert answer.error_code == ErrorCode.NONE, answer
    return answer.base_offset


def test_runtime_disable_and_enable(start_broker):
    broker = start_broker()
    topic = "toggled"
    with RawKafka(broker.port) as kafka:
        assert kafka.create_topic(topic) == ErrorCode.NONE
        pid = kafka.init_producer_id().producer_id
        name = f"KOP-PID-{pid}-0"

        # On (the default): a retried batch is stored once and answered with its original offset.
        assert send(kafka, topic, pid, 0, [b"a0", b"a1"]) == 0
        assert send(kafka, topic, pid, 0, [b"a0", b"a1"]) == 0
        stats = partition_stats(broker, topic)
        assert stats["deduplicationStatus"] == "Enabled"
        assert [(p["producerId"], p["producerName"], p["lastSequenceId"]) for p in stats["publishers"]] == [
            (pid, name, 1)]
        assert DEDUP_CURSOR in internal_stats(broker, topic)["cursors"]

        # Off: the dedup cursor is deleted, producer state is gone, and a retry is stored again.
        set_topic_dedup(broker, topic, False)
        stats = partition_stats(broker, topic)
        assert stats["deduplicationStatus"] == "Disabled" and stats["publishers"] == []
        assert DEDUP_CURSOR not in internal_stats(broker, topic)["cursors"]
        assert send(kafka, topic, pid, 2, [b"b2"]) == 2
        assert send(kafka, topic, pid, 2, [b"b2"]) == 3
        assert stored_values(broker, topic) == [b"a0", b"a1", b"b2", b"b2"]

        # On again: a fresh start at the end of the log; what came before is not deduplicated...
        set_topic_dedup(broker, topic, True)
        stats = partition_stats(broker, topic)
        assert stats["deduplicationStatus"] == "Enabled" and stats["publishers"] == []
        cursor = internal_stats(broker, topic)["cursors"][DEDUP_CURSOR]
        assert cursor == {"markDeletePosition": internal_stats(broker, topic)["lastConfirmedEntry"],
                          "properties": {}, "stringProperties": {}}
        assert send(kafka, topic, pid, 0, [b"a0", b"a1"]) == 4
        # ...and from here on a retry is stored once again.
        assert send(kafka, topic, pid, 0, [b"a0", b"a1"]) == 4
        assert send(kafka, topic, pid, 2, [b"c2"]) == 6
        assert send(kafka, topic, pid, 2, [b"c2"]) == 6
    assert stored_values(broker, topic) == [b"a0", b"a1", b"b2", b"b2", b"a0", b"a1", b"c2"]
    publishers = partition_stats(broker, topic)["publishers"]
    assert [(p["producerName"], p["lastSequenceId"], p["lastSequenceIdWire"]) for p in publishers] == [(name, 2, 2)]


def test_snapshot_every_n_entries(start_broker):
    # Time-based snapshots off, so only the entry count can move the cursor.
    broker = start_broker({"brokerDeduplicationEntriesInterval": "10",
                           "brokerDeduplicationSnapshotFrequencyInSeconds": "0"})
    topic = "counted"
    with RawKafka(broker.port) as kafka:
        assert kafka.create_topic(topic) == ErrorCode.NONE
        pid = kafka.init_producer_id().producer_id
        for seq in range(25):
            send(kafka, topic, pid, seq, [f"v{seq}".encode()])

    def cursor() -> dict:
        return internal_stats(broker, topic)["cursors"][DEDUP_CURSOR]

    stats = internal_stats(broker, topic)
    ledger, last = entry_id(stats["lastConfirmedEntry"])
    assert last == 24
    # Snapshots after the 10th and the 20th entry: the mark-delete sits on entry 19 with sequence 19 recorded.
    assert wait_until(lambda: entry_id(cursor()["markDeletePosition"]) == (ledger, 19), timeout=10), cursor()
    properties = cursor()["properties"]
    assert properties[f"KOP-PID-{pid}-0"] == 19
    # The five recent batches (Kafka's window) travel with the snapshot.
    [(producer_id, epoch, batches)] = kafka_snapshot.unpack(cursor()["stringProperties"], properties)
    assert (producer_id, epoch, [b[1] for b in batches]) == (pid, 0, list(range(15, 20)))


def test_snapshot_by_time_follows_the_topic_interval(start_broker):
    # The snapshot monitor runs every second; the broker's interval (120 s) is far longer than the test.
    broker = start_broker({"brokerDeduplicationSnapshotFrequencyInSeconds": "1"})
    with RawKafka(broker.port) as kafka:
        for topic in ("timed", "untimed"):
            assert kafka.create_topic(topic) == ErrorCode.NONE
        admin(broker).post(topic_resource("timed", "deduplicationSnapshotInterval"), 1)
        pid = kafka.init_producer_id().producer_id
        for topic in ("timed", "untimed"):
            for seq in range(3):
                send(kafka, topic, pid, seq, [f"{topic}{seq}".encode()])
    assert admin(broker).get(topic_resource("untimed", "deduplicationSnapshotInterval"), applied=True) == 120

    # No more traffic: only the timer (every 1 s, interval 1 s) can move the mark-delete to the last entry.
    assert wait_until(lambda: snapshot_at_last_entry(broker, "timed"), timeout=15)
    assert internal_stats(broker, "timed")["cursors"][DEDUP_CURSOR]["properties"][f"KOP-PID-{pid}-0"] == 2
    assert not snapshot_at_last_entry(broker, "untimed")
    assert internal_stats(broker, "untimed")["cursors"][DEDUP_CURSOR]["markDeletePosition"] == "-1:-1"


def test_recovery_from_snapshot_and_replay_after_kill(start_broker):
    broker = start_broker({"brokerDeduplicationEntriesInterval": "10",
                           "brokerDeduplicationSnapshotFrequencyInSeconds": "0"})
    topic = "recovered"
    with RawKafka(broker.port) as kafka:
        assert kafka.create_topic(topic) == ErrorCode.NONE
        pid = kafka.init_producer_id().producer_id
        offsets = {seq: send(kafka, topic, pid, seq, [f"v{seq}".encode(), f"w{seq}".encode()]) for seq in
                   range(0, 50, 2)}
    name = f"KOP-PID-{pid}-0"
    assert wait_until(lambda: entry_id(internal_stats(broker, topic)["cursors"][DEDUP_CURSOR]
                                       ["markDeletePosition"])[1] == 19, timeout=10)
    before = partition_stats(broker, topic)["publishers"]
    assert [(p["producerId"], p["producerEpoch"], p["lastSequenceId"]) for p in before] == [(pid, 0, 49)]

    broker.restart(hard=True)  # kill -9: the state comes back from the snapshot at entry 19 plus 5 replayed

    after = partition_stats(broker, topic)
    assert after["deduplicationStatus"] == "Enabled"
    assert after["publishers"] == before
    cursor = internal_stats(broker, topic)["cursors"][DEDUP_CURSOR]
    assert entry_id(cursor["markDeletePosition"])[1] == 19 and cursor["properties"][name] == 39
    with RawKafka(broker.port) as kafka:
        # Retries of the last batch, and of one still in the five-batch window, get their original offsets.
        assert send(kafka, topic, pid, 48, [b"v48", b"w48"]) == offsets[48] == 48
        assert send(kafka, topic, pid, 42, [b"v42", b"w42"]) == offsets[42]
        # Older than the window: already stored, with no offset to give (the client counts it a success).
        old = idempotent_batch([b"v2", b"w2"], producer_id=pid, epoch=0, base_sequence=2)
        assert kafka.produce(topic, 0, old).error_code == ErrorCode.DUPLICATE_SEQUENCE_NUMBER
        assert send(kafka, topic, pid, 50, [b"v50"]) == 50
    values = stored_values(broker, topic)
    assert values == [v for seq in range(0, 50, 2) for v in (f"v{seq}".encode(), f"w{seq}".encode())] + [b"v50"]


def test_write_failures_fence_and_every_value_is_stored_once_in_order(start_broker):
    from confluent_kafka import Producer

    broker = start_broker({"adminFailpointsEnabled": "true"})
    topic = "fenced"
    count, injections = 1500, (300, 700, 1100)  # a failed flush after roughly these many values were sent
    with RawKafka(broker.port) as kafka:
        assert kafka.create_topic(topic) == ErrorCode.NONE
    reports: dict[bytes, tuple[str | None, int]] = {}
    lock = threading.Lock()

    def on_delivery(err, msg) -> None:
        with lock:
            reports[msg.value()] = (None if err is None else err.name(), msg.offset())

    # One message per request and no linger: five requests really are in flight when a flush fails.
    producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "acks": "all",
                         "max.in.flight.requests.per.connection": 5, "linger.ms": 0, "batch.num.messages": 1,
                         "message.timeout.ms": 60_000, "retry.backoff.ms": 20})
    values = [f"f-{i}".encode() for i in range(count)]
    for i, value in enumerate(values):
        if i in injections:
            admin(broker).post(f"/admin/v2/kop/failpoints/{topic}/0", {"write_failures": 1})
        producer.produce(topic, value=value, partition=0, on_delivery=on_delivery)
        producer.poll(0)
        if i % 50 == 49:  # keep the stream going at the broker's pace, so each injection lands mid-stream
            producer.flush(30)
    assert producer.flush(90) == 0

    errors = {v: r for v, r in reports.items() if r[0] is not None}
    assert len(reports) == count and not errors, list(errors.items())[:5]
    stored = read_topic(broker.port, topic, [0])
    assert [r.value for r in stored] == values  # exactly once, in order
    assert all(reports[r.value][1] == r.offset for r in stored)  # delivery reports name the stored offsets
    # No request was answered OUT_OF_ORDER_SEQUENCE_NUMBER (librdkafka would have bumped its epoch and started its
    # sequences again at 0): the batches pipelined behind a failed write were told to retry, and were stored later.
    assert len({r.producer_id for r in stored}) == 1
    sequences = [r.base_sequence for r in stored]
    assert sequences == list(range(count)), [(i, s) for i, s in enumerate(sequences) if s != i][:5]
    # Each injected failure failed one flush, which rolled the ledger: ledger ids 0..3 were used.
    ledgers = internal_stats(broker, topic)["ledgers"]
    assert ledgers[-1]["ledgerId"] == len(injections), ledgers


def test_system_topics_are_never_deduplicated(start_broker):
    broker = start_broker()
    with RawKafka(broker.port) as kafka:
        assert kafka.create_topic("__kop_system") == ErrorCode.NONE
    set_topic_dedup(broker, "__kop_system", True)
    assert admin(broker).get(topic_resource("__kop_system", "deduplicationEnabled"), applied=True) is True
    assert partition_stats(broker, "__kop_system")["deduplicationStatus"] == "Disabled"
    assert DEDUP_CURSOR not in internal_stats(broker, "__kop_system")["cursors"]


def test_stats_show_the_monotonic_and_the_wire_sequence_across_the_wrap(start_broker):
    broker = start_broker()
    topic = "wrapped"
    with RawKafka(broker.port) as kafka:
        assert kafka.create_topic(topic) == ErrorCode.NONE
        pid = kafka.init_producer_id().producer_id
        assert send(kafka, topic, pid, 2**31 - 2, [b"x", b"y"]) == 0  # sequences 2147483646, 2147483647
        assert send(kafka, topic, pid, 0, [b"z"]) == 2  # the int32 sequence wrapped to 0
        assert send(kafka, topic, pid, 0, [b"z"]) == 2  # and its retry is still a retry
    [publisher] = partition_stats(broker, topic)["publishers"]
    assert (publisher["lastSequenceId"], publisher["lastSequenceIdWire"]) == (2**31, 0)
    assert [(b["firstSequence"], b["lastSequence"], b["baseOffset"]) for b in publisher["recentBatches"]] == [
        (2**31 - 2, 2**31 - 1, 0), (0, 0, 2)]
    assert stored_values(broker, topic) == [b"x", b"y", b"z"]


def test_the_purge_loop_drops_inactive_producers_from_the_state_and_the_snapshot(start_broker):
    """Pulsar's inactivity purge (issue #15204 checks it the same way, through the pulsar.dedup cursor's properties),
    with the test knob that gives the timeout in seconds: the purge loop runs every timeout / 3."""
    broker = start_broker({"testDedupProducerInactivityTimeoutSeconds": "2",
                           "brokerDeduplicationEntriesInterval": "1",
                           "brokerDeduplicationSnapshotFrequencyInSeconds": "0"})
    topic = "purged"

    def properties() -> dict:
        return internal_stats(broker, topic)["cursors"][DEDUP_CURSOR]["properties"]

    with RawKafka(broker.port) as kafka:
        assert kafka.create_topic(topic) == ErrorCode.NONE
        idle, active = kafka.init_producer_id().producer_id, kafka.init_producer_id().producer_id
        idle_name, active_name = f"KOP-PID-{idle}-0", f"KOP-PID-{active}-0"
        assert send(kafka, topic, idle, 0, [b"i0", b"i1"]) == 0
        assert wait_until(lambda: idle_name in properties(), timeout=10)  # snapshotted after every entry
        seq = 0
        for _ in range(300):  # the active producer keeps writing while the idle one stays quiet
            send(kafka, topic, active, seq, [b"a%d" % seq])
            seq += 1
            if idle_name not in properties():
                break
            time.sleep(0.05)
        assert wait_until(lambda: properties().get(active_name) == seq - 1, timeout=10)  # the last snapshot landed
        snapshot = internal_stats(broker, topic)["cursors"][DEDUP_CURSOR]
        assert idle_name not in snapshot["properties"]
        assert {p for p, _, _ in kafka_snapshot.unpack(snapshot["stringProperties"], {})} == {active}, snapshot
        assert [p["producerName"] for p in partition_stats(broker, topic)["publishers"]] == [active_name]

    broker.restart(hard=True)  # kill -9: the purge's snapshot is what the state comes back from
    assert idle_name not in properties()
    assert [p["producerName"] for p in partition_stats(broker, topic)["publishers"]] == [active_name]
    with RawKafka(broker.port) as kafka:
        # Past the inactivity window dedup is not promised (Pulsar's rule): the purged producer starts afresh.
        assert send(kafka, topic, idle, 0, [b"i0", b"i1"]) == seq + 2
        assert send(kafka, topic, active, seq - 1, [b"a%d" % (seq - 1)]) == seq + 1  # still deduplicated
