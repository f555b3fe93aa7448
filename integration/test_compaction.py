"""Log compaction (cleanup.policy=compact) with real clients: every client reads the latest value of each key at the
offsets it was written at, tombstones go once delete.retention.ms has passed, an idempotent producer's state
survives compaction and a kill -9 (its retries are still recognised, its sequence goes on), a kill -9 in the
middle of a compaction leaves the log as it was or as compacted, never in between, and so does one between a
rewrite's install and the record of it; with compact,delete retention deletes the oldest ledgers, compacted or not;
min.compaction.lag.ms keeps young records from the cleaner and max.compaction.lag.ms rolls the current ledger. On
PostgreSQL (`--storage postgresql`, and the last test on it always) the same holds, and a kill -9 inside the
transaction that installs a pass leaves every stored entry as it was: the next pass compacts it again."""
import asyncio
import json
import os
import re
import signal
import time
import urllib.request

import pytest

import asyncpg

from integration.broker_process import BrokerProcess
from integration.clients import aio_consume_all, ck_consume_all, ck_produce, kp_consume_all
from integration.idem_raw import OffsetOutOfRange, ProducerIdentity, RawKafka, read_topic
from integration.java_client import java_available, java_consume_all
from integration.txn_clients import READ_UNCOMMITTED, ck_abort, ck_commit, ck_read_to_end
from kop.admin.client import AdminClient as KopAdmin, topic_resource
from proto.kop_pb2 import ManagedLedgerInfo
from protocol.errors import ErrorCode
from protocol.records import Record, build_batch

FAST_CLEANER = {"log.cleaner.backoff.ms": "200", "log.retention.check.interval.ms": "200"}
COMPACTED = {"cleanup.policy": "compact", "segment.ms": "300", "min.cleanable.dirty.ratio": "0.01"}


@pytest.fixture
def broker(tmp_path):
    proc = BrokerProcess(str(tmp_path / "data"), admin_port=0, config=dict(FAST_CLEANER)).start()
    yield proc
    proc.stop()


