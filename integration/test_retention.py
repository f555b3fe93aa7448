"""Retention and ledger rollover through a real broker: retention by time reaches a quiet topic's current ledger
(with the default 256 MB ledgers), retention.bytes keeps the newest bytes, and a topic's segment.bytes and segment.ms
decide when its ledgers roll, also after AlterConfigs changes them."""
import time

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic
from kafka import KafkaConsumer, TopicPartition

from integration.broker_process import BrokerProcess
from integration.clients import ck_produce, kp_consume_all
from integration.waiting import wait_until
from kop.admin.client import AdminClient as KopAdmin, topic_resource

FAST_RETENTION = {"retention_check_interval_ms": "200", "brokerDeduplicationEnabled": "false"}


@pytest.fixture
def broker(tmp_path):
    proc = BrokerProcess(str(tmp_path / "data"), admin_port=0, config=dict(FAST_RETENTION)).start()
    yield proc
    proc.stop()


def create(broker, topic: str, **configs: str) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1, config=configs)])[topic].result(10)


def ledgers(broker, topic: str) -> list[dict]:
    return KopAdmin(broker.admin_url).get(topic_resource(f"{topic}-partition-0", "internalStats"))["ledgers"]


def offsets(broker, topic: str) -> tuple[int, int]:
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None)
    tp = TopicPartition(topic, 0)
    try:
        return consumer.beginning_offsets([tp])[tp], consumer.end_offsets([tp])[tp]
    finally:
        consumer.close()


def produce(broker, topic: str, count: int, size: int = 100) -> None:
    for i in range(count):  # one batch each
        ck_produce(broker.bootstrap, topic, [(None, bytes([i]) * size, [], int(time.time() * 1000))])


def eventually(condition) -> bool:
    """Retention runs every 200 ms here: whether `condition` came to hold within 20 s."""
    return wait_until(condition, timeout=20.0, interval=0.2)


def test_retention_by_time_deletes_a_quiet_topics_records_without_small_ledgers(broker):
    create(broker, "quiet", **{"retention.ms": "1000"})
    create(broker, "kept", **{"retention.ms": "3600000"})
    for topic in ("quiet", "kept"):
        produce(broker, topic, 5)
    assert eventually(lambda: offsets(broker, "quiet") == (5, 5)), offsets(broker, "quiet")
    assert offsets(broker, "kept") == (0, 5)
    produce(broker, "quiet", 1)  # offsets go on; the new record is there
    assert [m.offset for m in kp_consume_all(broker.bootstrap, "quiet", 1)] == [5]


