"""File descriptors are not a partition limit: a broker whose ledger files far outnumber its open-files limit loads,
serves and survives kill -9; running out anyway fails one request with an error code and leaves no half topic."""
import os
import resource
import shutil
import socket
import sys

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.consumer.fetch import FetchResponse
from kafka.protocol.producer.produce import ProduceRequest, ProduceResponse

from integration.broker_process import BrokerProcess
from integration.clients import ck_consume_all, ck_produce, sample_records
from integration.fetch_requests import FETCH_VERSION, fetch_request
from integration.idem_raw import BASE_TIMESTAMP, PRODUCE_VERSION, RawKafka, plain_batch, read_topic
from integration.test_metrics import sample, scrape
from integration.waiting import wait_until
from protocol.errors import ErrorCode

OPEN_FILES = 400  # the broker's hard and soft limit: it cannot raise it, and keeps a quarter for its files
TOPICS, PARTITIONS = 30, 5
MAX_TIMESTAMP = -3  # ListOffsets: the first record holding the greatest timestamp

pytestmark = [pytest.mark.file_storage,
              pytest.mark.skipif(shutil.which("prlimit") is None or not os.path.exists("/proc/self/fd"),
                                 reason="needs util-linux's prlimit and /proc")]


@pytest.fixture
def limited_broker(tmp_path):
    broker = BrokerProcess(str(tmp_path / "data"), admin_port=0,
                           program=("prlimit", f"--nofile={OPEN_FILES}:{OPEN_FILES}", sys.executable, "-m", "kop.cli"))
    yield broker.start()
    broker.stop()


def topic_names():
    return [f"t{i:02d}" for i in range(TOPICS)]


def create_topics(bootstrap, names, partitions):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(n, partitions, 1) for n in names], request_timeout=60)
    return {name: future.exception(60) for name, future in futures.items()}


def produce_one_per_partition(bootstrap, round_):
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    errors = []
    for name in topic_names():
        for p in range(PARTITIONS):
            producer.produce(name, b"%s-%d-r%d" % (name.encode(), p, round_), partition=p,
                             on_delivery=lambda err, _msg: err and errors.append(err))
    assert producer.flush(60) == 0
    assert errors == []


def read_everything(bootstrap, expected):
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "reader", "enable.auto.commit": False})
    consumer.assign([TopicPartition(n, p, 0) for n in topic_names() for p in range(PARTITIONS)])
    values = []
    try:
        for _ in range(600):  # bounded: 0.1 s polls, about a minute at most
            for msg in consumer.consume(500, 0.1):
                if msg.error() is None:
                    values.append(msg.value())
            if len(values) >= expected:
                break
    finally:
        consumer.close()
    return values


def ledger_files(data_dir):
    return sum(name.endswith((".log", ".idx")) and name != "cursors.log"
               for _, _, files in os.walk(data_dir) for name in files)


@pytest.mark.slow  # ~19 s: many ledgers, a kill -9 and a reload
def test_more_ledger_files_than_descriptors_load_serve_and_survive_kill_9(limited_broker):
    b = limited_broker
    assert all(error is None for error in create_topics(b.bootstrap, topic_names(), PARTITIONS).values())
    for round_ in range(3):
        produce_one_per_partition(b.bootstrap, round_)
        b.restart(hard=True)  # every restart reopens every ledger of every partition
    # Control: the broker holds more ledger files than its whole descriptor limit, so it cannot keep them open.
    assert ledger_files(b.data_dir) > OPEN_FILES
    # Ledger files, indexes and cursor logs all share the pool: the broker holds about its bound, not one per file.
    assert len(os.listdir(f"/proc/{b.proc.pid}/fd")) <= OPEN_FILES // 4 + 50
    values = read_everything(b.bootstrap, 3 * TOPICS * PARTITIONS)
    assert sorted(values) == sorted(b"%s-%d-r%d" % (n.encode(), p, r)
                                    for n in topic_names() for p in range(PARTITIONS) for r in range(3))
    metrics = scrape(b)
    assert sample(metrics, "kop_ledger_files_open_max") == OPEN_FILES // 4
    assert sample(metrics, "kop_ledger_files_open") <= OPEN_FILES // 4
    assert sample(metrics, "kop_ledger_file_opens_total") > OPEN_FILES // 4  # files were closed and opened again