def metric(broker: BrokerProcess, name: str) -> float:
    with urllib.request.urlopen(broker.admin_url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(found[1]) if found else 0.0


def wait_for_runs(broker: BrokerProcess, runs: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while metric(broker, "kop_compaction_runs_total") < runs:
        assert time.monotonic() < deadline, f"fewer than {runs} compaction runs within {timeout}s"
        time.sleep(0.2)


def create(broker: BrokerProcess, topic: str, **configs: str) -> None:
    with RawKafka(broker.port) as kafka:
        assert kafka.create_topic(topic, 1, {**COMPACTED, **configs}) == ErrorCode.NONE


def test_every_client_reads_the_latest_value_of_each_key_at_its_offset(broker):
    create(broker, "latest")
    records = [(b"k%d" % (i % 10), b"v%d" % i, [], 0) for i in range(200)]
    reports = ck_produce(broker.bootstrap, "latest", records, **{"enable.idempotence": True, "linger.ms": 5})
    assert [r[2] for r in reports] == list(range(200))
    wait_for_runs(broker, 1)
    expected = [(i, b"k%d" % (i % 10), b"v%d" % i) for i in range(190, 200)]
    assert metric(broker, "kop_compaction_records_removed_total") == 190
    with urllib.request.urlopen(f"{broker.admin_url}/admin/v2/persistent/public/default/latest-partition-0/stats",
                                timeout=10) as response:
        stats = json.load(response)["compaction"]
    assert (stats["runs"], stats["recordsRemoved"]) == (1, 190) and stats["bytesReclaimed"] > 0
    for consume in (ck_consume_all, kp_consume_all, aio_consume_all):
        got = consume(broker.bootstrap, "latest", expected=10)
        assert [(r.offset, r.key, r.value) for r in got] == expected, consume.__name__
    if java_available():
        got = java_consume_all(broker.bootstrap, "latest")
        assert [(r.offset, r.key, r.value) for r in got] == [(o, k.decode(), v.decode()) for o, k, v in expected]


@pytest.mark.slow  # 5-13 s of restarts, retention or snapshot rounds: make test-slow
def test_a_tombstone_stays_for_delete_retention_ms_then_goes(broker):
    create(broker, "tombs", **{"delete.retention.ms": "3000"})
    ck_produce(broker.bootstrap, "tombs", [(b"a", b"a1", [], 0), (b"a", b"a2", [], 0), (b"b", b"b1", [], 0),
                                          (b"b", None, [], 0)])
    wait_for_runs(broker, 1)
    got = ck_consume_all(broker.bootstrap, "tombs", expected=2)
    assert [(r.offset, r.key, r.value) for r in got] == [(1, b"a", b"a2"), (3, b"b", None)]  # readers see the delete
    time.sleep(3.5)  # the tombstone's ledger is now older than delete.retention.ms
    ck_produce(broker.bootstrap, "tombs", [(b"c", b"c1", [], 0)])  # new dirty data: the cleaner comes back
    wait_for_runs(broker, 2)
    got = ck_consume_all(broker.bootstrap, "tombs", expected=2)
    assert [(r.offset, r.key, r.value) for r in got] == [(1, b"a", b"a2"), (4, b"c", b"c1")]


@pytest.mark.slow  # waits out max.compaction.lag.ms: about 7 s
def test_the_cleaners_lag_shows_while_a_partition_waits_and_drops_to_zero_once_cleaned(broker):
    create(broker, "waiting", **{"min.cleanable.dirty.ratio": "0.5", "max.compaction.lag.ms": "4000"})
    ck_produce(broker.bootstrap, "waiting", [(b"k%d" % i, b"v" * 100, [], 0) for i in range(20)])
    wait_for_runs(broker, 1)  # all of it was dirty: cleaned at once (twenty keys: nothing to remove)
    ck_produce(broker.bootstrap, "waiting", [(b"k0", b"new", [], 0)])  # a little dirty data: well below 0.5
    lag = 'kop_compaction_lag_seconds{partition="0",topic="waiting"}'
    deadline = time.monotonic() + 30
    while metric(broker, lag) < 1.0:  # its ledger closed, but the partition waits for more dirty data
        assert time.monotonic() < deadline, "the cleaner's lag never showed"
        time.sleep(0.2)
    assert metric(broker, "kop_compaction_runs_total") == 1  # control: nothing was cleaned meanwhile
    wait_for_runs(broker, 2)  # max.compaction.lag.ms forces the pass
    assert metric(broker, lag) == 0.0 and metric(broker, "kop_compaction_records_removed_total") == 1


def wait_for_removed(broker: BrokerProcess, records: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while metric(broker, "kop_compaction_records_removed_total") < records:
        assert time.monotonic() < deadline, f"fewer than {records} records removed within {timeout}s"
        time.sleep(0.2)


@pytest.mark.slow  # three transactions, a compaction and a restart: about 8 s
def test_a_transactional_topic_is_compacted_and_its_transactions_rebuilt_after_a_kill_9(broker):
    """A committed transaction's records are compacted, an aborted one's removed, the markers kept: read_committed
    readers see each key's latest committed value, read_uncommitted ones no longer the aborted record, and after a
    kill -9 the transaction index is rebuilt from what compaction left (the next transaction reads to its end).
    Before, transactional batches stayed whole, so an exactly-once changelog never shrank."""
    from confluent_kafka import Producer
    create(broker, "txn-compacted")

    def transactions(*runs: tuple[list[tuple[bytes, bytes]], bool]) -> None:
        producer = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "compacted-writer"})
        producer.init_transactions(15)
        for items, commit in runs:
            producer.begin_transaction()
            for key, value in items:
                producer.produce("txn-compacted", value, key=key, partition=0)
            assert producer.flush(15) == 0
            (ck_commit if commit else ck_abort)(producer)

    transactions(([(b"a", b"a1"), (b"b", b"b1")], True),  # offsets 0-1, COMMIT at 2
                 ([(b"a", b"aborted")], False),  # 3, ABORT at 4
                 ([(b"a", b"a2")], True))  # 5, COMMIT at 6
    wait_for_removed(broker, 2)  # a1 (superseded by a2) and the aborted record
    assert ck_read_to_end(broker.bootstrap, "txn-compacted") == [(0, 1, b"b1"), (0, 5, b"a2")]
    assert ck_read_to_end(broker.bootstrap, "txn-compacted", isolation=READ_UNCOMMITTED) == \
        [(0, 1, b"b1"), (0, 5, b"a2")]
    broker.restart(hard=True)
    transactions(([(b"b", b"b2")], True))  # 7, COMMIT at 8
    # compacted again or not yet (b2's ledger may have closed and been cleaned already, which removes b1: on
    # PostgreSQL the restart starts a new ledger, so it often has): either way each key's latest, to the end
    assert ck_read_to_end(broker.bootstrap, "txn-compacted") in ([(0, 1, b"b1"), (0, 5, b"a2"), (0, 7, b"b2")],
                                                                 [(0, 5, b"a2"), (0, 7, b"b2")])


def keyed_batch(keys: list[bytes], value: bytes, *, producer_id: int, epoch: int, base_sequence: int) -> bytes:
    records = [Record(offset=i, timestamp=1_700_000_000_000 + i, key=k, value=value) for i, k in enumerate(keys)]
    return build_batch(records, producer_id=producer_id, producer_epoch=epoch, base_sequence=base_sequence)


def test_an_idempotent_producer_goes_on_across_compaction_and_a_kill_9(broker):
    create(broker, "idem")
    with RawKafka(broker.port) as kafka:
        ident = kafka.init_producer_id()
        batches = [keyed_batch([b"a", b"b"], b"%d" % n, producer_id=ident.producer_id, epoch=ident.producer_epoch,
                               base_sequence=2 * n) for n in range(3)]
        assert [kafka.produce("idem", 0, b).base_offset for b in batches] == [0, 2, 4]
    before = read_topic(broker.port, "idem", [0])
    wait_for_runs(broker, 1)
    after = read_topic(broker.port, "idem", [0])
    assert (len(before), [(r.offset, r.key, r.value) for r in after]) == (6, [(4, b"a", b"2"), (5, b"b", b"2")])
    broker.restart(hard=True)
    with RawKafka(broker.port) as kafka:
        # batches emptied by compaction still count: their retries are recognised, with the offsets first given
        retries = [kafka.produce("idem", 0, b) for b in batches]
        assert [(a.error_code, a.base_offset) for a in retries] == [(ErrorCode.NONE, 0), (ErrorCode.NONE, 2),
                                                                     (ErrorCode.NONE, 4)]
        following = kafka.produce("idem", 0, keyed_batch([b"a"], b"3", producer_id=ident.producer_id,
                                                         epoch=ident.producer_epoch, base_sequence=6))
        assert (following.error_code, following.base_offset) == (ErrorCode.NONE, 6)
    final = read_topic(broker.port, "idem", [0])
    assert [(r.offset, r.key, r.value, r.sequence) for r in final] == [(4, b"a", b"2", 4), (5, b"b", b"2", 5),
                                                                        (6, b"a", b"3", 6)]


BIG_VALUE, BIG_COUNT, BIG_KEYS = b"x" * 300, 30_000, 100


def fill_big_topic(broker: BrokerProcess, **config: str) -> None:
    """The topic "big", in 2 MiB ledgers, with BIG_COUNT records over BIG_KEYS keys: each value names its offset."""
    create(broker, "big", **{"segment.bytes": str(2 * 1024 * 1024), "segment.ms": "600000", **config})
    for start in range(0, BIG_COUNT, 5000):
        ck_produce(broker.bootstrap, "big", [(b"k%d" % (i % BIG_KEYS), BIG_VALUE + b"%d" % i, [], 0)
                                             for i in range(start, start + 5000)], **{"linger.ms": 20})


def assert_big_topic_whole(broker: BrokerProcess) -> None:
    """Every record "big" keeps is at its own offset, and each key's latest record is there."""
    latest = {}
    for record in read_topic(broker.port, "big", [0]):
        assert record.value == BIG_VALUE + b"%d" % record.offset
        latest[record.key] = record.offset
    assert latest == {b"k%d" % k: BIG_COUNT - BIG_KEYS + k for k in range(BIG_KEYS)}


@pytest.mark.slow
@pytest.mark.file_storage(reason="watches the file engine's rewrite files (PostgreSQL: the test after the next)")
def test_a_kill_9_during_compaction_leaves_the_log_whole(tmp_path):
    broker = BrokerProcess(str(tmp_path / "data"), admin_port=0, config=dict(FAST_CLEANER)).start()
    try:
        fill_big_topic(broker)
        ledgers = os.path.join(broker.data_dir, "ledgers", "public", "default", "big-partition-0")
        left: set[str] = set()
        for _ in range(5):  # kill -9 the moment a rewrite is on disk but not yet installed
            deadline = time.monotonic() + 60
            while not (caught := {n for n in os.listdir(ledgers) if ".compacting-" in n}):
                assert time.monotonic() < deadline, "no compaction was seen writing its files"
                time.sleep(0.002)
            broker.kill()
            left = caught & set(os.listdir(ledgers))
            if left:
                break
            broker.start()  # it was installed just before the kill: try again on the next pass
        assert left, "no kill landed while a rewrite was unfinished"  # the control: the fault happened
        broker.start()
        assert not left & set(os.listdir(ledgers))  # the unfinished rewrite went, never installed
        assert_big_topic_whole(broker)
    finally:
        broker.stop()


def test_a_librdkafka_idempotent_producer_keeps_its_sequence_across_compaction_and_a_kill_9(broker):
    from confluent_kafka import Producer
    create(broker, "ck-idem")
    reports = []
    producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "linger.ms": 5})

    def send(start: int) -> None:
        for i in range(start, start + 100):
            producer.produce("ck-idem", key=b"k%d" % (i % 10), value=b"v%d" % i, partition=0,
                             on_delivery=lambda err, msg: reports.append((err, msg.offset())))
        assert producer.flush(60) == 0
    send(0)
    wait_for_runs(broker, 1)
    broker.restart(hard=True)
    send(100)  # the same producer id and epoch, its sequence going on from what compaction kept
    assert [err for err, _ in reports if err is not None] == []
    assert [offset for _, offset in reports] == list(range(200))
    stored = read_topic(broker.port, "ck-idem", [0])  # compacted again or not yet: either way, each key's latest
    assert {r.key: (r.offset, r.value) for r in stored} == {b"k%d" % k: (190 + k, b"v%d" % (190 + k))
                                                            for k in range(10)}
    assert len(stored) < 200 and all(r.value == b"v%d" % r.offset for r in stored)


