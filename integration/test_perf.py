"""`kop perf produce|consume` as a user runs it, against a real kop broker: the counts and percentiles it reports,
the files it writes, the headers it sends, and its one-line errors."""
import json
import subprocess
import sys

import pytest

from integration.broker_process import REPO, free_port
from integration.clients import ck_consume_all
from integration.txn_clients import ck_read_to_end

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def kop_perf(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kop.cli", "perf", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


def assert_latency_ordered(latency: dict) -> None:
    assert 0 < latency["p50"] <= latency["p95"] <= latency["p99"] <= latency["p999"] <= latency["max"]
    assert 0 < latency["mean"] <= latency["max"]


def assert_png(path) -> None:
    data = path.read_bytes()
    assert len(data) > len(PNG_SIGNATURE) and data.startswith(PNG_SIGNATURE)


def test_produced_records_are_consumed_back_with_ordered_percentiles(broker, tmp_path):
    n = 3000
    produced = kop_perf("produce", "--bootstrap-server", broker.bootstrap, "--topic", "perf", "--partitions", "2",
                        "--num-records", str(n), "--record-size", "200", "--compression", "lz4",
                        "--idempotence", "on", "--producer-property", "sasl.password=hunter2",
                        "--json", str(tmp_path / "p.json"), "--plot", str(tmp_path / "p.png"))
    assert produced.returncode == 0, produced.stderr
    report = json.loads((tmp_path / "p.json").read_text())
    summary = report["summary"]
    assert (summary["records"], summary["sent"], summary["failed"]) == (n, n, 0)
    assert summary["bytes"] == n * 200
    assert_latency_ordered(summary["latency_ms"])
    assert sum(s["records"] for s in report["samples"]) == n  # every ack is in exactly one sample
    assert report["options"]["client_config"]["compression.type"] == "lz4"
    assert "hunter2" not in json.dumps(report)  # a secret passed as a client setting is not written down
    assert "produce:" in produced.stdout and f"{n:,} records" in produced.stdout
    assert_png(tmp_path / "p.png")

    consumed = kop_perf("consume", "--bootstrap-server", broker.bootstrap, "--topic", "perf", "--from-beginning",
                        "--messages", str(n), "--json", str(tmp_path / "c.json"), "--plot", str(tmp_path / "c.png"))
    assert consumed.returncode == 0, consumed.stderr
    summary = json.loads((tmp_path / "c.json").read_text())["summary"]
    assert (summary["records"], summary["bytes"], summary["timed_out"]) == (n, n * 200, False)
    assert_latency_ordered(summary["latency_ms"])
    assert_png(tmp_path / "c.png")


def test_sequence_headers_are_on_every_record(broker):
    produced = kop_perf("produce", "--bootstrap-server", broker.bootstrap, "--topic", "seq", "--partitions", "1",
                        "--num-records", "200", "--record-size", "10", "--sequence-headers", "orders-é",
                        "--sequence-start", "1000")
    assert produced.returncode == 0, produced.stderr
    records = ck_consume_all(broker.bootstrap, "seq", 200)
    assert [dict(r.headers) for r in records] == [
        {"kop.producer.name": "orders-é".encode(), "kop.sequence.id": str(1000 + i).encode()} for i in range(200)]


def test_no_headers_unless_asked(broker):
    produced = kop_perf("produce", "--bootstrap-server", broker.bootstrap, "--topic", "plain", "--partitions", "1",
                        "--num-records", "20", "--record-size", "10")
    assert produced.returncode == 0, produced.stderr
    records = ck_consume_all(broker.bootstrap, "plain", 20)
    assert len(records) == 20 and all(r.headers == () and len(r.value) == 10 for r in records)


def test_paced_run_for_a_duration_writes_json_to_stdout(broker):
    """--json - puts the document alone on stdout (the progress lines go to stderr); pacing never sends ahead of
    the schedule, so a 2 s run at 100 records/s sends at most 201 records."""
    produced = kop_perf("produce", "--bootstrap-server", broker.bootstrap, "--topic", "paced", "--partitions", "1",
                        "--duration", "2", "--throughput", "100", "--json", "-")
    assert produced.returncode == 0, produced.stderr
    report = json.loads(produced.stdout)
    summary = report["summary"]
    assert 0 < summary["records"] == summary["sent"] <= 201
    assert summary["records"] == sum(s["records"] for s in report["samples"])
    assert "records/s" in produced.stderr


def test_consume_short_of_messages_exits_1_after_the_timeout(broker, tmp_path):
    produced = kop_perf("produce", "--bootstrap-server", broker.bootstrap, "--topic", "few", "--partitions", "1",
                        "--num-records", "10")
    assert produced.returncode == 0, produced.stderr
    consumed = kop_perf("consume", "--bootstrap-server", broker.bootstrap, "--topic", "few", "--from-beginning",
                        "--messages", "11", "--timeout", "1", "--json", str(tmp_path / "c.json"))
    assert consumed.returncode == 1, consumed.stderr
    assert "10 of 11 records arrived" in consumed.stderr
    summary = json.loads((tmp_path / "c.json").read_text())["summary"]
    assert (summary["records"], summary["expected"], summary["timed_out"]) == (10, 11, True)


def assert_one_line_error(done: subprocess.CompletedProcess, *fragments: str) -> None:
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith("kop perf ") and all(f in lines[0] for f in fragments), lines[0]


def test_unreachable_broker_is_one_line(tmp_path):
    done = kop_perf("produce", "--bootstrap-server", f"127.0.0.1:{free_port()}", "--topic", "t", "--num-records", "1")
    assert_one_line_error(done, "cannot reach", "Connection refused")


def test_missing_topic_is_one_line_unless_partitions_create_it(broker):
    done = kop_perf("produce", "--bootstrap-server", broker.bootstrap, "--topic", "absent", "--num-records", "1")
    assert_one_line_error(done, "'absent' does not exist", "--partitions")
    done = kop_perf("consume", "--bootstrap-server", broker.bootstrap, "--topic", "absent", "--messages", "1")
    assert_one_line_error(done, "'absent' does not exist")
    # control: the same topic with --partitions is created and written
    done = kop_perf("produce", "--bootstrap-server", broker.bootstrap, "--topic", "absent", "--num-records", "1",
                    "--partitions", "3")
    assert done.returncode == 0, done.stderr
    assert len(ck_consume_all(broker.bootstrap, "absent", 1, partitions=(0, 1, 2))) == 1


@pytest.mark.parametrize("args, fragment", [
    (["--record-size", "0"], "--record-size"),
    (["--num-records", "-5"], "--num-records"),
    (["--throughput", "0"], "--throughput"),
    (["--duration", "soon"], "--duration"),
    (["--idempotence", "maybe"], "--idempotence"),
    (["--producer-property", "linger.ms"], "KEY=VALUE"),
    (["--idempotence", "on", "--acks", "1"], "--acks all"),
    (["--sequence-headers", "x", "--sequence-start", "9223372036854775807", "--num-records", "2"], "int64"),
])
def test_bad_option_values_are_one_line(args, fragment):
    """Rejected before any connection (the bootstrap server is never reached)."""
    done = kop_perf("produce", "--bootstrap-server", "127.0.0.1:1", "--topic", "t", *args)
    assert_one_line_error(done, fragment)


def test_bad_client_setting_is_one_line(broker):
    done = kop_perf("produce", "--bootstrap-server", broker.bootstrap, "--topic", "t", "--partitions", "1",
                    "--producer-property", "no.such.setting=1", "--num-records", "1")
    assert_one_line_error(done, "no.such.setting")


def test_transactional_produce_commits_what_it_sends(broker):
    done = kop_perf("produce", "--bootstrap-server", broker.bootstrap, "--topic", "perf-tx", "--partitions", "1",
                    "--transactional-id", "perf-tx", "--num-records", "50", "--transaction-duration-ms", "100")
    assert done.returncode == 0, done.stderr
    assert len(ck_read_to_end(broker.bootstrap, "perf-tx")) == 50  # read_committed: all committed


def test_help_shows_examples():
    for command in ("produce", "consume"):
        done = kop_perf(command, "--help")
        assert done.returncode == 0, done.stderr
        assert "examples:" in done.stdout and f"kop perf {command} --topic" in done.stdout
