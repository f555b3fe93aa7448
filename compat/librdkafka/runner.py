"""Run chosen librdkafka tests against a kop broker, one test number per `test-runner` process.

One process per number keeps a crash or hang of one test from taking the others with it, and lets the
gate notice when the broker itself died under a test. `test-runner` selects by number only (TESTS is a
substring match on "0045"), so the names of one number that were not asked for are dropped from the result.
"""
from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from compat.broker import KopBroker
from compat.librdkafka.catalog import CatalogTest
from compat.results import FAILED, PASSED, SKIPPED, TestOutcome
from compat.system import pin_to

KAFKA_VERSION = "3.9.0"  # the Kafka version kop answers as; gates version-dependent test paths
# Stands in for a Kafka distribution: tests run $KAFKA_PATH/bin/kafka-topics.sh (see kafka_topics.py) and 0098
# runs its Java producer with bin/kafka-run-class.sh on the jars in libs/ (see kafka_libs.py).
KAFKA_PATH = Path(__file__).resolve().parent / "kafka_path"
TIMEOUT_MULTIPLIER = 2.0  # kop is a Python broker: give the suite's own timeouts some slack
PROCESS_TIMEOUT_S = 600
NO_OP = "did nothing under -Q (all its sub-tests are non-quick): a pass would prove nothing"  # a hung test-runner is killed after this

_ANSI = re.compile(r"\x1b\[[0-9;]*m|\x1b\(B")
_SUMMARY_ROW = re.compile(r"^\|\s*(\S+)\s*\|\s*([A-Z]+)\s*\|\s*([0-9.]+)s\s*\|\s?(.*)$")
_TEST_LINE = re.compile(r"^\[([^\s/]+)\s*/\s*[0-9.]+s\]\s?(.*)$")
# What test-runner prints for every test, whether or not the test did anything.
_BOILERPLATE = re.compile(
    r"Running test|Stats written to file|Using topic|: duration |Test resource usage summary|Test \S+ PASSED"
    r"|Setting test timeout|^\s*$"
)
_FAILURE_HEAD = re.compile(r'### Test "([^"]+)" failed at (\S+) at .*: ###')
_STATES = {"PASSED": PASSED, "FAILED": FAILED, "RUNNING": FAILED, "SKIPPED": SKIPPED, "DNS": SKIPPED}


def runner_args(*, idempotent: bool, allow_sockem: bool, scenario: str = "default", quick: bool = True) -> list[str]:
    """`-p1 -Q -E -L`: sequential, quick mode, no sockem, no mock-cluster tests; `-P`: idempotent producer.

    Tests allowlisted with the `full` tag run without -Q: under -Q they skip all their sub-tests.
    """
    args = ["-p1", "-Q", "-L"] if quick else ["-p1", "-L"]
    if not allow_sockem:
        args.append("-E")
    if idempotent:
        args.append("-P")
    if scenario != "default":
        args += ["-s", scenario]
    return args


def run_scenario(test: CatalogTest) -> str:
    """The scenario a test runs under: "default" when its list allows it (0103 says "default,ak23")."""
    choices = test.scenario.split(",")
    return "default" if "default" in choices else choices[0]


def scenario_properties(tests_dir: Path, scenario: str) -> dict[str, str]:
    """Broker settings of a test scenario, read from the suite's own tests/scenarios/<name>.json.

    Those files configure trivup's Kafka cluster (and carry trailing commas, so they are read by pattern,
    not as JSON). Replication factor is left out: kop is a single broker.
    """
    text = (tests_dir / "scenarios" / f"{scenario}.json").read_text()
    # trivup runs a stock Kafka: where kop's default differs from Kafka's, the suite expects Kafka's.
    # With kop's 0 ms initial rebalance delay the first of two consumers that subscribe together gets a
    # generation of its own, and 0089/0102 see a revoke they do not expect.
    # trivup's Kafka also runs an authorizer that allows what no ACL names: 0081 creates ACLs, and 0109, 0115 and
    # 0119 deny topics to everyone with kafka-acls.sh.
    properties = {"group.initial.rebalance.delay.ms": "3000", "authorizer.enabled": "true",
                  "allow.everyone.if.no.acl.found": "true"}
    auto_create = re.search(r'"auto_create_topics"\s*:\s*"?(true|false)"?', text)
    partitions = re.search(r'"num_partitions"\s*:\s*(\d+)', text)
    if auto_create:
        properties["auto.create.topics.enable"] = auto_create.group(1)
    if partitions:
        properties["num.partitions"] = partitions.group(1)
    return properties