FAILPOINTS = {"adminFailpointsEnabled": "true"}
ONE_BATCH_A_LEDGER = {"segment.bytes": "14"}  # Kafka's least: each batch rolls the ledger before it


def kop_admin(broker: BrokerProcess) -> KopAdmin:
    return KopAdmin(broker.admin_url)


def compaction_stats(broker: BrokerProcess, topic: str) -> dict:
    return kop_admin(broker).get(topic_resource(f"{topic}-partition-0", "stats"))["compaction"]


def listed_ledgers(broker: BrokerProcess, topic: str) -> list[dict]:
    return kop_admin(broker).get(topic_resource(f"{topic}-partition-0", "internalStats"))["ledgers"]


def alter(broker: BrokerProcess, topic: str, **configs: str) -> None:
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET) for key, value in configs.items()])
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})  # kept alive until the answer is in
    admin.incremental_alter_configs([resource])[resource].result(10)


def produce_batches(broker: BrokerProcess, topic: str, batches: list[list[tuple[bytes, bytes | None]]]) -> list[int]:
    """One produce request per batch, in order; returns their base offsets."""
    with RawKafka(broker.port) as kafka:
        answers = [kafka.produce(topic, 0, build_batch([Record(offset=i, timestamp=int(time.time() * 1000), key=k,
                                                               value=v) for i, (k, v) in enumerate(batch)]))
                   for batch in batches]
    assert [a.error_code for a in answers] == [ErrorCode.NONE] * len(batches)
    return [a.base_offset for a in answers]


