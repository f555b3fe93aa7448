"""Per-test outcomes, the one-line summary per suite, and COMPATIBILITY.md."""
from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"


@dataclass(frozen=True, slots=True)
class TestOutcome:
    __test__ = False  # a value, not a pytest test class

    name: str
    status: str  # PASSED, FAILED or SKIPPED
    detail: str = ""  # failure or skip reason, one line
    duration: float = 0.0


@dataclass(frozen=True, slots=True)
class SuiteResult:
    label: str  # one word: it prefixes the summary line ("librdkafka: 3 passed, ...")
    suite: str  # human name for COMPATIBILITY.md
    version: str
    command: str
    outcomes: tuple[TestOutcome, ...]
    suite_size: int  # tests of the suite that need a broker (allowlisted or not)

    def count(self, status: str) -> int:
        return sum(1 for outcome in self.outcomes if outcome.status == status)

    def summary_line(self) -> str:
        return f"{self.label}: {self.count(PASSED)} passed, {self.count(FAILED)} failed, {self.count(SKIPPED)} skipped"

    def failures(self) -> list[TestOutcome]:
        return [outcome for outcome in self.outcomes if outcome.status == FAILED]


def total_line(results: list[SuiteResult]) -> str:
    passed = sum(result.count(PASSED) for result in results)
    failed = sum(result.count(FAILED) for result in results)
    skipped = sum(result.count(SKIPPED) for result in results)
    return f"compat: {passed} passed, {failed} failed, {skipped} skipped"


def write_compatibility_md(path: Path, results: list[SuiteResult], cache_dir: Path, broker: str) -> None:
    """Overwrite COMPATIBILITY.md with the latest full run; `broker` says which kop was tested."""
    today = datetime.date.today().isoformat()
    lines = [
        "# Compatibility",
        "",
        "External client test suites run against `kop standalone` by `make compat` (`python -m compat.run`).",
        "Each suite runs an allowlist; every test left out, and why, is in the suite's FINDINGS.md:",
        "[librdkafka](compat/librdkafka/FINDINGS.md), [kafka-python](compat/kafka_python/FINDINGS.md).",
        "This file is rewritten by every full run.",
        "",
        f"Broker tested: {broker}.",
        "",
        "| Suite | Version | Passed / allowlisted | Tests needing a broker | Date | Command |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for result in results:
        lines.append(
            f"| {result.suite} | {result.version} | {result.count(PASSED)} / {len(result.outcomes)} "
            f"| {result.suite_size} | {today} | `{result.command}` |"
        )
    failing = [(result, outcome) for result in results for outcome in result.failures()]
    if failing:
        lines += ["", "## Allowlisted tests that failed in this run", ""]
        lines += [f"- {result.label} `{outcome.name}`: {outcome.detail}" for result, outcome in failing]
    lines += [
        "",
        "## How it runs",
        "",
        "- `make compat` runs everything; `make compat-quick` a few-minute subset (basic produce/consume, metadata,",
        "  idempotence, transactions). `python -m compat.run --tests 0001,0090` runs chosen librdkafka tests",
        "  (allowlisted or not), `--tests all` every librdkafka test that needs a broker (`--full`: without `-Q`);",
        "  `--idempotent-only` or `--plain-only` one of the two passes; `--kop-commit HEAD` tests a commit exported",
        "  with `git archive` instead of the working tree.",
        "- Every run first checks that each test of a suite is either allowlisted or a row of its FINDINGS.md, not",
        "  both, and stops if not (`compat/test_compat.py` checks the same in `make test` once the suites are fetched).",
        "- librdkafka's suite comes from the sources bundled in the npm package node-rdkafka, built once with",
        "  `./configure --disable-curl --disable-sasl --disable-zstd --disable-lz4-ext && make libs &&",
        "  make -C tests build` (with OpenSSL: TLS and SASL PLAIN, SCRAM and OAUTHBEARER are built in;",
        "  `--disable-sasl` leaves out Cyrus SASL, i.e. GSSAPI), with Debian's rapidjson-dev installed (the",
        "  statistics tests need it), after one",
        "  change to the sources: 0098, 0103 and 0142 create topics with replication factor -1 instead of the 3 they",
        "  hard-code for trivup's three-broker cluster, which one broker (Kafka's too) refuses. Its tests run",
        "  one test number per `test-runner` process, `-p1 -Q -E -L` (allowlisted sockem tests without `-E`, tests",
        "  tagged `full` without `-Q`), then again with `-P` (idempotent producer), against a broker configured as",
        "  the test's scenario file says. Tests tagged `sasl` run once, their clients on a SASL_PLAINTEXT listener as",
        "  a SCRAM user, tests tagged `oauthbearer` once with OAUTHBEARER tokens; the SSL tests (0097) once, on an",
        "  SSL listener that requires client certificates, with the `SSL_*` variables trivup would set, kop and",
        "  test-runner on separate CPUs. The broker runs with an authorizer (ACLs: 0081's admin sub-tests, 0109,",
        "  0115, 0119) that allows what no ACL names. `KAFKA_PATH` points at",
        "  `compat/librdkafka/kafka_path/`, whose `bin/kafka-topics.sh` does through the Admin API what the tests",
        "  ask of Kafka's script (create with configs, add partitions, delete), and whose `bin/kafka-run-class.sh`",
        "  runs the suite's Java helpers (0098's transactional producer) with the integration tests' Java client",
        "  jar, linked into `libs/` under Kafka's name; no other Kafka tool is provided.",
        "- kafka-python's integration tests come from its PyPI sdist; `compat/kafka_python/shim/` supplies the",
        "  `test/service.py` and `test/conftest.py` the sdist lacks so they run against an external broker, and makes",
        "  the fixture start kop for the SASL and SSL tests, which start a broker of their own.",
        "- confluent-kafka-python's integration tests are not in its PyPI sdist (only in its GitHub repository), so",
        "  the gate cannot fetch them; its transactional scenarios, which need one broker, are ported in kop's own",
        "  words to `integration/test_transactions_confluent_suite.py`, part of `make test`.",
        f"- Build and download cache: `{_home_relative(cache_dir)}` (override with `KOP_COMPAT_CACHE`), keyed on",
        "  the package versions and the build recipe, shared by every clone on the machine so CI does not rebuild",
        "  (a cold build, fetch included, takes about 2 minutes on 2 cores). Per-test logs of the",
        "  latest run: `compat/.cache/logs/` in the clone.",
        "",
    ]
    path.write_text("\n".join(lines))


def _home_relative(path: Path) -> str:
    try:
        return "~/" + str(path.relative_to(Path.home()))
    except ValueError:
        return str(path)