def flood_with_connections(port, most):
    """Open connections until the broker stops accepting them (it is out of descriptors), at most `most`."""
    socks = []
    for _ in range(most):
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=1.0)
        except OSError:
            break  # the accept backlog is full: the broker accepts no more
        socks.append(sock)
    return socks


def test_running_out_of_descriptors_fails_the_request_and_leaves_no_half_topic(limited_broker):
    """Every descriptor the broker may open is taken by idle connections: creating a topic cannot open its files.
    The request gets an error code on its own connection, which stays open, and no half topic is left."""
    b = limited_broker
    ck_produce(b.bootstrap, "before", sample_records(5))
    with RawKafka(b.port) as raw:
        assert raw.create_topic("warm-up", 1) == ErrorCode.NONE  # the connection is accepted and serving
        flood = flood_with_connections(b.port, OPEN_FILES + 300)
        try:
            assert len(flood) > OPEN_FILES // 2  # control: the broker took connections until it had no descriptor
            assert raw.create_topic("huge", 50) == ErrorCode.KAFKA_STORAGE_ERROR
        finally:
            for sock in flood:
                sock.close()
        assert not [d for d in os.listdir(os.path.join(b.data_dir, "ledgers", "public", "default"))
                    if d.startswith("huge-")]
        # Everything was given back: the same connection creates, and clients store and read, as before.
        assert wait_until(lambda: raw.create_topic("after", 3) == ErrorCode.NONE, timeout=30)
    assert "huge" not in AdminClient({"bootstrap.servers": b.bootstrap}).list_topics(timeout=10).topics
    assert all(err is None for err, *_ in ck_produce(b.bootstrap, "after", sample_records(5)))
    assert len(ck_consume_all(b.bootstrap, "before", 5)) == 5
    b.restart(hard=True)
    assert len(ck_consume_all(b.bootstrap, "after", 5)) == 5