def start_offset(broker: BrokerProcess, topic: str) -> int:
    with RawKafka(broker.port) as kafka:
        return kafka.start_offsets(topic, [0])[0]


def stored(broker: BrokerProcess, topic: str) -> list[tuple[int, bytes, bytes | None]]:
    """Every record from the log start offset to the end. Retention may move the start between the two requests:
    then the start is asked again, as a consumer resets its position."""
    with RawKafka(broker.port) as kafka:
        for _ in range(20):
            try:
                records = kafka.read_partition(topic, 0, start=kafka.start_offsets(topic, [0])[0])
                return [(r.offset, r.key, r.value) for r in records]
            except OffsetOutOfRange:
                time.sleep(0.1)
    raise AssertionError(f"{topic}'s log start offset kept moving for 20 reads")


def test_compact_delete_compacts_what_retention_bytes_keeps_and_deletes_the_oldest_ledgers(broker):
    """cleanup.policy=compact,delete: the cleaner compacts the closed ledgers and retention.bytes deletes the oldest
    of them, rewritten or not, as Kafka deletes compacted segments. A reader sees the latest value of each key among
    what retention kept. The same layout with cleanup.policy=compact alone is the control: retention leaves it
    whole."""
    layout = [[(b"a", b"a1"), (b"b", b"b1"), (b"c", b"c1")], [(b"a", b"a2")], [(b"b", b"b2")], [(b"a", b"a3")],
              [(b"d", b"d1")]]  # offsets 0-2, 3, 4, 5 and 6, one ledger each; the last stays current
    for topic, policy in (("both", "compact,delete"), ("compact-only", "compact")):
        create(broker, topic, **{**ONE_BATCH_A_LEDGER, "cleanup.policy": policy})
        assert produce_batches(broker, topic, layout) == [0, 3, 4, 5, 6]
    wait_for_removed(broker, 6)  # a1, b1, a2 of each topic
    compacted = [(2, b"c", b"c1"), (4, b"b", b"b2"), (5, b"a", b"a3"), (6, b"d", b"d1")]
    assert stored(broker, "both") == stored(broker, "compact-only") == compacted
    sizes = [ledger["size"] for ledger in listed_ledgers(broker, "both")]
    assert len(sizes) in (5, 6)  # five ledgers, and an empty current one once segment.ms rolled d1's
    # Kafka's rule: the oldest ledger goes while the rest still hold retention.bytes; this keeps the three newest
    for topic in ("both", "compact-only"):
        alter(broker, topic, **{"retention.bytes": str(sum(sizes[2:]))})
    deadline = time.monotonic() + 30
    while (start := start_offset(broker, "both")) < 4:
        assert time.monotonic() < deadline, "retention.bytes never deleted the compacted ledgers"
        time.sleep(0.2)
    assert start == 4  # the ledgers of offsets 0-2 (compacted) and 3 (emptied by compaction) went
    assert stored(broker, "both") == compacted[1:]  # c1 went with its ledger, as in Kafka
    assert stored(broker, "compact-only") == compacted  # the control: no retention without `delete`


