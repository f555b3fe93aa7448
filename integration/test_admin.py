"""`kop admin` against a real broker: deduplication policies at namespace and topic level round-trip through the
CLI, remove falls back to the next level, `--applied` resolves topic > namespace > broker, the partitions follow
at once (stats), policies survive a restart, and bad input is answered with an error, never a crash."""
import json
import subprocess
import sys
import urllib.request

import pytest

from integration.broker_process import REPO, BrokerProcess
from integration.idem_raw import RawKafka
from protocol.errors import ErrorCode

BROKER_INTERVAL = 77  # brokerDeduplicationSnapshotIntervalSeconds, distinct from every level's value below


@pytest.fixture
def admin_broker(tmp_path):
    broker = BrokerProcess(str(tmp_path / "data"), admin_port=0,
                           config={"brokerDeduplicationSnapshotIntervalSeconds": str(BROKER_INTERVAL)}).start()
    yield broker
    broker.stop()


def kop_admin(broker: BrokerProcess, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kop.cli", "admin", "--admin-url", broker.admin_url, *args],
                          cwd=REPO, capture_output=True, text=True, timeout=60)


def admin_json(broker: BrokerProcess, *args: str):
    """Run a command that must succeed; its stdout parsed as JSON (None when it printed nothing)."""
    done = kop_admin(broker, *args)
    assert done.returncode == 0, f"kop admin {' '.join(args)} failed: {done.stderr}"
    return json.loads(done.stdout) if done.stdout.strip() else None


def admin_change(broker: BrokerProcess, *args: str) -> str:
    """Run a set-/remove- command that must succeed; the change it printed."""
    done = kop_admin(broker, *args)
    assert done.returncode == 0, f"kop admin {' '.join(args)} failed: {done.stderr}"
    return done.stdout.strip()


def admin_fails(broker: BrokerProcess, *args: str, status: int) -> str:
    done = kop_admin(broker, *args)
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    assert done.stderr.startswith(f"error: {status} "), done.stderr
    return done.stderr


