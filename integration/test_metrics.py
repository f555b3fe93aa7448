"""Metrics, probes and logs of a real broker: `/metrics` parsed with prometheus-client's own parser after real
clients produce, retry and consume in a group; `/ready` while partitions load and while a dedup recovery has
failed; JSON log lines naming the client of a refused batch; topics stats listing the group's cursor."""
import json
import time
import urllib.error
import urllib.request

from kafka import KafkaConsumer, TopicPartition
from kafka.structs import OffsetAndMetadata
from prometheus_client.parser import text_string_to_metric_families

from integration.broker_process import BrokerProcess
from integration.idem_raw import RawKafka, idempotent_batch, plain_batch
from integration.test_dedup_policies import set_topic_dedup
from integration.test_dedup_recovery import FAILPOINTS, failpoint
from integration.waiting import wait_for, wait_until
from protocol.errors import ErrorCode


def get(broker: BrokerProcess, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(broker.admin_url + path, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def scrape(broker: BrokerProcess) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of /metrics: (name, sorted labels) -> value."""
    status, body = get(broker, "/metrics")
    assert status == 200
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(body.decode()) for s in family.samples}


def sample(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def corrupt(batch: bytes) -> bytes:
    bad = bytearray(batch)
    bad[-1] ^= 0x55  # a flipped bit in the records: CRC mismatch
    return bytes(bad)


def test_metrics_count_what_clients_did(start_broker):
    broker = start_broker()
    topic = "metered"
    plain = plain_batch([b"d", b"e"])
    with RawKafka(broker.port) as kafka:
        assert kafka.create_topic(topic) == ErrorCode.NONE
        before = scrape(broker)
        pid = kafka.init_producer_id().producer_id
        first = idempotent_batch([b"a", b"b", b"c"], producer_id=pid, epoch=0, base_sequence=0)
        assert kafka.produce(topic, 0, first).base_offset == 0
        assert kafka.produce(topic, 0, first).base_offset == 0  # a retry: the dedup core answers Dup
        assert kafka.produce(topic, 0, plain).base_offset == 3
        assert kafka.produce(topic, 0, corrupt(plain)).error_code == ErrorCode.CORRUPT_MESSAGE
        assert kafka.fetch_once(topic, 0, 99)[0] == ErrorCode.OFFSET_OUT_OF_RANGE
        during = scrape(broker)

    consumer = KafkaConsumer(topic, bootstrap_servers=broker.bootstrap, group_id="readers",
                             auto_offset_reset="earliest", enable_auto_commit=False)
    try:
        received = []
        deadline = time.monotonic() + 20
        while len(received) < 5 and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                received.extend(r.value for r in records)
        assert received == [b"a", b"b", b"c", b"d", b"e"]
        consumer.commit({TopicPartition(topic, 0): OffsetAndMetadata(2, "", -1)})  # two of five processed
        after = scrape(broker)
    finally:
        consumer.close(autocommit=False)

    def moved(name: str, **labels: str) -> float:
        return sample(during, name, **labels) - sample(before, name, **labels)

    assert moved("kop_requests_total", api="Produce") == 4
    assert moved("kop_request_latency_seconds_count", api="Produce") == 4
    assert moved("kop_request_errors_total", api="Produce", error="CORRUPT_MESSAGE") == 1
    assert moved("kop_request_errors_total", api="Fetch", error="OFFSET_OUT_OF_RANGE") == 1
    assert moved("kop_requests_total", api="InitProducerId") == 1
    assert sample(during, "kop_dedup_decisions_total", topic=topic, decision="stored") == 1
    assert sample(during, "kop_dedup_decisions_total", topic=topic, decision="duplicate") == 1
    stored_bytes = len(first) + len(plain)  # the retry and the corrupt batch stored nothing
    assert sample(during, "kop_topic_bytes_in_total", topic=topic) == stored_bytes
    assert moved("kop_produce_batch_size_bytes_count") == 3  # the corrupt one was refused before
    assert moved("kop_produce_batch_size_bytes_sum") == 2 * len(first) + len(plain)
    assert moved("kop_produce_batch_size_records_sum") == 3 + 3 + 2
    assert moved("kop_ledger_fsync_entries_sum") == 2
    assert moved("kop_ledger_fsync_latency_seconds_count") >= 1
    assert sample(during, "kop_connections_open") >= 1
    assert sample(during, "kop_partitions_loaded") == 1

    assert sample(after, "kop_topic_bytes_out_total", topic=topic) == stored_bytes  # read once, all of it
    labels = {"group": "readers", "topic": topic, "partition": "0"}
    assert sample(after, "kop_consumer_group_committed_offset", **labels) == 2
    assert sample(after, "kop_consumer_group_lag", **labels) == 3
    assert sample(after, "kop_consumer_group_rebalances_total", group="readers") >= 1
    assert sample(after, "kop_requests_total", api="OffsetCommit") == 1
    refusals = [line for line in open(broker.log_path).read().splitlines() if "rejected batch for metered-0" in line]
    assert len(refusals) == 1 and " WARNING " in refusals[0]  # text lines name the client too
    assert refusals[0].endswith(" client_id=kop-idem-test addr=" + refusals[0].rsplit("addr=", 1)[1])
    assert refusals[0].rsplit("addr=", 1)[1].startswith("127.0.0.1:")

    status, body = get(broker, f"/admin/v2/persistent/public/default/{topic}/stats")
    subscriptions = json.loads(body)["subscriptions"]
    assert status == 200 and set(subscriptions) == {"readers"}
    assert subscriptions["readers"]["msgBacklog"] == 3
    assert subscriptions["readers"]["partitions"]["0"]["committedOffset"] == 2


def test_ready_answers_503_while_partitions_load_then_200(start_broker):
    broker = start_broker({"testPartitionLoadDelayMs": "1000"})
    with RawKafka(broker.port) as kafka:
        assert kafka.create_topic("slow", 3) == ErrorCode.NONE
    assert get(broker, "/ready") == (200, b'{"ready": true}\n')  # the control: ready once loaded
    broker.stop()
    broker.start(wait=False)
    wait_until(lambda: _answers(broker), 20)

    def loading_reasons() -> list[str] | None:  # after "opening the storage", which a database takes a moment for
        status, body = get(broker, "/ready")
        assert status == 503, body
        reasons = json.loads(body)["reasons"]
        return reasons if any(r.startswith("loading partitions: ") for r in reasons) else None
    reasons = wait_for(loading_reasons, "the partitions' load to show in /ready", timeout=10)
    assert any(r.startswith("loading partitions: ") and r.endswith(" of 3 loaded") for r in reasons), reasons
    assert get(broker, "/health")[0] == 200  # alive while loading
    assert get(broker, "/admin/v2/persistent/public/default/slow/stats")[0] == 503  # the rest waits for the load
    assert sample(scrape(broker), "kop_partitions_loaded") < 3
    wait_until(lambda: get(broker, "/ready")[0] == 200, 30)
    assert sample(scrape(broker), "kop_partitions_loaded") == 3


def _answers(broker: BrokerProcess) -> bool:
    try:
        return get(broker, "/health")[0] == 200
    except OSError:
        return False


def test_ready_answers_503_while_a_dedup_recovery_has_failed(start_broker):
    broker = start_broker(FAILPOINTS)
    topic = "unrecovered"
    with RawKafka(broker.port) as kafka:
        assert kafka.create_topic(topic) == ErrorCode.NONE
        set_topic_dedup(broker, topic, False)
        failpoint(broker, topic, replay_read_failures=1)
        set_topic_dedup(broker, topic, True)  # its recovery fails on the injected read error
        status, body = get(broker, "/ready")
        assert status == 503 and json.loads(body)["reasons"] == [
            f"deduplication state not recovered: {topic}-0"]
        pid = kafka.init_producer_id().producer_id
        batch = idempotent_batch([b"x"], producer_id=pid, epoch=0, base_sequence=0)
        refused = kafka.produce(topic, 0, batch)
        assert refused.error_code == ErrorCode.REQUEST_TIMED_OUT  # cannot be judged: the client retries
        assert sample(scrape(broker), "kop_dedup_decisions_total", topic=topic, decision="unknown") == 1
        # Retries start a new recovery after its retry delay, which succeeds: ready again.
        assert wait_until(lambda: kafka.produce(topic, 0, batch).error_code == ErrorCode.NONE, 20)
    assert get(broker, "/ready")[0] == 200
    assert sample(scrape(broker), "kop_dedup_recovery_replayed_entries", topic=topic, partition="0") == 0


def test_json_log_lines_name_the_client_of_a_refused_batch(tmp_path):
    broker = BrokerProcess(str(tmp_path / "data"), options=("--log-format", "json")).start()
    try:
        with RawKafka(broker.port) as kafka:
            assert kafka.create_topic("logged") == ErrorCode.NONE
            answer = kafka.produce("logged", 0, corrupt(plain_batch([b"x"])))
            assert answer.error_code == ErrorCode.CORRUPT_MESSAGE
    finally:
        broker.stop()
    output = open(broker.log_path).read().splitlines()  # the log (stderr) and the "ready" line (stdout)
    lines = [json.loads(line) for line in output if not line.startswith("kop standalone ready on ")]
    assert len(lines) > 3 and all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    [refusal] = [line for line in lines if line["message"].startswith("rejected batch for logged-0")]
    assert refusal["level"] == "WARNING" and refusal["client_id"] == "kop-idem-test"
    assert refusal["addr"].startswith("127.0.0.1:")
