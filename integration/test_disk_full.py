"""A full disk under an idempotent producer: the broker's data directory is a 48 MiB tmpfs of its own, filled by a
filler file but for a margin while a stream is produced. Writes that do not fit are refused with a retriable error;
the broker stays up, serves what it stored, and takes writes again, without a restart, once the filler is deleted.
Nothing acknowledged is lost, nothing is stored twice, nothing half-written is ever visible, and the cursor log
(consumer group commits, dedup snapshots) comes back whole after a kill -9 that follows the episode.
"""
import threading
import time

import pytest

from integration.broker_process import BrokerProcess
from integration.fault_proxy import FaultProxy
from integration.idem_raw import RawKafka, plain_batch, read_topic
from integration.idem_stream import DELIVERY_TIMEOUT_S, Report, check_stream, confluent_stream
from integration.small_disk import Filler, small_disk
from integration.waiting import wait_for
from kop.admin.client import AdminClient, topic_resource
from protocol.errors import ErrorCode

pytestmark = pytest.mark.file_storage  # the file engine's own files and descriptors

TOPIC = "full"
PARTITIONS = 2
COUNT = 6000
PAD = b"x" * 1000  # ~6 MB in all: the first MB fits the margin, the rest waits for the space to come back
MARGIN = 1024 * 1024
GROUP = "full-readers"
RETRIABLE = {ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.KAFKA_STORAGE_ERROR, ErrorCode.REQUEST_TIMED_OUT}


def values(topic: str = TOPIC, count: int = COUNT) -> list[bytes]:
    """Numbered last, so the client's key (k + number) spreads them over the partitions."""
    return [b"%s-%s-%d" % (PAD, topic.encode(), i) for i in range(count)]


def produce(bootstrap: str, sent: list[bytes], out: list[Report], topic: str = TOPIC) -> None:
    out.extend(confluent_stream(bootstrap, topic, sent, idempotent=True, compression="none"))