def http(broker: BrokerProcess, method: str, path: str, body: bytes | None = None) -> tuple[int, object]:
    request = urllib.request.Request(broker.admin_url + path, data=body, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            raw, status = response.read(), response.status
    except urllib.error.HTTPError as exc:
        raw, status = exc.read(), exc.code
    return status, json.loads(raw) if raw.strip() else None


def create_topic(broker: BrokerProcess, name: str, partitions: int = 1) -> None:
    with RawKafka(broker.port) as kafka:
        assert kafka.create_topic(name, partitions) == ErrorCode.NONE


def dedup_status(broker: BrokerProcess, topic: str) -> str:
    return admin_json(broker, "topics", "stats", topic)["deduplicationStatus"]


@pytest.mark.slow  # over 10 s: make test-slow runs it, so make test keeps its budget
def test_namespace_policies_round_trip_and_remove_falls_back_to_the_broker(admin_broker):
    ns = "public/default"
    assert admin_json(admin_broker, "namespaces", "get-deduplication", ns) is None
    assert admin_json(admin_broker, "namespaces", "get-deduplication", ns, "--applied") is True  # broker default
    assert admin_change(admin_broker, "namespaces", "set-deduplication", ns, "--disable") == \
        "deduplication of namespace public/default: null -> false"
    assert admin_json(admin_broker, "namespaces", "get-deduplication", ns) is False
    assert admin_json(admin_broker, "namespaces", "get-deduplication", ns, "--applied") is False
    assert admin_change(admin_broker, "namespaces", "set-deduplication", ns, "-e") == \
        "deduplication of namespace public/default: false -> true"
    assert admin_json(admin_broker, "namespaces", "get-deduplication", ns) is True
    assert admin_change(admin_broker, "namespaces", "remove-deduplication", ns) == \
        "deduplication of namespace public/default: true -> null"
    assert admin_json(admin_broker, "namespaces", "get-deduplication", ns) is None
    changes = [line.split("changed: ")[1] for line in open(admin_broker.log_path).read().splitlines()
               if "admin: namespace public/default policy deduplication_enabled changed" in line]
    assert changes == ["null -> false", "false -> true", "true -> null"]  # the broker logs each change

    assert admin_json(admin_broker, "namespaces", "get-deduplication-snapshot-interval", ns) is None
    admin_change(admin_broker, "namespaces", "set-deduplication-snapshot-interval", ns, "-i", "60")
    assert admin_json(admin_broker, "namespaces", "get-deduplication-snapshot-interval", ns) == 60
    admin_change(admin_broker, "namespaces", "remove-deduplication-snapshot-interval", ns)
    assert admin_json(admin_broker, "namespaces", "get-deduplication-snapshot-interval", ns) is None
    assert admin_json(admin_broker, "namespaces", "get-deduplication-snapshot-interval", ns,
                      "--applied") == BROKER_INTERVAL


@pytest.mark.slow  # 5-13 s of restarts, retention or snapshot rounds: make test-slow
def test_topic_policies_resolve_topic_over_namespace_over_broker(admin_broker):
    create_topic(admin_broker, "orders", 2)
    create_topic(admin_broker, "other")
    ns = "public/default"

    def applied(topic: str, what: str = "deduplication"):
        return admin_json(admin_broker, "topics", f"get-{what}", topic, "--applied")

    assert applied("orders") is True and dedup_status(admin_broker, "orders") == "Enabled"
    admin_change(admin_broker, "namespaces", "set-deduplication", ns, "--disable")
    assert admin_json(admin_broker, "topics", "get-deduplication", "orders") is None
    assert applied("orders") is False
    assert dedup_status(admin_broker, "orders") == "Disabled"
    assert dedup_status(admin_broker, "other") == "Disabled"

    admin_change(admin_broker, "topics", "set-deduplication", "persistent://public/default/orders", "--enable")
    assert admin_json(admin_broker, "topics", "get-deduplication", "orders") is True
    assert applied("orders") is True and applied("other") is False
    stats = admin_json(admin_broker, "topics", "stats", "orders")
    assert [p["deduplicationStatus"] for p in stats["partitions"].values()] == ["Enabled", "Enabled"]
    assert dedup_status(admin_broker, "other") == "Disabled"

    admin_change(admin_broker, "topics", "remove-deduplication", "public/default/orders")
    assert admin_json(admin_broker, "topics", "get-deduplication", "orders") is None
    assert applied("orders") is False and dedup_status(admin_broker, "orders") == "Disabled"
    admin_change(admin_broker, "namespaces", "remove-deduplication", ns)
    assert applied("orders") is True and dedup_status(admin_broker, "orders") == "Enabled"

    what = "deduplication-snapshot-interval"
    assert applied("orders", what) == BROKER_INTERVAL
    admin_change(admin_broker, "namespaces", f"set-{what}", ns, "-i", "30")
    assert applied("orders", what) == 30
    admin_change(admin_broker, "topics", f"set-{what}", "orders", "-i", "5")
    assert admin_json(admin_broker, "topics", f"get-{what}", "orders") == 5
    assert applied("orders", what) == 5 and applied("other", what) == 30
    admin_change(admin_broker, "topics", f"remove-{what}", "orders")
    assert admin_json(admin_broker, "topics", f"get-{what}", "orders") is None
    assert applied("orders", what) == 30
    admin_change(admin_broker, "namespaces", f"remove-{what}", ns)
    assert applied("orders", what) == BROKER_INTERVAL


def test_policies_survive_a_restart(admin_broker):
    create_topic(admin_broker, "kept")
    create_topic(admin_broker, "plain")
    admin_change(admin_broker, "namespaces", "set-deduplication", "public/default", "--disable")
    admin_change(admin_broker, "namespaces", "set-deduplication-snapshot-interval", "public/default", "-i", "45")
    admin_change(admin_broker, "topics", "set-deduplication", "kept", "--enable")
    admin_change(admin_broker, "topics", "set-deduplication-snapshot-interval", "kept", "-i", "9")

    admin_broker.restart()

    assert admin_json(admin_broker, "namespaces", "get-deduplication", "public/default") is False
    assert admin_json(admin_broker, "namespaces", "get-deduplication-snapshot-interval", "public/default") == 45
    assert admin_json(admin_broker, "topics", "get-deduplication", "kept") is True
    assert admin_json(admin_broker, "topics", "get-deduplication-snapshot-interval", "kept") == 9
    assert admin_json(admin_broker, "topics", "get-deduplication", "plain", "--applied") is False
    assert dedup_status(admin_broker, "kept") == "Enabled"
    assert dedup_status(admin_broker, "plain") == "Disabled"


def test_listing_and_stats_shapes(admin_broker):
    create_topic(admin_broker, "b", 2)
    create_topic(admin_broker, "a")
    assert admin_json(admin_broker, "topics", "list", "public/default") == [
        "persistent://public/default/a-partition-0", "persistent://public/default/b-partition-0",
        "persistent://public/default/b-partition-1"]
    assert admin_json(admin_broker, "topics", "list-partitioned-topics", "public/default") == [
        "persistent://public/default/a", "persistent://public/default/b"]

    stats = admin_json(admin_broker, "topics", "stats", "b")
    assert stats["metadata"] == {"partitions": 2}
    assert sorted(stats["partitions"]) == ["persistent://public/default/b-partition-0",
                                           "persistent://public/default/b-partition-1"]
    one = admin_json(admin_broker, "topics", "stats", "b-partition-1")
    assert one["deduplicationStatus"] == "Enabled" and one["publishers"] == [] and one["highWatermark"] == 0

    internal = admin_json(admin_broker, "topics", "stats-internal", "b-partition-0")
    assert internal["lastConfirmedEntry"] == "-1:-1"
    assert [sorted(l) for l in internal["ledgers"]] == [["entries", "ledgerId", "offloaded", "size"]]
    assert internal["cursors"]["pulsar.dedup"] == {"markDeletePosition": "-1:-1", "properties": {},
                                                   "stringProperties": {}}
    both = admin_json(admin_broker, "topics", "stats-internal", "b")
    assert both["metadata"] == {"partitions": 2} and len(both["partitions"]) == 2


def test_bad_input_is_an_error_answer_and_the_broker_keeps_serving(admin_broker):
    create_topic(admin_broker, "t")
    base = "/admin/v2/namespaces/public/default"
    topic = "/admin/v2/persistent/public/default/t"
    admin_fails(admin_broker, "namespaces", "get-deduplication", "other/ns", status=404)
    admin_fails(admin_broker, "namespaces", "set-deduplication", "public/nope", "--enable", status=404)
    admin_fails(admin_broker, "topics", "stats", "missing", status=404)
    admin_fails(admin_broker, "topics", "stats", "t-partition-1", status=404)  # t has one partition
    admin_fails(admin_broker, "topics", "set-deduplication", "missing", "--disable", status=404)
    admin_fails(admin_broker, "topics", "list", "other/ns", status=404)
    admin_fails(admin_broker, "topics", "set-deduplication-snapshot-interval", "t", "-i", "-1", status=400)
    assert kop_admin(admin_broker, "topics", "stats", "non-persistent://public/default/t").returncode == 1
    assert kop_admin(admin_broker, "namespaces", "set-deduplication", "public/default").returncode == 2  # usage

    for path, body in [(f"{base}/deduplication", b"not json"), (f"{base}/deduplication", b'"true"'),
                       (f"{base}/deduplication", b"1"), (f"{base}/deduplication", b""),
                       (f"{base}/deduplicationSnapshotInterval", b"true"),
                       (f"{base}/deduplicationSnapshotInterval", b"1.5"),
                       (f"{base}/deduplicationSnapshotInterval", str(2**31).encode()),
                       (f"{base}/deduplicationSnapshotInterval", b"[" * 100_000),
                       (f"{topic}/deduplicationEnabled", b"{}"),
                       (f"{topic}/deduplicationEnabled", b"\xff\xfe")]:
        status, answer = http(admin_broker, "POST", path, body)
        assert status == 400 and answer["reason"], (path, body, status, answer)
    assert http(admin_broker, "GET", f"{topic}/deduplicationEnabled?applied=maybe")[0] == 400
    assert http(admin_broker, "PUT", f"{base}/deduplication", b"true")[0] == 405
    assert http(admin_broker, "GET", "/admin/v2/nothing/here")[0] == 404
    # Fault injection is off unless the broker is configured for it.
    assert http(admin_broker, "POST", "/admin/v2/kop/failpoints/t/0", b'{"write_failures": 1}')[0] == 404

    # Nothing above changed a policy, and the broker still answers.
    assert http(admin_broker, "GET", f"{base}/deduplication") == (200, None)
    assert http(admin_broker, "GET", f"{topic}/deduplicationSnapshotInterval") == (200, None)
    assert admin_json(admin_broker, "topics", "get-deduplication", "t", "--applied") is True


def test_users_set_from_the_command_line_sets_the_named_user_without_asking_for_admin_credentials(admin_broker):
    """`users set alice` once took `alice` for the admin user to authenticate as (both were `--user`'s dest) and
    asked for that user's admin password instead of reading the new one."""
    done = subprocess.run([sys.executable, "-m", "kop.cli", "admin", "--admin-url", admin_broker.admin_url, "users",
                           "set", "alice", "--password-stdin"], input="wonderland\n", cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "password of" not in done.stderr
    assert [c["mechanism"] for c in admin_json(admin_broker, "users", "list")["alice"]] == ["SCRAM-SHA-256",
                                                                                           "SCRAM-SHA-512"]


def test_cli_reports_an_unreachable_admin_api(tmp_path):
    unused = BrokerProcess(str(tmp_path / "never-started"), admin_port=0)
    unused.admin_port = 1  # nothing listens on port 1
    done = kop_admin(unused, "topics", "list", "public/default")
    assert done.returncode == 1 and "cannot reach the admin API" in done.stderr


def test_standalone_serves_the_admin_api_on_8080_unless_told_otherwise(tmp_path):
    """The admin port comes from the command line, else the properties file, else 8080; only that default gives way
    when its port is in use (the broker then runs without the admin API: integration/test_startup.py)."""
    from kop.cli import STANDALONE_ADMIN_PORT, build_config, build_parser

    def admin_port(*argv: str) -> tuple[int, bool]:
        standalone = build_config(build_parser().parse_args(["standalone", *argv]))
        return standalone.config.admin_port, standalone.admin_port_may_be_taken

    properties = tmp_path / "kop.properties"
    properties.write_text("webServicePort=9191\n")
    assert admin_port("--config", str(properties)) == (9191, False)
    assert admin_port("--config", str(properties), "--admin-port", "-1") == (-1, False)
    properties.write_text("admin_port=0\n")
    assert admin_port("--config", str(properties)) == (0, False)
    assert admin_port("--admin-port", "0") == (0, False)
    assert admin_port("--admin-port", str(STANDALONE_ADMIN_PORT)) == (STANDALONE_ADMIN_PORT, False)
    assert admin_port() == (STANDALONE_ADMIN_PORT, True)