def close_pooled_files_of(raw: RawKafka, name: str, data_dir: str) -> None:
    """New topics take the descriptor pool's room, so the pool closes `name`'s idle ledger files; then its ledger
    files are deleted (a disk problem): reading its records needs a file that cannot be opened again."""
    for i in range(OPEN_FILES // 4):  # each new topic opens three files: the older ones are closed for room
        assert raw.create_topic(f"filler-{i}", 1) == ErrorCode.NONE
    victim_dir = os.path.join(data_dir, "ledgers", "public", "default", f"{name}-partition-0")
    for file_name in os.listdir(victim_dir):
        if file_name.endswith(".log") and file_name != "cursors.log":
            os.unlink(os.path.join(victim_dir, file_name))


def test_a_ledger_file_that_cannot_be_opened_again_fails_that_partition_only(limited_broker):
    """The pool closed an idle partition's ledger file, and the file is gone when a fetch needs it again (a disk
    problem): that partition answers KAFKA_STORAGE_ERROR, the same request serves the others, the connection stays."""
    b = limited_broker
    with RawKafka(b.port) as raw:
        for name in ("victim", "healthy"):
            assert raw.create_topic(name, 1) == ErrorCode.NONE
            assert raw.produce(name, 0, plain_batch([b"a", b"b"])).error_code == ErrorCode.NONE
        assert raw.fetch_once("victim", 0, 0)[0] == ErrorCode.NONE  # control: served while its file is there
        close_pooled_files_of(raw, "victim", b.data_dir)
        response = raw.call(fetch_request([("victim", 0, 0), ("healthy", 0, 0)]), FetchResponse, FETCH_VERSION)
        answers = {t.topic: (p.error_code, p.high_watermark) for t in response.responses for p in t.partitions}
        assert answers["victim"][0] == ErrorCode.KAFKA_STORAGE_ERROR
        assert answers["healthy"][0] == ErrorCode.NONE and answers["healthy"][1] == 2
        assert raw.create_topic("still-serving", 1) == ErrorCode.NONE


def test_list_offsets_that_cannot_read_its_ledger_fails_that_partition_only(limited_broker):
    """ListOffsets by time, and for the greatest timestamp, reads the batch it found; when that ledger file cannot be
    opened, that partition answers KAFKA_STORAGE_ERROR, the same request answers the others, the connection stays
    (as Kafka answers a log it cannot read). Offsets the broker holds in memory are still answered for it."""
    b = limited_broker
    with RawKafka(b.port) as raw:
        for name in ("victim", "healthy"):
            assert raw.create_topic(name, 1) == ErrorCode.NONE
            assert raw.produce(name, 0, plain_batch([b"a", b"b"])).error_code == ErrorCode.NONE
        by_time = [("victim", 0, BASE_TIMESTAMP + 1), ("healthy", 0, BASE_TIMESTAMP + 1)]
        # Control: served while its file is there.
        assert raw.offsets_for(by_time)[("victim", 0)] == (ErrorCode.NONE, BASE_TIMESTAMP + 1, 1)
        close_pooled_files_of(raw, "victim", b.data_dir)
        answers = raw.offsets_for(by_time)
        assert answers[("victim", 0)][0] == ErrorCode.KAFKA_STORAGE_ERROR
        assert answers[("healthy", 0)] == (ErrorCode.NONE, BASE_TIMESTAMP + 1, 1)
        answers = raw.offsets_for([("victim", 0, MAX_TIMESTAMP), ("healthy", 0, MAX_TIMESTAMP)])
        assert answers[("victim", 0)][0] == ErrorCode.KAFKA_STORAGE_ERROR
        assert answers[("healthy", 0)] == (ErrorCode.NONE, BASE_TIMESTAMP + 1, 1)
        assert raw.end_offsets("victim", [0]) == {0: 2}  # from memory: no file read
        assert raw.create_topic("still-serving", 1) == ErrorCode.NONE


def test_delete_records_that_cannot_record_the_new_start_fails_and_deletes_nothing(limited_broker):
    """DeleteRecords rewrites the partition's ledger list; with no descriptor to write it, the partition answers
    KAFKA_STORAGE_ERROR on the open connection and readers still see every record (the new log start was not
    recorded, so it must not show now and vanish after a restart). Once the limit is back the same request works."""
    b = limited_broker
    with RawKafka(b.port) as raw:
        assert raw.create_topic("trimmed", 1) == ErrorCode.NONE
        assert raw.produce("trimmed", 0, plain_batch([b"a", b"b", b"c"])).error_code == ErrorCode.NONE
        resource.prlimit(b.proc.pid, resource.RLIMIT_NOFILE, (1, OPEN_FILES))  # no new descriptor at all
        try:
            refused = raw.delete_records("trimmed", 0, 2)
        finally:
            resource.prlimit(b.proc.pid, resource.RLIMIT_NOFILE, (OPEN_FILES, OPEN_FILES))
        assert refused[0] == ErrorCode.KAFKA_STORAGE_ERROR
        assert raw.start_offsets("trimmed", [0]) == {0: 0}
        assert [r.value for r in raw.read_partition("trimmed", 0)] == [b"a", b"b", b"c"]
        assert raw.delete_records("trimmed", 0, 2) == (ErrorCode.NONE, 2)
    b.restart(hard=True)
    with RawKafka(b.port) as raw:
        assert raw.start_offsets("trimmed", [0]) == {0: 2}


RETRIABLE = {ErrorCode.KAFKA_STORAGE_ERROR, ErrorCode.NOT_LEADER_OR_FOLLOWER}  # nothing stored, the client retries


def round_value(name: str, partition: int, round_: int) -> bytes:
    return b"%s-%d-r%d" % (name.encode(), partition, round_)


def produce_to_all(raw: RawKafka, round_: int) -> dict[tuple[str, int], int]:
    """One Produce request with one record for every partition of every topic: the error code of each."""
    Data = ProduceRequest.TopicProduceData
    request = ProduceRequest[PRODUCE_VERSION](transactional_id=None, acks=-1, timeout_ms=30_000, topic_data=[
        Data(name=name, partition_data=[
            Data.PartitionProduceData(index=p, records=plain_batch([round_value(name, p, round_)]))
            for p in range(PARTITIONS)]) for name in topic_names()])
    response = raw.call(request, ProduceResponse, PRODUCE_VERSION)
    return {(t.name, p.index): p.error_code for t in response.responses for p in t.partition_responses}


def fetch_from_all(raw: RawKafka) -> dict[tuple[str, int], int]:
    """One Fetch from offset 0 of every partition of every topic: the error code of each."""
    request = fetch_request([(name, p, 0) for name in topic_names() for p in range(PARTITIONS)],
                            partition_max_bytes=1024)
    response = raw.call(request, FetchResponse, FETCH_VERSION)
    return {(t.topic, p.partition_index): p.error_code for t in response.responses for p in t.partitions}


def test_running_out_of_descriptors_mid_produce_and_fetch_fails_partitions_retriably_and_recovers(limited_broker):
    """The broker's open-files limit drops below every descriptor it holds (as when something else took them all, but
    so that even the pool's own files, given back, leave none), while one Produce and one Fetch each reach 150
    partitions, most of whose files the pool had closed: those partitions answer a retriable error on the open
    connection, the broker stays up, nothing refused shows, and the same requests succeed once the limit is back
    (prlimit on the running broker: a deterministic way to leave it no descriptor)."""
    b = limited_broker
    assert all(error is None for error in create_topics(b.bootstrap, topic_names(), PARTITIONS).values())
    stored = {(name, p): [round_value(name, p, 0)] for name in topic_names() for p in range(PARTITIONS)}
    with RawKafka(b.port) as raw:
        assert set(produce_to_all(raw, 0).values()) == {ErrorCode.NONE}
        resource.prlimit(b.proc.pid, resource.RLIMIT_NOFILE, (1, OPEN_FILES))  # no new descriptor at all
        try:
            produced = produce_to_all(raw, 1)
            fetched = fetch_from_all(raw)
        finally:
            resource.prlimit(b.proc.pid, resource.RLIMIT_NOFILE, (OPEN_FILES, OPEN_FILES))
        failed = {code for code in [*produced.values(), *fetched.values()] if code != ErrorCode.NONE}
        assert failed, "no partition needed a descriptor"  # control: the fault reached the requests
        assert failed <= RETRIABLE, (produced, fetched)
        assert b.proc.poll() is None  # the broker is up, and serves the same connection
        for key, code in produced.items():
            if code == ErrorCode.NONE:
                stored[key].append(round_value(*key, 1))
        assert wait_until(lambda: set(fetch_from_all(raw).values()) == {ErrorCode.NONE}, timeout=30)
        assert set(produce_to_all(raw, 2).values()) == {ErrorCode.NONE}  # writes resume without a restart
    for key in stored:
        stored[key].append(round_value(*key, 2))
    # Each partition holds its records once, in order, at consecutive offsets: nothing of a refused write shows.
    held: dict[tuple[str, int], list[tuple[int, bytes]]] = {}
    for name in topic_names():
        for record in read_topic(b.port, name, range(PARTITIONS)):
            held.setdefault((name, record.partition), []).append((record.offset, record.value))
    assert held == {key: list(enumerate(values)) for key, values in stored.items()}