@dataclass(frozen=True)
class SaslAccess:
    """How the `sasl` pass's clients reach the broker: its SASL_PLAINTEXT listener as a SCRAM user (the tests'
    own clients read it from test.conf; the kafka-topics.sh and kafka-acls.sh shims keep the plaintext one)."""

    port: int
    mechanism: str = "SCRAM-SHA-256"
    user: str = "librdkafka-tests"
    password: str = "librdkafka-tests-password"

    def broker_properties(self) -> dict[str, str]:
        # sessions short enough that 0142 sees its clients re-authenticate (it asks for a non-zero lifetime)
        return {"listeners": f"PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:{self.port}",
                "connections.max.reauth.ms": "10000"}

    def create_user(self, data_dir: Path) -> None:
        from kop.security.users import UserStore
        data_dir.mkdir(parents=True, exist_ok=True)
        asyncio.run(UserStore(str(data_dir)).set_password(self.user, self.password))

    def client_conf(self) -> dict[str, str]:
        return {"bootstrap.servers": f"127.0.0.1:{self.port}", "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": self.mechanism, "sasl.username": self.user, "sasl.password": self.password}

    def env(self) -> dict[str, str]:
        return {}


@dataclass(frozen=True)
class OAuthBearerAccess:
    """How the `oauthbearer` pass's clients reach the broker: its SASL_PLAINTEXT listener with OAUTHBEARER, librdkafka
    making unsecured JWTs and kop validating them, requiring the scope the tests' tokens carry, as trivup's Kafka
    does (0142 makes its own tokens as `principal=admin scope=requiredScope`)."""

    port: int
    principal: str = "admin"
    scope: str = "requiredScope"

    def broker_properties(self) -> dict[str, str]:
        return {"listeners": f"PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:{self.port}",
                "connections.max.reauth.ms": "10000", "sasl.enabled.mechanisms": "OAUTHBEARER",
                "sasl.oauthbearer.unsecured.validator.enabled": "true", "unsecuredValidatorRequiredScope": self.scope}

    def client_conf(self) -> dict[str, str]:
        return {"bootstrap.servers": f"127.0.0.1:{self.port}", "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": "OAUTHBEARER", "enable.sasl.oauthbearer.unsecure.jwt": "true",
                "sasl.oauthbearer.config": f"principal={self.principal} scope={self.scope}"}

    def env(self) -> dict[str, str]:
        return {}


class ClientAccess(Protocol):
    """How a secured pass's test clients reach the broker: test.conf settings and environment variables."""

    def client_conf(self) -> dict[str, str]: ...

    def env(self) -> dict[str, str]: ...