def commit(bootstrap: str, offsets: dict[int, int], metadata: str = "") -> bool:
    """Commit offsets for GROUP; whether the broker took them."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP, "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(TOPIC, p, o, metadata=metadata) for p, o in offsets.items()],
                        asynchronous=False)
        return True
    except KafkaException:
        return False
    finally:
        consumer.close()


def committed(bootstrap: str) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP, "enable.auto.commit": False})
    try:
        answer = consumer.committed([TopicPartition(TOPIC, p) for p in range(PARTITIONS)], timeout=10)
        return {tp.partition: tp.offset for tp in answer}
    finally:
        consumer.close()


def dedup_snapshots(broker: BrokerProcess) -> dict[int, dict]:
    """The pulsar.dedup cursor of each partition (position and properties) as internal stats show it."""
    admin = AdminClient(broker.admin_url)
    out = {}
    for p in range(PARTITIONS):
        stats = admin.get(topic_resource(f"{TOPIC}-partition-{p}", "internalStats"))
        out[p] = stats["cursors"]["pulsar.dedup"]
    return out


def refusals(proxy: FaultProxy, at_least: int = 10) -> dict[int, int]:
    """The error codes of the Produce answers the producer got, once there are at_least of them."""
    errors = {code: n for code, n in proxy.stats().produce_errors.items() if code != ErrorCode.NONE}
    return errors if sum(errors.values()) >= at_least else {}


def log_text(broker: BrokerProcess) -> str:
    with open(broker.log_path, encoding="utf-8", errors="replace") as f:
        return f.read()


def test_a_full_disk_refuses_writes_retriably_loses_nothing_and_they_resume_once_space_is_freed(tmp_path):
    with small_disk(str(tmp_path / "data")) as data, FaultProxy() as proxy:
        broker = BrokerProcess(data, admin_port=0, config={"advertised.port": str(proxy.port),
                                                           "brokerDeduplicationEntriesInterval": "10"})
        filler = Filler(data)
        try:
            broker.start()
            proxy.upstream_port = broker.port
            with RawKafka(broker.port) as kafka:
                assert kafka.create_topic(TOPIC, PARTITIONS) == ErrorCode.NONE
            assert commit(broker.bootstrap, {0: 0, 1: 0})
            sent, reports = values(), []
            filler.fill(leave_bytes=MARGIN)
            thread = threading.Thread(target=produce, args=(proxy.bootstrap, sent, reports), daemon=True)
            thread.start()
            # Controls: the broker ran out of space, and the producer was told to retry.
            wait_for(lambda: "No space left on device" in log_text(broker), "the broker to hit ENOSPC", timeout=60)
            errors = wait_for(lambda: refusals(proxy), "the producer to be refused a few times", timeout=60)
            assert set(errors) <= RETRIABLE, f"non-retriable answers to a full disk: {errors}"
            assert broker.proc.poll() is None, broker.log_tail()

            # During the fault: reads go on and see only whole, acknowledged-or-acknowledgeable records, in order.
            during = read_topic(broker.port, TOPIC, range(PARTITIONS))
            assert during, "nothing was stored before the disk filled up"
            index = {v: i for i, v in enumerate(sent)}
            for p in range(PARTITIONS):
                order = [index[r.value] for r in during if r.partition == p]
                assert order == sorted(order), "records out of order during the fault"
            assert all(r.value in index for r in during), "a record that was never sent is visible"
            ends = {p: sum(1 for r in during if r.partition == p) for p in range(PARTITIONS)}
            filler.fill()  # not a page left: the cursor log takes commits only while its last page has room
            last_commit = {0: 0, 1: 0}
            for attempt in range(1, 6):  # each commit's record is ~3 KB, so a page runs out within two
                offsets = {p: min(end, attempt) for p, end in ends.items()}
                if not commit(broker.bootstrap, offsets, metadata="m" * 3000):
                    break
                last_commit = offsets
            else:
                pytest.fail("every commit was taken on a disk without a free page")
            with RawKafka(broker.port) as kafka:  # nor can a topic be created; nothing of it may stay behind
                assert kafka.create_topic("born-full", 1) == ErrorCode.KAFKA_STORAGE_ERROR
                assert kafka.create_topic(TOPIC, 1) == ErrorCode.TOPIC_ALREADY_EXISTS

            filler.remove()
            with RawKafka(broker.port) as kafka:  # the refused creation left nothing behind
                assert kafka.create_topic("born-full", 1) == ErrorCode.NONE
            thread.join(DELIVERY_TIMEOUT_S + 30)
            assert not thread.is_alive(), "the producer did not finish once space was freed"
            check = check_stream(sent, reports, read_topic(broker.port, TOPIC, range(PARTITIONS)))
            print(f"\n[disk full] errors seen={errors} stored during the fault={len(during)} commits taken on the "
                  f"full disk={last_commit} {check.summary()}")
            assert check.lost == 0 and check.duplicated == 0 and check.foreign == 0, check.summary()
            assert check.out_of_order == 0 and check.holes == 0 and check.offset_mismatches == 0, check.summary()
            assert check.failed == 0 and check.stored == COUNT, check.summary()
            assert committed(broker.bootstrap) == last_commit
            snapshots = dedup_snapshots(broker)

            # After the episode, a kill -9: everything comes back whole from disk.
            broker.kill()
            broker.start()
            after = check_stream(sent, reports, read_topic(broker.port, TOPIC, range(PARTITIONS)))
            assert after == check, after.summary()
            assert committed(broker.bootstrap) == last_commit
            assert dedup_snapshots(broker) == snapshots
            restart_log = log_text(broker).split("standalone", 1)[-1]
            assert "damaged" not in restart_log and "were lost" not in restart_log, broker.log_tail()
        finally:
            broker.stop()
            filler.remove()


def test_injected_write_errors_are_retried_by_an_idempotent_producer_exactly_once(tmp_path):
    """EIO from the ledger's flushes (the write_failures failpoint), several times on each partition mid-stream."""
    topic = "eio"
    with FaultProxy() as proxy:
        broker = BrokerProcess(str(tmp_path / "data"), admin_port=0,
                               config={"advertised.port": str(proxy.port), "adminFailpointsEnabled": "true"})
        try:
            broker.start()
            proxy.upstream_port = broker.port
            with RawKafka(broker.port) as kafka:
                assert kafka.create_topic(topic, PARTITIONS) == ErrorCode.NONE
            admin = AdminClient(broker.admin_url)
            for p in range(PARTITIONS):
                admin.post(f"/admin/v2/kop/failpoints/{topic}/{p}", {"write_failures": 3})
            sent, reports = values(topic, 2000), []
            produce(proxy.bootstrap, sent, reports, topic)
            errors = refusals(proxy, at_least=2)
            assert errors and set(errors) <= RETRIABLE, f"the injected errors were not seen as retriable: {errors}"
            check = check_stream(sent, reports, read_topic(broker.port, topic, range(PARTITIONS)))
            print(f"\n[EIO] errors seen={errors} {check.summary()}")
            assert check.lost == 0 and check.duplicated == 0 and check.out_of_order == 0, check.summary()
            assert check.failed == 0 and check.stored == len(sent) and check.offset_mismatches == 0, check.summary()
            assert log_text(broker).count("injected write failure") >= PARTITIONS  # the control: they fired
        finally:
            broker.stop()