def test_compact_delete_retention_ms_deletes_compacted_ledgers_and_the_cleaner_goes_on(broker):
    """cleanup.policy=compact,delete with retention.ms: compacted ledgers past it go (every one here, the current
    ledger too, as retention.ms=1 allows), offsets go on, and the cleaner compacts what comes after."""
    create(broker, "aging", **{**ONE_BATCH_A_LEDGER, "cleanup.policy": "compact,delete"})
    assert produce_batches(broker, "aging", [[(b"a", b"a1")], [(b"a", b"a2")], [(b"b", b"b1")]]) == [0, 1, 2]
    wait_for_removed(broker, 1)
    assert stored(broker, "aging") == [(1, b"a", b"a2"), (2, b"b", b"b1")]
    alter(broker, "aging", **{"retention.ms": "1"})
    deadline = time.monotonic() + 30
    while stored(broker, "aging"):
        assert time.monotonic() < deadline, "retention.ms never deleted the compacted ledgers"
        time.sleep(0.2)
    assert start_offset(broker, "aging") == 3
    alter(broker, "aging", **{"retention.ms": "3600000"})
    assert produce_batches(broker, "aging", [[(b"e", b"e1")], [(b"e", b"e2")], [(b"f", b"f1")]]) == [3, 4, 5]
    wait_for_removed(broker, 2)  # e1
    assert stored(broker, "aging") == [(4, b"e", b"e2"), (5, b"f", b"f1")]
    assert [(r.offset, r.key, r.value) for r in ck_consume_all(broker.bootstrap, "aging", expected=2)] == \
        [(4, b"e", b"e2"), (5, b"f", b"f1")]


