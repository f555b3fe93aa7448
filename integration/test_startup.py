"""Operator mistakes at start-up, made with real `kop standalone` processes: each is refused with one line on stderr
and exit status 2, before anything is loaded, and no acknowledged record is ever lost to one. Two brokers on one data
directory (which once both acknowledged offset 5, and a restart lost one of them) are the central case."""
import contextlib
import os
import select
import signal
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from kafka import KafkaAdminClient
from kafka.admin import ConfigResource, ConfigResourceType

from integration.broker_process import BrokerProcess, free_port
from integration.clients import kp_consume_all, kp_produce
from integration.waiting import wait_for

TS = 1_700_000_000_000
STANDALONE_ADMIN_PORT = 8080


def run_kop(kop_script: str, *args: str, cwd: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([kop_script, "standalone", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def assert_refused(done: subprocess.CompletedProcess, *named: str) -> str:
    """Exit status 2, nothing on stdout (never ready), one line on stderr naming each of `named`."""
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr
    for text in named:
        assert text in lines[0]
    return lines[0]


@dataclass
class Serving:
    ready: str  # the line printed once the broker serves ("" when it exited instead)
    log: str = ""  # its stderr, once it stopped


@contextlib.contextmanager
def serving(kop_script: str, *args: str, cwd: str) -> Iterator[Serving]:
    """A `kop standalone` process for the block, stopped with SIGTERM (a clean exit) after it."""
    proc = subprocess.Popen([kop_script, "standalone", *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        run = Serving(proc.stdout.readline())
        yield run
    finally:
        proc.send_signal(signal.SIGTERM)
        _, log = proc.communicate(timeout=20)
    run.log = log
    assert proc.returncode == 0, log


@pytest.fixture
def busy_port():
    """A port another process listens on."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def files(data_dir: str, but: str = "") -> dict[str, tuple[int, int]]:
    """Every file under the data directory (except `but`) with its size and modification time: what loading it
    would change (a broker starts a new ledger in every partition it opens)."""
    out = {}
    for root, _, names in os.walk(data_dir):
        for name in names:
            path = os.path.relpath(os.path.join(root, name), data_dir)
            if path != but:
                stat = os.stat(os.path.join(root, name))
                out[path] = (stat.st_size, stat.st_mtime_ns)
    return out


FAILURES = {  # what the operator got wrong -> (arguments, properties file or None, what the line names)
    "listen-port-out-of-range": (["--listen", "127.0.0.1:99999"], None, ["--listen", "at most 65535"]),
    "listen-without-port": (["--listen", "127.0.0.1"], None, ["--listen", "expected HOST:PORT"]),
    "bad-log-level": (["--log-level", "LOUD"], None, ["--log-level", "LOUD"]),
    "bad-log-format": (["--log-format", "xml"], None, ["--log-format", "xml"]),
    "negative-admin-port": (["--admin-port", "-7"], None, ["--admin-port", "at least -1"]),
    "wildcard-without-advertised-host": (["--listen", "0.0.0.0:0"], None, ["advertised host"]),
    "unassignable-host": (["--listen", "192.0.2.1:0"], None, ["192.0.2.1:0", "Cannot assign requested address"]),
    "unknown-host": (["--listen", "no-such-host.invalid:0"], None, ["no-such-host.invalid", "unknown host"]),
    "missing-config-file": (["--config", "missing.properties"], None, ["missing.properties", "No such file"]),
    "config-line-without-value": ([], "num.partitions 3\n", [":1: expected key=value"]),
    "config-value-out-of-range": ([], "message.max.bytes=-5\n", [":1: message.max.bytes=-5: must be at least 1"]),
    "config-not-a-boolean": ([], "fsync=sometimes\n", ["fsync=sometimes: not a boolean"]),
    "config-keys-disagree": ([], "broker.id=0\nnode.id=1\n", ["node.id=1 contradicts line 1: broker.id=0"]),
    "listener-without-protocol": ([], "listeners=PLAINTEXT://:9092,CONTROLLER://:9093\n",
                                  ["listener name CONTROLLER has no security protocol"]),
    "tls-listener-without-keystore": ([], "listeners=SASL_SSL://127.0.0.1:9093\n", ["needs ssl.keystore.location"]),
    "tls-keystore-missing": ([], "listeners=SSL://127.0.0.1:0\nssl.keystore.location=missing.pem\n",
                             ["cannot serve TLS", "missing.pem"]),
    "oauthbearer-without-validator": ([], "sasl.enabled.mechanisms=SCRAM-SHA-256,OAUTHBEARER\n",
                                      ["OAUTHBEARER", "no token validator"]),
    "several-log-dirs": ([], "log.dirs=/a,/b\n", ["kop keeps its data in one directory, got 2"]),
    "data-dir-parent-missing": (["--data-dir", "missing/data"], None, ["missing/data", "does not exist"]),
    "data-dir-is-a-file": (["--data-dir", "a-file"], None, ["a-file is not a directory"]),
}


@pytest.mark.parametrize("mistake", FAILURES)
def test_each_startup_mistake_is_one_line_and_exit_status_2(kop_script, tmp_path, mistake):
    args, properties, named = FAILURES[mistake]
    (tmp_path / "a-file").write_text("not a directory\n")
    if properties is not None:
        (tmp_path / "kop.properties").write_text(properties)
        args = [*args, "--config", "kop.properties"]
    done = run_kop(kop_script, "--listen", "127.0.0.1:0", "--admin-port", "0", "--data-dir", "data", *args,
                   cwd=str(tmp_path))
    assert_refused(done, *named)


@pytest.mark.file_storage  # its control looks for the files a start writes
def test_a_port_in_use_fails_before_the_topics_are_loaded(kop_script, tmp_path, busy_port):
    data = str(tmp_path / "data")
    broker = BrokerProcess(data, program=(kop_script,)).start()
    kp_produce(broker.bootstrap, "kept", [(None, b"v", [], TS)])
    broker.stop()
    before = files(data, but=".lock")  # which the refused broker takes before the ports, and writes its pid to
    for args, named in (
            (["--listen", f"127.0.0.1:{busy_port}", "--admin-port", "0"], "for Kafka clients"),
            (["--listen", "127.0.0.1:0", "--admin-port", str(busy_port)], "for the admin API")):
        refused = run_kop(kop_script, "--data-dir", data, *args, cwd=str(tmp_path))
        assert_refused(refused, f"cannot listen on 127.0.0.1:{busy_port} {named}: Address already in use")
        assert files(data, but=".lock") == before  # not loaded: no ledger rolled, no file touched
    # Control: the same start on a free port loads the topic, and that shows in the files.
    broker.start()
    try:
        assert files(data, but=".lock") != before
        assert [r.value for r in kp_consume_all(broker.bootstrap, "kept", 1)] == [b"v"]
    finally:
        broker.stop()


@pytest.mark.file_storage  # its control looks for the files a start writes
def test_a_second_broker_on_the_same_data_directory_is_refused_and_no_acked_record_is_lost(kop_script, tmp_path):
    data = str(tmp_path / "data")
    first = BrokerProcess(data, program=(kop_script,)).start()
    try:
        acked = kp_produce(first.bootstrap, "t", [(None, f"first-{i}".encode(), [], TS) for i in range(5)])
        assert [m.offset for m in acked] == [0, 1, 2, 3, 4]
        with open(os.path.join(data, ".lock")) as f:
            assert f.read() == f"{first.proc.pid}\n"
        before = files(data)
        second = run_kop(kop_script, "--listen", f"127.0.0.1:{free_port()}", "--admin-port", "0",
                         "--data-dir", data, cwd=str(tmp_path))
        assert_refused(second, f"data directory {data} is in use by another kop (pid {first.proc.pid}")
        assert files(data) == before  # refused before it read or wrote anything, the lock file included
        # The first broker goes on as before: the next record gets offset 5.
        [sixth] = kp_produce(first.bootstrap, "t", [(None, b"first-5", [], TS)])
        assert sixth.offset == 5
        first.stop()
        stopped = files(data, but=".lock")
        first.start()
        assert files(data, but=".lock") != stopped  # control: a broker that does get the directory loads it, and that shows
        got = kp_consume_all(first.bootstrap, "t", 6)
        assert [(r.offset, r.value) for r in got] == [(i, f"first-{i}".encode()) for i in range(6)]
    finally:
        first.stop()


def test_a_broker_killed_with_9_leaves_a_stale_lock_that_does_not_block_its_restart(kop_script, tmp_path):
    data = str(tmp_path / "data")
    broker = BrokerProcess(data, program=(kop_script,)).start()
    try:
        kp_produce(broker.bootstrap, "t", [(None, b"before-kill", [], TS)])
        killed = broker.proc.pid
        broker.kill()
        with open(os.path.join(data, ".lock")) as f:
            assert f.read() == f"{killed}\n"  # the lock file outlives its holder, as Kafka's .lock does
        with pytest.raises(ProcessLookupError):
            os.kill(killed, 0)  # ... and the holder is gone: the lock is stale
        broker.start()
        with open(os.path.join(data, ".lock")) as f:
            assert f.read() == f"{broker.proc.pid}\n"
        assert [r.value for r in kp_consume_all(broker.bootstrap, "t", 1)] == [b"before-kill"]
    finally:
        broker.stop()


# Makes $0 read-only in a mount namespace of its own, checks that it is (exit 99 if not), then runs the command.
READ_ONLY_MOUNT = ('mount --bind "$0" "$0" && mount -o remount,ro,bind "$0" "$0" || exit 98; '
                   'if touch "$0/probe" 2>/dev/null; then exit 99; fi; exec "$@"')


def test_a_read_only_data_directory_is_refused(kop_script, tmp_path):
    data = str(tmp_path / "data")
    broker = BrokerProcess(data, program=(kop_script,)).start()  # a directory in use before, lock file and all
    kp_produce(broker.bootstrap, "t", [(None, b"v", [], TS)])
    broker.stop()
    done = subprocess.run(["unshare", "--map-root-user", "--mount", "sh", "-c", READ_ONLY_MOUNT, data, kop_script,
                           "standalone", "--listen", "127.0.0.1:0", "--admin-port", "0", "--data-dir", data],
                          capture_output=True, text=True, timeout=30)
    if done.returncode == 98 or "unshare: " in done.stderr:
        pytest.skip(f"cannot make a read-only mount here: {done.stderr.strip()}")
    assert done.returncode != 99, "control: the mount was still writable"
    assert_refused(done, f"data directory {data} is not writable: Read-only file system")


def test_the_default_admin_port_gives_way_but_one_asked_for_does_not(kop_script, tmp_path):
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            holder.bind(("127.0.0.1", STANDALONE_ADMIN_PORT))
            holder.listen()
        except OSError:
            pass  # taken already, by someone else: the same situation
        asked = run_kop(kop_script, "--listen", "127.0.0.1:0", "--admin-port", str(STANDALONE_ADMIN_PORT),
                        "--data-dir", "data", cwd=str(tmp_path))
        assert_refused(asked, f"cannot listen on 127.0.0.1:{STANDALONE_ADMIN_PORT} for the admin API")
        port = free_port()
        with serving(kop_script, "--listen", f"127.0.0.1:{port}", "--data-dir", "data", cwd=str(tmp_path)) as run:
            assert run.ready.startswith(f"kop standalone ready on 127.0.0.1:{port} ") and "admin=" not in run.ready
            kp_produce(f"127.0.0.1:{port}", "t", [(None, b"v", [], TS)])
        assert f"admin port {STANDALONE_ADMIN_PORT} is in use; running without the admin API" in run.log


def test_kafka_listener_and_log_dir_keys_configure_a_real_broker(kop_script, tmp_path):
    """A properties file in Kafka's words alone says where to listen, what to advertise and where the data goes."""
    port = free_port()
    log_dir = tmp_path / "kafka-logs"
    (tmp_path / "server.properties").write_text(
        f"listeners=PLAINTEXT://127.0.0.1:{port}\nadvertised.listeners=PLAINTEXT://localhost:{port}\n"
        f"log.dirs={log_dir}\nlog.retention.hours=2\nnum.partitions=2\nnum.network.threads=3\n")
    with serving(kop_script, "--config", "server.properties", "--admin-port", "0", cwd=str(tmp_path)) as run:
        assert run.ready.startswith(f"kop standalone ready on 127.0.0.1:{port} data={log_dir}"), run.ready
        kp_produce(f"127.0.0.1:{port}", "t", [(None, b"v", [], TS)])
        admin = KafkaAdminClient(bootstrap_servers=f"127.0.0.1:{port}")
        try:
            configs = admin.describe_configs([ConfigResource(ConfigResourceType.BROKER, "1")],
                                             config_filter="all")["broker"]["1"]
            assert configs["advertised.listeners"]["value"] == f"PLAINTEXT://localhost:{port}"
            assert configs["log.retention.ms"]["value"] == str(2 * 3600 * 1000)
            assert configs["num.partitions"]["value"] == "2"
            assert [(b["host"], b["port"]) for b in admin.describe_cluster()["brokers"]] == [("localhost", port)]
        finally:
            admin.close()
        assert wait_for(lambda: os.path.isdir(log_dir / "ledgers"), "the ledgers in log.dirs", timeout=10)
    assert "unknown key num.network.threads is ignored" in run.log  # foreign, and said so
    assert not (tmp_path / "data").exists()  # nothing in the default ./data


NOT_PROTOBUF = b"\x0a\xff\xff\xff\xff\x0f"  # a length-delimited field running far past the end: no protobuf parses it
DAMAGED_FILES = {
    "topic-metadata": "topics/public/default/kept",
    "ledger-list": "ledgers/public/default/kept-partition-0/ledgers.info",
    "policies": "policies",
    "producer-ids": "producer-ids",
}


@pytest.mark.parametrize("damaged", DAMAGED_FILES)
@pytest.mark.file_storage
def test_a_damaged_data_file_stops_the_start_with_one_line_naming_it(kop_script, tmp_path, damaged):
    data = str(tmp_path / "data")
    broker = BrokerProcess(data, program=(kop_script,)).start()
    kp_produce(broker.bootstrap, "kept", [(None, b"v", [], TS)])
    broker.stop()
    path = os.path.join(data, DAMAGED_FILES[damaged])
    with open(path, "wb") as f:
        f.write(NOT_PROTOBUF)
    refused = run_kop(kop_script, "--listen", "127.0.0.1:0", "--admin-port", "0", "--data-dir", data,
                      cwd=str(tmp_path))
    # Refused once loading began (after the start-up's log lines): exit 2, no traceback, the error the last line.
    assert refused.returncode == 2 and refused.stdout == "", refused.stderr
    assert "Traceback" not in refused.stderr
    last = refused.stderr.splitlines()[-1]
    assert last.startswith("kop standalone: error: cannot load") and path in last and "not a valid" in last, last


@pytest.mark.file_storage
def test_sigterm_while_partitions_load_stops_the_broker_cleanly(kop_script, tmp_path):
    """An orchestrator giving up on a slow start: SIGTERM during the load ends it with a clean stop (exit 0), and
    the next start serves every record."""
    data = str(tmp_path / "data")
    broker = BrokerProcess(data, program=(kop_script,)).start()
    kp_produce(broker.bootstrap, "kept", [(None, b"v", [], TS)])
    broker.stop()
    admin_port = free_port()
    (tmp_path / "slow.properties").write_text("testPartitionLoadDelayMs=5000\n")
    proc = subprocess.Popen([kop_script, "standalone", "--listen", "127.0.0.1:0", "--admin-port", str(admin_port),
                             "--data-dir", data, "--config", "slow.properties", "--log-level", "INFO"],
                            cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: _ready_status(admin_port) == 503, "the broker loading its partitions", timeout=20)
        proc.send_signal(signal.SIGTERM)
        out, log = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, log
    assert "stopped while starting" in log and "Traceback" not in log
    assert out == ""  # never announced itself ready
    broker.start()
    try:
        assert [r.value for r in kp_consume_all(broker.bootstrap, "kept", 1)] == [b"v"]
    finally:
        broker.stop()


def _ready_status(admin_port: int) -> int | None:
    import urllib.error
    import urllib.request
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/ready", timeout=2) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


def test_a_stop_during_a_fetch_long_poll_logs_no_failed_request(tmp_path):
    """A fetch parked in its long poll when the broker stops is cancelled with the broker, not a request that
    failed: the stop logs no error and no traceback."""
    from integration.fetch_requests import fetch_request
    from integration.idem_raw import RawKafka
    broker = BrokerProcess(str(tmp_path / "data")).start()
    with RawKafka(broker.port) as raw:
        raw.create_topic("parked")
        raw.send(fetch_request([("parked", 0, 0)], max_wait_ms=60_000, min_bytes=1))
        readable, _, _ = select.select([raw], [], [], 1.0)
        assert not readable, "control: the fetch was answered instead of waiting in its long poll"
        assert broker.stop() == 0
    log = open(broker.log_path, encoding="utf-8", errors="replace").read()
    assert "failed; closing" not in log and "Traceback" not in log, log[-3000:]