def write_test_conf(path: Path, bootstrap: str, access: ClientAccess | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    conf = {"bootstrap.servers": bootstrap, "test.timeout.multiplier": str(TIMEOUT_MULTIPLIER),
            **(access.client_conf() if access else {})}
    path.write_text("".join(f"{key}={value}\n" for key, value in conf.items()))


def parse_summary(output: str) -> dict[str, TestOutcome]:
    """The rows of test-runner's closing SUMMARY table, by test name (<MAIN> left out)."""
    outcomes: dict[str, TestOutcome] = {}
    in_table = False
    for raw in output.splitlines():
        line = _ANSI.sub("", raw).rstrip()
        if re.match(r"^TEST \d+ \(.*\) SUMMARY$", line):
            in_table = True
            outcomes.clear()  # a timeout prints an early summary; the last table wins
            continue
        if not in_table:
            continue
        row = _SUMMARY_ROW.match(line)
        if row is None:
            continue
        name, state, duration, detail = row.groups()
        if name == "<MAIN>":
            continue
        outcomes[name] = TestOutcome(name, _STATES.get(state, FAILED), detail.strip(), float(duration))
    return outcomes


def did_nothing(output: str, name: str) -> bool:
    """True when a test printed only test-runner's boilerplate: under -Q a test whose sub-tests are all
    non-quick (SUB_TEST, not SUB_TEST_QUICK) returns at once and "passes" against any broker, or none."""
    for raw in output.splitlines():
        line = _TEST_LINE.match(_ANSI.sub("", raw).rstrip())
        if line and line.group(1) == name and not _BOILERPLATE.search(line.group(2)):
            return False
    return True


def failure_messages(output: str) -> dict[str, str]:
    """First failure per test from the `### Test "NAME" failed at FILE:LINE:FUNC() at DATE: ###` blocks.

    The summary row's reason is empty when a test times out (the table is printed before the reason is
    recorded), so these blocks are the better source.
    """
    lines = [_ANSI.sub("", line).rstrip() for line in output.splitlines()]
    messages: dict[str, str] = {}
    for index, line in enumerate(lines):
        found = _FAILURE_HEAD.search(line)
        if found is None:
            continue
        name = found.group(1).split(" (", 1)[0]
        following = lines[index + 1].strip() if index + 1 < len(lines) else ""
        if following.startswith("[") or following.startswith("%"):
            following = ""  # the process died before printing the message: the next line is other output
        messages.setdefault(name, f"failed at {found.group(2)}: {following}".rstrip(": "))
    return messages


def run_tests(
    tests_dir: Path,
    tests: list[CatalogTest],
    broker: KopBroker,
    log_dir: Path,
    *,
    idempotent: bool,
    scenario: str = "default",
    full: frozenset[str] = frozenset(),
    access: ClientAccess | None = None,
    cpus: frozenset[int] | None = None,
    consumer_protocol: bool = False,
) -> list[TestOutcome]:
    """`cpus`: the CPUs test-runner runs on (None: any); consumer_protocol: the tests' consumers use KIP-848's protocol
    (TEST_CONSUMER_GROUP_PROTOCOL=consumer)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    conf_path = log_dir / f"test-{scenario}.conf"
    write_test_conf(conf_path, broker.bootstrap, access)
    by_number: OrderedDict[str, list[CatalogTest]] = OrderedDict()
    for test in tests:
        by_number.setdefault(test.number, []).append(test)

    outcomes: list[TestOutcome] = []
    for number, wanted in by_number.items():
        if not broker.alive():
            broker.restart()
        args = runner_args(idempotent=idempotent, allow_sockem=any(test.sockem for test in wanted), scenario=scenario,
                           quick=not any(test.name in full for test in wanted))
        log_path = log_dir / f"{number}{'' if scenario == 'default' else '-' + scenario}.log"
        output, returncode, timed_out = _run_one(tests_dir, number, args, conf_path, log_path, broker.bootstrap,
                                                 access.env() if access else {}, cpus, consumer_protocol)
        died = None if broker.alive() else broker.process.returncode if broker.process else "?"
        table = parse_summary(output)
        messages = failure_messages(output)
        for test in wanted:
            outcome = table.get(test.name)
            if outcome is None:
                outcome = _missing_row(test.name, output, returncode, timed_out)
            if outcome.status == FAILED and test.name in messages and messages[test.name] not in outcome.detail:
                outcome = TestOutcome(outcome.name, FAILED, _join(messages[test.name], outcome.detail),
                                      outcome.duration)
            if outcome.status == PASSED and "-Q" in args and did_nothing(output, test.name):
                outcome = TestOutcome(outcome.name, SKIPPED, NO_OP, outcome.duration)
            if died is not None and outcome.status != PASSED:
                outcome = TestOutcome(outcome.name, FAILED, f"kop exited (code {died}) during the test; "
                                      + outcome.detail, outcome.duration)
            outcomes.append(outcome)
            print(f"  {outcome.status.upper():7} {outcome.name}"
                  + (f"  {outcome.detail[:300]}" if outcome.status != PASSED and outcome.detail else ""), flush=True)
    return outcomes


def _run_one(tests_dir: Path, number: str, args: list[str], conf_path: Path, log_path: Path,
             bootstrap: str, access_env: dict[str, str], cpus: frozenset[int] | None,
             consumer_protocol: bool = False) -> tuple[str, int, bool]:
    env = dict(os.environ)
    env.pop("CI", None)  # test-runner changes its timeouts and parallelism on CI; keep runs comparable
    env.update(
        TESTS=number,
        TEST_KAFKA_VERSION=KAFKA_VERSION,
        RDKAFKA_TEST_CONF=str(conf_path),
        # What trivup would export: test_kafka_topics() runs "$KAFKA_PATH/bin/kafka-topics.sh
        # --bootstrap-server $BROKERS" (for Kafka >= 3.0); the shim runs on this interpreter's kafka-python.
        KAFKA_PATH=str(KAFKA_PATH),
        BROKERS=bootstrap,
        KOP_COMPAT_PYTHON=sys.executable,
        LD_LIBRARY_PATH=":".join(filter(None, ["../src", "../src-cpp", env.get("LD_LIBRARY_PATH")])),
        **access_env,
    )
    env.pop("TEST_CONSUMER_GROUP_PROTOCOL", None)
    if consumer_protocol:
        env["TEST_CONSUMER_GROUP_PROTOCOL"] = "consumer"  # test.c sets group.protocol on every consumer
    # Line-buffered stdout: on a timeout test-runner SIGKILLs itself, and a block-buffered summary is lost.
    command = ["./test-runner", *args]
    if shutil.which("stdbuf"):
        command = ["stdbuf", "-oL", *command]
    with open(log_path, "w") as log:
        log.write(f"$ TESTS={number} {' '.join(command)}\n")
        log.flush()
        process = subprocess.Popen(command, cwd=tests_dir, env=env, stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, preexec_fn=pin_to(cpus))
        timed_out = False
        try:
            process.wait(timeout=PROCESS_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            timed_out = True
            process.kill()
            process.wait(timeout=30)
        except BaseException:  # interrupted: leave no test-runner behind
            process.kill()
            process.wait(timeout=30)
            raise
    for stats in tests_dir.glob(f"stats_{number}_*.json"):  # per-test client statistics dumps
        stats.unlink(missing_ok=True)
    return log_path.read_text(errors="replace"), process.returncode, timed_out


def _join(*parts: str) -> str:
    return "; ".join(part for part in parts if part)


def _missing_row(name: str, output: str, returncode: int, timed_out: bool) -> TestOutcome:
    if timed_out:
        return TestOutcome(name, FAILED, f"test-runner killed after {PROCESS_TIMEOUT_S}s")
    if "SUMMARY" not in output:
        return TestOutcome(name, FAILED, f"test-runner exited with code {returncode} before its summary")
    return TestOutcome(name, SKIPPED, "not run by test-runner (filtered by flags, scenario or broker version)")