def test_min_compaction_lag_keeps_records_from_the_cleaner_until_their_ledger_is_that_old(broker):
    """Records in ledgers closed less than min.compaction.lag.ms ago are neither removed nor supersede older
    versions; once the lag allows, they are compacted. A topic with the same records and no lag is the control
    that the cleaner went over both (the lagged one first, in every pass)."""
    layout = [[(b"a", b"a1")], [(b"a", b"a2")], [(b"b", b"b1")]]
    create(broker, "lagged", **{**ONE_BATCH_A_LEDGER, "min.compaction.lag.ms": "3600000"})
    create(broker, "unlagged", **ONE_BATCH_A_LEDGER)
    for topic in ("lagged", "unlagged"):
        assert produce_batches(broker, topic, layout) == [0, 1, 2]
    wait_for_removed(broker, 1)  # the control: unlagged's a1
    assert stored(broker, "unlagged") == [(1, b"a", b"a2"), (2, b"b", b"b1")]
    assert stored(broker, "lagged") == [(0, b"a", b"a1"), (1, b"a", b"a2"), (2, b"b", b"b1")]
    assert compaction_stats(broker, "lagged")["runs"] == 0
    alter(broker, "lagged", **{"min.compaction.lag.ms": "1"})
    wait_for_removed(broker, 2)
    assert stored(broker, "lagged") == [(1, b"a", b"a2"), (2, b"b", b"b1")]
    assert compaction_stats(broker, "lagged")["recordsRemoved"] == 1


def test_max_compaction_lag_rolls_the_current_ledger_so_it_gets_cleaned(broker):
    """Kafka's rule (KIP-354): the current ledger is never cleaned, so it rolls once it is max.compaction.lag.ms
    old whatever segment.ms says; before, a quiet compacted topic kept every version until segment.ms (a week)."""
    create(broker, "quiet", **{"segment.ms": "604800000", "max.compaction.lag.ms": "500"})
    assert produce_batches(broker, "quiet", [[(b"a", b"a1"), (b"a", b"a2")]]) == [0]
    wait_for_removed(broker, 1)
    assert stored(broker, "quiet") == [(1, b"a", b"a2")]


def cleaned_through_on_disk(broker: BrokerProcess, topic: str) -> tuple[str | None, dict[int, int], dict[int, int]]:
    """What ledgers.info records (the cleaned-through property, each ledger's listed size) and each ledger's
    size on disk."""
    directory = os.path.join(broker.data_dir, "ledgers", "public", "default", f"{topic}-partition-0")
    info = ManagedLedgerInfo()
    with open(os.path.join(directory, "ledgers.info"), "rb") as f:
        info.ParseFromString(f.read())
    properties = {p.key: p.value for p in info.properties}
    listed = {li.ledgerId: li.size for li in info.ledgerInfo}
    on_disk = {ledger_id: os.path.getsize(os.path.join(directory, f"{ledger_id}.log")) for ledger_id in listed}
    return properties.get("kop.cleaned_through"), listed, on_disk


def fill_window(broker: BrokerProcess) -> tuple[ProducerIdentity, list[bytes]]:
    """The topic "window" in one ledger, however slow: an idempotent producer's four batches of keys a, b and c."""
    create(broker, "window", **{"segment.ms": "600000"})
    with RawKafka(broker.port) as kafka:
        ident = kafka.init_producer_id()
        batches = [keyed_batch([b"a", b"b", b"c"], b"%d" % n, producer_id=ident.producer_id,
                               epoch=ident.producer_epoch, base_sequence=3 * n) for n in range(4)]
        assert [kafka.produce("window", 0, b).base_offset for b in batches] == [0, 3, 6, 9]
    return ident, batches