def test_eio_part_way_through_a_write_refuses_that_batch_retriably_and_leaves_no_half_record(tmp_path):
    """EIO from the file engine's write step (the append_failures failpoint: half the record reaches the ledger file,
    then EIO), not its flush: that batch gets a retriable error, the next batch is stored without a restart, at the
    offset the refused one would have had; nothing of the refused batch shows, then or after kill -9."""
    broker = BrokerProcess(str(tmp_path / "data"), admin_port=0, config={"adminFailpointsEnabled": "true"})
    try:
        broker.start()
        with RawKafka(broker.port) as kafka:
            assert kafka.create_topic(TOPIC, 1) == ErrorCode.NONE
            assert kafka.produce(TOPIC, 0, plain_batch([b"before-0", b"before-1"])).error_code == ErrorCode.NONE
            AdminClient(broker.admin_url).post(f"/admin/v2/kop/failpoints/{TOPIC}/0", {"append_failures": 1})
            refused = kafka.produce(TOPIC, 0, plain_batch([b"torn" * 2000]))
            assert refused.error_code in RETRIABLE, refused
            assert "injected write failure (a torn write)" in log_text(broker)  # the control: the fault fired
            stored = wait_for(lambda: (answer := kafka.produce(TOPIC, 0, plain_batch([b"after"]))).error_code
                              == ErrorCode.NONE and answer, "a write after the fault")
            assert stored.base_offset == 2
        expected = [(0, b"before-0"), (1, b"before-1"), (2, b"after")]
        assert [(r.offset, r.value) for r in read_topic(broker.port, TOPIC, [0])] == expected
        broker.kill()
        broker.start()
        assert [(r.offset, r.value) for r in read_topic(broker.port, TOPIC, [0])] == expected
        restart_log = log_text(broker).rsplit("open files limit", 1)[-1]
        assert "dropping the failed ones" not in restart_log and "damaged" not in restart_log, broker.log_tail()
    finally:
        broker.stop()


def test_a_broker_started_on_a_full_disk_refuses_in_one_line_and_starts_whole_once_space_is_freed(tmp_path):
    """Loading a partition writes (a new ledger on restart): on a disk without a free page the broker says so in one
    line and exits, as Kafka does with its only log directory offline; freed, it starts with every record."""
    with small_disk(str(tmp_path / "data")) as data:
        broker = BrokerProcess(data, config={"brokerDeduplicationEnabled": "true"})
        filler = Filler(data)
        try:
            broker.start()
            with RawKafka(broker.port) as kafka:
                assert kafka.create_topic(TOPIC, PARTITIONS) == ErrorCode.NONE
            sent, reports = values(TOPIC, 1000), []
            produce(broker.bootstrap, sent, reports, TOPIC)
            broker.stop()
            filler.fill()
            with pytest.raises(RuntimeError, match="exited with 2"):
                broker.start()
            refusal = log_text(broker).rsplit("open files limit", 1)[-1]
            assert "kop standalone: error: " in refusal and "No space left on device" in refusal, refusal
            assert "Traceback" not in refusal, refusal
            filler.remove()
            broker.start()
            check = check_stream(sent, reports, read_topic(broker.port, TOPIC, range(PARTITIONS)))
            assert check.lost == 0 and check.duplicated == 0 and check.stored == len(sent), check.summary()
            assert "damaged" not in log_text(broker).rsplit("open files limit", 1)[-1]
        finally:
            broker.stop()
            filler.remove()


def test_failed_cursor_log_flushes_fail_only_what_they_carried_and_lose_nothing_across_kill_9(tmp_path):
    """EIO from the cursor log's flushes (the cursor_write_failures failpoint): an offset commit it carried is
    answered NOT_COORDINATOR and the application's retry lands; dedup snapshots it carried fail and the next ones are
    taken; records go on being stored; after kill -9 every record is there once and the last commit holds."""
    broker = BrokerProcess(str(tmp_path / "data"), admin_port=0,
                           config={"adminFailpointsEnabled": "true", "brokerDeduplicationEntriesInterval": "10"})
    try:
        broker.start()
        with RawKafka(broker.port) as kafka:
            assert kafka.create_topic(TOPIC, PARTITIONS) == ErrorCode.NONE
        sent, reports = values(TOPIC, 400), []
        produce(broker.bootstrap, sent[:200], reports)
        admin = AdminClient(broker.admin_url)
        time.sleep(0.5)  # the last dedup snapshots of that produce are flushed: the failure is the commit's
        admin.post(f"/admin/v2/kop/failpoints/{TOPIC}/0", {"cursor_write_failures": 1})
        assert not commit(broker.bootstrap, {0: 9, 1: 9})  # librdkafka reports NOT_COORDINATOR to the application
        assert commit(broker.bootstrap, {0: 9, 1: 9})  # which commits again
        assert committed(broker.bootstrap) == {0: 9, 1: 9}
        admin.post(f"/admin/v2/kop/failpoints/{TOPIC}/1", {"cursor_write_failures": 3})
        produce(broker.bootstrap, sent[200:], reports)
        log_now = log_text(broker)
        assert f"offset commit for {GROUP} on {TOPIC}-0 failed" in log_now  # controls: both failures happened
        assert "dedup snapshot at" in log_now and "failed" in log_now.split("dedup snapshot at", 1)[1]
        before = check_stream(sent, reports, read_topic(broker.port, TOPIC, range(PARTITIONS)))
        assert before.lost == 0 and before.duplicated == 0 and before.stored == len(sent), before.summary()
        broker.kill()
        broker.start()
        after = check_stream(sent, reports, read_topic(broker.port, TOPIC, range(PARTITIONS)))
        assert after == before, after.summary()
        assert committed(broker.bootstrap) == {0: 9, 1: 9}
        restart_log = log_text(broker).rsplit("open files limit", 1)[-1]
        assert "damaged" not in restart_log and "were lost" not in restart_log, broker.log_tail()
    finally:
        broker.stop()
