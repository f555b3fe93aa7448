"""Run kafka-python's integration tests against a kop broker and read back each test's outcome."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from compat.broker import KopBroker
from compat.paths import REPO_ROOT
from compat.results import FAILED, PASSED, SKIPPED, TestOutcome

KAFKA_VERSION = "4.1.0"  # what kafka-python infers from kop's ApiVersions (test_kafka_version_infer checks it)
PREFIX = "test/integration/"  # allowlist names are node ids relative to this dir
PER_TEST_TIMEOUT_S = 120
# The broker settings kafka-python's own fixture gives the Kafka it starts (its kafka.properties template):
# broker id 0 (tests name it in replica assignments), 4 partitions, short group sessions allowed, no
# initial rebalance delay.
BROKER_PROPERTIES = {
    "broker.id": "0",
    "num.partitions": "4",
    "group.min.session.timeout.ms": "1000",
    "group.initial.rebalance.delay.ms": "0",
    # as kafka-python's own test brokers run: an authorizer that allows what no ACL names (the ACL test needs one)
    "authorizer.enabled": "true",
    "allow.everyone.if.no.acl.found": "true",
}
RUN_TIMEOUT_S = 3600
# Modules whose tests start a broker of their own with a security protocol: the shim starts kop for them
OWN_BROKER_MODULES = ("test_sasl_integration.py", "test_ssl_integration.py")


def _env(broker_uri: str, report: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        KAFKA_URI=broker_uri,
        KAFKA_VERSION=KAFKA_VERSION,
        # The fixtures insist that KAFKA_ROOT is an existing dir even though no Kafka is started from it.
        KAFKA_ROOT=tempfile.gettempdir(),
        PYTHONDONTWRITEBYTECODE="1",
    )
    if report is not None:
        env["KOP_COMPAT_REPORT"] = str(report)
    return env


def collect(sdist: Path) -> list[str]:
    """Every integration test's node id (relative to test/integration/); no broker needed."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", PREFIX],
        cwd=sdist, env=_env("PLAINTEXT://127.0.0.1:9", None), capture_output=True, text=True, timeout=300,
    )
    ids = [line.strip() for line in done.stdout.splitlines() if line.startswith(PREFIX) and "::" in line]
    if not ids:
        raise RuntimeError("collecting kafka-python's integration tests found none:\n" + done.stdout[-2000:]
                           + done.stderr[-2000:])
    return [node_id[len(PREFIX):] for node_id in ids]


def own_broker_env(report: Path) -> dict[str, str]:
    """For the modules that start brokers of their own: no KAFKA_URI (the SASL module skips itself when it is set),
    and the shim's KafkaFixture starts kop (shim/kop_fixture.py, which imports this clone's compat and kop)."""
    env = _env("", report)
    del env["KAFKA_URI"]
    env["KOP_COMPAT_OWN_BROKERS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return env


def run_tests(sdist: Path, names: list[str], broker: KopBroker, log_dir: Path) -> list[TestOutcome]:
    log_dir.mkdir(parents=True, exist_ok=True)
    report = log_dir / "report.jsonl"
    report.unlink(missing_ok=True)
    own = [name for name in names if name.startswith(OWN_BROKER_MODULES)]
    external = [name for name in names if name not in own]
    for chosen, env, log_name in ((external, _env(f"PLAINTEXT://{broker.bootstrap}", report), "pytest.log"),
                                  (own, own_broker_env(report), "pytest-own-brokers.log")):
        if chosen:
            _pytest(sdist, chosen, env, log_dir / log_name)
    recorded = _read_report(report)
    outcomes = []
    for name in names:
        outcome = recorded.get(name) or TestOutcome(name, FAILED, "no result recorded (pytest crashed or was killed)")
        outcomes.append(outcome)
        print(f"  {outcome.status.upper():7} {outcome.name}"
              + (f"  {outcome.detail[:300]}" if outcome.status != PASSED and outcome.detail else ""), flush=True)
    return outcomes


def _pytest(sdist: Path, names: list[str], env: dict[str, str], log_path: Path) -> None:
    command = [
        sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rN",
        f"--timeout={PER_TEST_TIMEOUT_S}", "-o", "log_level=INFO",
        *[PREFIX + name for name in names],
    ]
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, cwd=sdist, env=env, stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL)
        try:
            process.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)
        except BaseException:  # interrupted: leave no pytest behind
            process.kill()
            process.wait(timeout=30)
            raise


def _read_report(path: Path) -> dict[str, TestOutcome]:
    statuses = {"passed": PASSED, "failed": FAILED, "skipped": SKIPPED}
    recorded: dict[str, TestOutcome] = {}
    if not path.exists():
        return recorded
    for line in path.read_text().splitlines():
        entry = json.loads(line)
        name = entry["nodeid"].removeprefix(PREFIX)
        recorded[name] = TestOutcome(name, statuses[entry["outcome"]], entry["reason"], entry["duration"])
    return recorded