def assert_window_retries_recognised(broker: BrokerProcess, ident: ProducerIdentity, batches: list[bytes]) -> None:
    """Every batch of fill_window's, emptied by compaction or not, is a retry answered with its first offset; the
    producer's next batch follows them."""
    with RawKafka(broker.port) as kafka:
        retries = [kafka.produce("window", 0, b) for b in batches]
        assert [(a.error_code, a.base_offset) for a in retries] == [(ErrorCode.NONE, o) for o in (0, 3, 6, 9)]
        following = kafka.produce("window", 0, keyed_batch([b"a"], b"4", producer_id=ident.producer_id,
                                                           epoch=ident.producer_epoch, base_sequence=12))
        assert (following.error_code, following.base_offset) == (ErrorCode.NONE, 12)


@pytest.mark.slow  # two broker starts, a cleaner process each, and a kill: about 10 s
@pytest.mark.file_storage(reason="reads the file engine's ledgers.info (PostgreSQL: the test after this one)")
def test_a_kill_9_between_installing_a_rewrite_and_recording_it_loses_and_repeats_nothing(tmp_path):
    """The rewrite is the ledger once renamed over it; ledgers.info records how far the cleaner got a moment later.
    A kill -9 between the two (a failpoint) leaves the compacted ledger under a list that does not know it: after
    the restart every reader gets each key's latest at its own offset, no record twice and none lost, the
    idempotent producer's retries are still recognised, and the cleaner carries on from the ledgers it thought
    dirty."""
    broker = BrokerProcess(str(tmp_path / "data"), admin_port=0, config={**FAST_CLEANER, **FAILPOINTS}).start()
    try:
        ident, batches = fill_window(broker)
        kop_admin(broker).post("/admin/v2/kop/failpoints/window/0", {"crash_before_cleaned_through": True})
        alter(broker, "window", **{"segment.ms": "300"})  # now it rolls, and the cleaner's first pass rewrites it
        # the control: the broker killed itself at the failpoint, after the rewrite was renamed into place
        assert broker.proc.wait(30) == -signal.SIGKILL
        assert "failpoint: killing the broker before recording ledger" in broker.log_tail(200)
        cleaned_through, listed, on_disk = cleaned_through_on_disk(broker, "window")
        assert cleaned_through is None  # not recorded ...
        assert any(on_disk[i] < listed[i] for i in listed)  # ... but a ledger is already its smaller rewrite
        broker.start()
        latest = [(9, b"a", b"3"), (10, b"b", b"3"), (11, b"c", b"3")]
        assert stored(broker, "window") == latest
        assert [(r.offset, r.key, r.value) for r in ck_consume_all(broker.bootstrap, "window", expected=3)] == latest
        assert_window_retries_recognised(broker, ident, batches)
        wait_for_removed(broker, 1)  # the cleaner goes on: a@9 is superseded by a@12
        assert stored(broker, "window") == [(10, b"b", b"3"), (11, b"c", b"3"), (12, b"a", b"4")]
        assert cleaned_through_on_disk(broker, "window")[0] is not None
    finally:
        broker.stop()


def stored_on_postgresql(url: str, topic: str) -> tuple[int, list[tuple[int, int, int, int]]]:
    """The managed ledger's cleaned-through point and its entry rows (ledger id, entry id, first offset, bytes)."""
    async def query():
        conn = await asyncpg.connect(url)
        try:
            name = await conn.fetchval("SELECT name FROM kop_managed_ledger WHERE name LIKE $1",
                                       f"%/{topic}-partition-0")
            through = await conn.fetchval("SELECT cleaned_through FROM kop_managed_ledger WHERE name = $1", name)
            rows = await conn.fetch("SELECT ledger_id, entry_id, first_index, length(entry) FROM kop_entry "
                                    "WHERE name = $1 ORDER BY ledger_id, entry_id", name)
            return through, [tuple(r) for r in rows]
        finally:
            await conn.close()
    return asyncio.run(query())