def test_segment_ms_rolls_an_idle_ledger_and_retention_then_deletes_it(broker):
    create(broker, "rolling", **{"segment.ms": "500", "retention.ms": "3600000"})
    produce(broker, "rolling", 3)
    # the retention task closes the idle ledger once it is 500 ms old; a new, empty one takes the next records
    rolled = eventually(lambda: [l["entries"] for l in ledgers(broker, "rolling")] == [3, 0])
    assert rolled, ledgers(broker, "rolling")
    assert offsets(broker, "rolling") == (0, 3)  # within retention: kept
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    resource = ConfigResource(ConfigResource.Type.TOPIC, "rolling", incremental_configs=[
        ConfigEntry("retention.ms", "100", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([resource])[resource].result(10)
    assert eventually(lambda: offsets(broker, "rolling") == (3, 3)), offsets(broker, "rolling")


def test_retention_bytes_keeps_the_newest_ledgers(broker):
    create(broker, "sized", **{"segment.bytes": "1000", "retention.bytes": "3000"})
    produce(broker, "sized", 20, size=400)  # two or three batches a ledger

    def sizes():
        return [l["size"] for l in ledgers(broker, "sized") if l["entries"]]
    # Kafka's rule: the oldest goes while the rest still hold retention.bytes, so 3000 bytes or a bit more remain
    assert eventually(lambda: sum(sizes()) - sizes()[0] < 3000), sizes()
    assert sum(sizes()) >= 3000
    start, end = offsets(broker, "sized")
    assert 0 < start and end == 20
    got = kp_consume_all(broker.bootstrap, "sized", 20 - start)
    assert [m.offset for m in got] == list(range(start, 20))


def test_segment_bytes_is_per_topic_and_follows_alter_configs(broker):
    create(broker, "small", **{"segment.bytes": "1000"})
    create(broker, "large")  # the broker's 256 MB
    for topic in ("small", "large"):
        produce(broker, topic, 6, size=400)
    assert len([l for l in ledgers(broker, "small") if l["entries"]]) >= 2
    assert len([l for l in ledgers(broker, "large") if l["entries"]]) == 1
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    resource = ConfigResource(ConfigResource.Type.TOPIC, "large", incremental_configs=[
        ConfigEntry("segment.bytes", "1000", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([resource])[resource].result(10)
    before = len(ledgers(broker, "large"))
    produce(broker, "large", 6, size=400)
    assert len(ledgers(broker, "large")) >= before + 2
    resource = ConfigResource(ConfigResource.Type.TOPIC, "small", incremental_configs=[
        ConfigEntry("segment.bytes", "", incremental_operation=AlterConfigOpType.DELETE)])
    admin.incremental_alter_configs([resource])[resource].result(10)  # back to the broker's 256 MB
    produce(broker, "small", 1, size=400)  # the full current ledger rolls once more, then no more
    before = len(ledgers(broker, "small"))
    produce(broker, "small", 6, size=400)
    assert len(ledgers(broker, "small")) == before
    described = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, "large")])
    entries = next(iter(described.values())).result(10)
    assert entries["segment.bytes"].value == "1000" and not entries["segment.bytes"].is_default
    assert entries["segment.ms"].value == str(7 * 24 * 3600 * 1000) and entries["segment.ms"].is_default


def test_segment_configs_below_kafkas_minimum_are_refused(broker):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for config in ({"segment.bytes": "13"}, {"segment.ms": "0"}):
        future = admin.create_topics([NewTopic("bad", 1, 1, config=config)])["bad"]
        with pytest.raises(Exception, match="at least"):
            future.result(10)


@pytest.mark.slow  # 5-13 s of restarts, retention or snapshot rounds: make test-slow
def test_retention_by_time_reaches_a_quiet_idempotent_topic_with_dedup_on(tmp_path):
    """Deduplication is on by default, and its cursor's records (the snapshot and its fallback) would hold a quiet
    topic's ledger for ever: no new entry means no new snapshot. Retention snapshots again at the last entry, deletes
    the ledger, and the producer's state survives the deletion and a kill -9."""
    proc = BrokerProcess(str(tmp_path / "data"), admin_port=0, config={"retention_check_interval_ms": "200"}).start()
    try:
        create(proc, "quiet-idem", **{"retention.ms": "1000"})
        producer = Producer({"bootstrap.servers": proc.bootstrap, "enable.idempotence": True, "linger.ms": 0})
        reports = []
        for i in range(5):
            producer.produce("quiet-idem", value=b"v%d" % i, partition=0,
                             on_delivery=lambda err, msg: reports.append((err, msg.offset())))
            producer.flush(10)
        assert reports == [(None, i) for i in range(5)]
        assert eventually(lambda: offsets(proc, "quiet-idem") == (5, 5)), (offsets(proc, "quiet-idem"),
                                                                           ledgers(proc, "quiet-idem"))
        producer.produce("quiet-idem", value=b"v5", partition=0,
                         on_delivery=lambda err, msg: reports.append((err, msg.offset())))
        producer.flush(10)
        assert reports[-1] == (None, 5)  # the same producer goes on where it was
        proc.kill()
        proc.start()  # dedup recovery with its snapshot's ledger deleted
        producer.produce("quiet-idem", value=b"v6", partition=0,
                         on_delivery=lambda err, msg: reports.append((err, msg.offset())))
        producer.flush(30)
        assert reports[-1] == (None, 6)
        stored = [(m.offset, m.value) for m in kp_consume_all(proc.bootstrap, "quiet-idem", 2, timeout=10)]
        # v5 may be gone by now: its ledger is older than retention.ms (1 s) once the restart took longer than that
        assert stored in ([(5, b"v5"), (6, b"v6")], [(6, b"v6")]), stored
    finally:
        proc.stop()


def test_retention_keeps_an_open_transactions_records_until_it_ends(broker):
    """Records of an open transaction stay past retention (a restart must find the transaction open, read_committed
    consumers have yet to get them); once it commits, retention deletes them with its marker."""
    from confluent_kafka import Producer as TxnProducer
    for topic in ("txn-kept", "plain-gone"):
        create(broker, topic, **{"retention.ms": "1000"})
    producer = TxnProducer({"bootstrap.servers": broker.bootstrap, "transactional.id": "retained"})
    producer.init_transactions(15)
    producer.begin_transaction()
    for i in range(3):
        producer.produce("txn-kept", b"open-%d" % i, partition=0)
    assert producer.flush(15) == 0
    produce(broker, "plain-gone", 3)
    assert eventually(lambda: offsets(broker, "plain-gone") == (3, 3))  # control: retention ran and was due
    time.sleep(1.0)
    assert offsets(broker, "txn-kept") == (0, 3)
    producer.commit_transaction(15)
    assert eventually(lambda: offsets(broker, "txn-kept") == (4, 4)), offsets(broker, "txn-kept")  # with the marker