@pytest.mark.slow  # two broker starts and a kill: about 8 s
def test_on_postgresql_a_kill_9_before_a_pass_commits_changes_nothing_and_the_next_pass_compacts(tmp_path,
                                                                                                 postgres_url):
    """On PostgreSQL a pass's changed entries and its cleaned-through point are one fenced transaction. A kill -9
    inside it (a failpoint: every statement ran, the commit did not) leaves every entry row and the point as they
    were; after the restart the cleaner compacts the ledger again, in place (the same positions and offsets), and
    the idempotent producer's retries are still recognised."""
    broker = BrokerProcess(str(tmp_path / "data"), admin_port=0, config={**FAST_CLEANER, **FAILPOINTS},
                           options=("--storage", postgres_url)).start()
    try:
        ident, batches = fill_window(broker)
        before = stored_on_postgresql(postgres_url, "window")
        assert before[0] == -1 and len(before[1]) == 4
        kop_admin(broker).post("/admin/v2/kop/failpoints/window/0", {"crash_before_cleaned_through": True})
        alter(broker, "window", **{"segment.ms": "300"})  # now it rolls, and the cleaner's first pass rewrites it
        assert broker.proc.wait(30) == -signal.SIGKILL  # the control: the broker killed itself in the transaction
        assert "failpoint: killing the broker before recording ledger" in broker.log_tail(200)
        assert stored_on_postgresql(postgres_url, "window") == before  # nothing of the pass was committed
        broker.start()
        wait_for_removed(broker, 9)  # the pass again: a, b and c of the first three batches
        latest = [(9, b"a", b"3"), (10, b"b", b"3"), (11, b"c", b"3")]
        assert stored(broker, "window") == latest
        assert [(r.offset, r.key, r.value) for r in ck_consume_all(broker.bootstrap, "window", expected=3)] == latest
        through, rows = stored_on_postgresql(postgres_url, "window")
        assert through >= 0 and [r[:3] for r in rows] == [r[:3] for r in before[1]]  # same positions and offsets
        assert [r[3] < b[3] for r, b in zip(rows, before[1])] == [True, True, True, False]  # three batches emptied
        assert_window_retries_recognised(broker, ident, batches)
    finally:
        broker.stop()


def passes_started(broker: BrokerProcess, topic: str) -> list[int]:
    """The last ledger of each compaction pass the broker's log shows starting on the topic's partition 0."""
    with open(broker.log_path, "rb") as f:
        return [int(m) for m in re.findall(rb"%s-0: compacting ledgers \d+-(\d+)" % topic.encode(), f.read())]


@pytest.mark.slow  # 30 000 records, up to five kills and restarts
def test_on_postgresql_a_kill_9_during_compaction_leaves_the_log_whole(tmp_path, postgres_url):
    """A kill -9 while the cleaner works on PostgreSQL (its pass logged, its transaction not committed) leaves the
    log as it was: after the restart every record kept is at its own offset and each key's latest is there."""
    broker = BrokerProcess(str(tmp_path / "data"), admin_port=0, config=dict(FAST_CLEANER),
                           options=("--storage", postgres_url)).start()
    try:
        fill_big_topic(broker, **{"min.compaction.lag.ms": "3600000"})  # nothing is cleaned while it is written
        assert passes_started(broker, "big") == []
        alter(broker, "big", **{"min.compaction.lag.ms": "0"})  # now one pass takes every closed ledger
        interrupted, seen = False, 0
        for _ in range(5):  # kill -9 the moment a pass starts; it landed before the commit if the point is behind
            deadline = time.monotonic() + 60
            while True:
                passes = passes_started(broker, "big")
                if len(passes) > seen:
                    break
                assert time.monotonic() < deadline, "no compaction pass was seen starting"
                time.sleep(0.002)
            broker.kill()
            interrupted = stored_on_postgresql(postgres_url, "big")[0] < passes[-1]
            if interrupted:
                break
            seen = len(passes)
            broker.start()  # it committed just before the kill: try again on the next pass
        assert interrupted, "no kill landed while a pass was uncommitted"  # the control: the fault happened
        broker.start()
        assert_big_topic_whole(broker)
    finally:
        broker.stop()
