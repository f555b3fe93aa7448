"""The external compatibility gate: `python -m compat.run [--quick] [--idempotent-only] [--tests LIST]`.

Runs librdkafka's regression suite (plain, then with `-P`: every producer idempotent) and kafka-python's
integration tests against a `kop standalone` this script starts on a free port with a temp data dir,
prints one `<suite>: N passed, N failed, N skipped` line per suite, and after a full run rewrites
COMPATIBILITY.md. Exits non-zero when any selected test failed.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from compat import completeness
from compat.allowlist import AllowedTest, read_allowlist
from compat.broker import HOST, KopBroker, export_commit, kop_revision
from compat.kafka_python import fetch as kp_fetch
from compat.kafka_python import runner as kp_runner
from compat.librdkafka import build as rdk_build
from compat.librdkafka import runner as rdk_runner
from compat.librdkafka.catalog import CatalogTest, read_catalog
from compat.librdkafka.kafka_libs import ensure_kafka_libs
from compat.librdkafka.tls import SSL_TESTS, SslAccess
from compat.paths import COMPAT_DIR, REPO_ROOT, build_cache_dir, run_logs_dir
from compat.results import FAILED, SuiteResult, total_line, write_compatibility_md
from compat.system import free_port, separate_cpus

RDK_ALLOW = COMPAT_DIR / "librdkafka" / "tests.allow"
RDK_FINDINGS = COMPAT_DIR / "librdkafka" / "FINDINGS.md"
KP_ALLOW = COMPAT_DIR / "kafka_python" / "tests.allow"
KP_FINDINGS = COMPAT_DIR / "kafka_python" / "FINDINGS.md"
_RDK_NUMBER = re.compile(r"^\d{4}$")
_RDK_NAME = re.compile(r"^\d{4}_\w+$")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m compat.run", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="only the tests tagged `quick` (a few minutes)")
    passes = parser.add_mutually_exclusive_group()
    passes.add_argument("--idempotent-only", action="store_true", help="only librdkafka's -P pass")
    passes.add_argument("--plain-only", action="store_true", help="only librdkafka's plain pass (no -P)")
    parser.add_argument(
        "--tests",
        help="comma list, allowlisted or not: librdkafka numbers/names (0001,0090_idempotence), kafka-python "
        "node ids (test_producer_integration.py::test_end_to_end[gzip]), or 'all' / 'all-librdkafka' / "
        "'all-kafka-python' for every test of the suite that needs a broker",
    )
    parser.add_argument("--full", action="store_true",
                        help="with --tests: run the chosen librdkafka tests without -Q, as if tagged `full`")
    parser.add_argument("--suite", choices=["all", "librdkafka", "kafka-python"], default="all")
    parser.add_argument("--kop-commit", metavar="REV",
                        help="test this commit of kop (exported with git archive), not the working tree")
    return parser.parse_args(argv)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    # SystemExit unwinds the `with KopBroker` blocks, so the broker and test processes we started stop too.
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    args = parse_args(sys.argv[1:] if argv is None else argv)
    command = " ".join(["python -m compat.run", *(sys.argv[1:] if argv is None else argv)])
    requested = [item.strip() for item in (args.tests or "").split(",") if item.strip()]
    rdk_requested = [item for item in requested if _RDK_NUMBER.match(item) or _RDK_NAME.match(item)
                     or item in ("all", "all-librdkafka")]
    kp_requested = [item for item in requested if item not in rdk_requested or item == "all"]
    kp_requested = ["all" if item in ("all", "all-kafka-python") else item for item in kp_requested]
    run_rdk = args.suite in ("all", "librdkafka") and (not requested or bool(rdk_requested))
    run_kp = (args.suite in ("all", "kafka-python") and not args.idempotent_only
              and (not requested or bool(kp_requested)))

    logs = run_logs_dir()
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir(parents=True)
    if args.kop_commit:
        commit, tree = export_commit(args.kop_commit, logs)
        os.environ.update(KOP_COMPAT_KOP_SRC=str(tree), KOP_COMPAT_KOP_COMMIT=commit)
        print(f"compat: testing kop at commit {commit} (exported to {tree})", flush=True)
    results: list[SuiteResult] = []
    started = time.monotonic()
    if run_rdk:
        results += run_librdkafka(args, rdk_requested, command, logs)
    if run_kp:
        results.append(run_kafka_python(args, kp_requested, command, logs))

    print(f"compat: finished in {time.monotonic() - started:.0f}s; logs in {logs}")
    for result in results:
        for outcome in result.failures():
            print(f"FAILED {result.label} {outcome.name}: {outcome.detail}")
    for result in results:
        print(result.summary_line())
    if len(results) > 1:
        print(total_line(results))
    full_run = not (args.quick or args.idempotent_only or args.plain_only or requested) and args.suite == "all"
    if full_run:
        write_compatibility_md(REPO_ROOT / "COMPATIBILITY.md", results, build_cache_dir(), kop_revision())
        print("compat: wrote COMPATIBILITY.md")
    return 1 if any(result.count(FAILED) for result in results) else 0


def run_librdkafka(args: argparse.Namespace, requested: list[str], command: str, logs: Path) -> list[SuiteResult]:
    tests_dir = rdk_build.ensure_built()
    java_missing = ensure_kafka_libs()
    if java_missing:
        print(f"compat: no Java client for the suite's Java helpers (0098 will fail): {java_missing}", flush=True)
    catalog = read_catalog(tests_dir)
    broker_tests = [test for test in catalog if not test.local and not test.manual]
    allow = read_allowlist(RDK_ALLOW)
    by_name = {test.name: test for test in catalog}
    unknown = [entry.name for entry in allow if entry.name not in by_name]
    if unknown:
        raise SystemExit(f"compat: {RDK_ALLOW} names tests test-runner does not have: {unknown}")
    _require_complete([t.name for t in broker_tests], {e.name for e in allow}, RDK_ALLOW, RDK_FINDINGS)

    full = frozenset(entry.name for entry in allow if "full" in entry.tags)
    if requested:
        plain = idempotent = _select_librdkafka(requested, broker_tests)
        if args.full:
            full = frozenset(test.name for test in plain)
    else:
        chosen = [entry for entry in allow if not args.quick or "quick" in entry.tags]
        plain = [by_name[entry.name] for entry in chosen]
        idempotent = [by_name[entry.name] for entry in chosen if "plain-only" not in entry.tags]

    version = f"librdkafka {rdk_build.LIBRDKAFKA_VERSION} (node-rdkafka {rdk_build.NPM_VERSION})"
    # Tests tagged `sasl` (`oauthbearer`) need their clients on a SASL listener with SCRAM (OAUTHBEARER), the SSL tests
    # an SSL listener: each group runs in a pass of its own (the SSL tests there even when they are not allowlisted,
    # to re-check them with --tests). A test may be in both SASL passes.
    members = {"sasl": {entry.name for entry in allow if "sasl" in entry.tags},
               "oauthbearer": {entry.name for entry in allow if "oauthbearer" in entry.tags}, "ssl": SSL_TESTS}
    secured = {kind: [test for test in plain if test.name in members[kind]] for kind in SECURED_PASSES}
    plain = [test for test in plain if not any(test in tests for tests in secured.values())]
    idempotent = [test for test in idempotent if not any(test in tests for tests in secured.values())]
    # Tests tagged `kip848` also run with KIP-848's consumer group protocol, in a pass of their own; `kip848-only`
    # ones only there (the suite skips them with the classic protocol).
    kip848_names = {entry.name for entry in allow if entry.tags & {"kip848", "kip848-only"}}
    classic_only = {entry.name for entry in allow if "kip848-only" in entry.tags}
    kip848 = [test for test in plain if test.name in kip848_names]
    plain = [test for test in plain if test.name not in classic_only]
    idempotent = [test for test in idempotent if test.name not in classic_only]
    passes = [] if args.idempotent_only else [("librdkafka", "librdkafka test suite", plain, False, False)]
    if not args.plain_only:
        passes.append(("librdkafka-idempotent", "librdkafka test suite, idempotent producer (-P)", idempotent, True,
                       False))
    if kip848 and not args.idempotent_only:
        passes.append(("librdkafka-kip848", "librdkafka test suite, group.protocol=consumer", kip848, False, True))
    results = []
    run = LibrdkafkaRun(tests_dir, logs, version, command, len(broker_tests), full)
    for kind, tests in secured.items():
        if tests and not args.idempotent_only:
            results.append(SECURED_PASSES[kind](run, tests))
    for label, suite, tests, idem, consumer_protocol in passes:
        print(f"compat: {label}: {len(tests)} tests (test-runner "
              f"{' '.join(rdk_runner.runner_args(idempotent=idem, allow_sockem=False))})", flush=True)
        outcomes = []
        # One broker per scenario, configured as the suite's scenario file says (noautocreate: no auto-create).
        for scenario in dict.fromkeys(rdk_runner.run_scenario(test) for test in tests):
            chosen = [test for test in tests if rdk_runner.run_scenario(test) == scenario]
            properties = rdk_runner.scenario_properties(tests_dir, scenario)
            with KopBroker(log_path=logs / f"{label}-{scenario}-broker.log", properties=properties) as broker:
                outcomes += rdk_runner.run_tests(tests_dir, chosen, broker, logs / label, idempotent=idem,
                                                 scenario=scenario, full=full, consumer_protocol=consumer_protocol)
        results.append(SuiteResult(label, suite, version, command, tuple(outcomes), len(broker_tests)))
    return results


@dataclass(frozen=True)
class LibrdkafkaRun:
    """What the passes of one librdkafka run share."""

    tests_dir: Path
    logs: Path
    version: str
    command: str
    total: int  # the suite's tests that need a broker
    full: frozenset[str]  # the tests run without -Q


def _run_secured(label: str, suite: str, access: rdk_runner.ClientAccess, run: LibrdkafkaRun,
                 tests: list[CatalogTest], data_dir: Path | None = None,
                 cpus: tuple[frozenset[int] | None, frozenset[int] | None] = (None, None)) -> SuiteResult:
    """One pass of tests whose clients reach the broker as `access` says; `cpus`: the broker's and the clients'."""
    print(f"compat: {label}: {len(tests)} tests ({suite})", flush=True)
    properties = {**rdk_runner.scenario_properties(run.tests_dir, "default"), **access.broker_properties()}
    with KopBroker(log_path=run.logs / f"{label}-broker.log", properties=properties, data_dir=data_dir,
                   cpus=cpus[0]) as broker:
        outcomes = rdk_runner.run_tests(run.tests_dir, tests, broker, run.logs / label, idempotent=False,
                                        access=access, full=run.full, cpus=cpus[1])
    return SuiteResult(label, f"librdkafka test suite, {suite}", run.version, run.command, tuple(outcomes), run.total)


def _run_sasl_pass(run: LibrdkafkaRun, tests: list[CatalogTest]) -> SuiteResult:
    access = rdk_runner.SaslAccess(free_port(HOST))
    data_dir = Path(tempfile.mkdtemp(prefix="kop-compat-data-"))
    access.create_user(data_dir)
    return _run_secured("librdkafka-sasl", "clients on a SASL_PLAINTEXT listener (SCRAM-SHA-256)", access, run,
                        tests, data_dir=data_dir)


def _run_oauthbearer_pass(run: LibrdkafkaRun, tests: list[CatalogTest]) -> SuiteResult:
    return _run_secured("librdkafka-oauthbearer", "clients on a SASL_PLAINTEXT listener (OAUTHBEARER, unsecured "
                        "JWTs)", rdk_runner.OAuthBearerAccess(free_port(HOST)), run, tests)


def _run_ssl_pass(run: LibrdkafkaRun, tests: list[CatalogTest]) -> SuiteResult:
    access = SslAccess.create(free_port(HOST), Path(tempfile.mkdtemp(prefix="kop-compat-certs-")))
    # The broker and the clients on different CPUs, as a broker on its own machine: sharing one, the broker often
    # answers a ClientHello before librdkafka's first SSL_connect returns, and librdkafka then reports a certificate
    # it rejects as _TRANSPORT instead of _SSL, which 0097_ssl_verify does not expect (FINDINGS.md, Notes)
    try:
        return _run_secured("librdkafka-ssl", "clients on an SSL listener (client certificates required)", access,
                            run, tests, cpus=separate_cpus() or (None, None))
    finally:
        shutil.rmtree(access.directory, ignore_errors=True)


SECURED_PASSES = {"sasl": _run_sasl_pass, "oauthbearer": _run_oauthbearer_pass, "ssl": _run_ssl_pass}


def _select_librdkafka(requested: list[str], broker_tests: list[CatalogTest]) -> list[CatalogTest]:
    if any(item in ("all", "all-librdkafka") for item in requested):
        return broker_tests
    chosen = [test for test in broker_tests if test.number in requested or test.name in requested]
    if not chosen:
        raise SystemExit(f"compat: no librdkafka test that needs a broker matches {requested}")
    return chosen


def run_kafka_python(args: argparse.Namespace, requested: list[str], command: str, logs: Path) -> SuiteResult:
    sdist = kp_fetch.ensure_sdist()
    collected = kp_runner.collect(sdist)
    allow = read_allowlist(KP_ALLOW)
    unknown = [entry.name for entry in allow if entry.name not in collected]
    if unknown:
        raise SystemExit(f"compat: {KP_ALLOW} names tests kafka-python does not have: {unknown}")
    _require_complete(collected, {entry.name for entry in allow}, KP_ALLOW, KP_FINDINGS)
    if "all" in requested:
        names = collected
    elif requested:
        names = [name for name in collected if name in requested or name.split("[")[0] in requested]
        if not names:
            raise SystemExit(f"compat: no kafka-python integration test matches {requested}")
    else:
        names = [entry.name for entry in allow if not args.quick or "quick" in entry.tags]
    print(f"compat: kafka-python: {len(names)} tests", flush=True)
    outcomes = []
    if names:
        with KopBroker(log_path=logs / "kafka-python-broker.log", properties=kp_runner.BROKER_PROPERTIES) as broker:
            outcomes = kp_runner.run_tests(sdist, names, broker, logs / "kafka-python")
    return SuiteResult("kafka-python", "kafka-python integration tests", f"kafka-python {kp_fetch.VERSION}",
                       command, tuple(outcomes), len(collected))


def _require_complete(suite: list[str], allowed: set[str], allow: Path, findings: Path) -> None:
    """Stop before running anything unless every test is allowlisted or explained in FINDINGS.md, not both."""
    problems = completeness.check(suite, allowed, findings).problems(allow, findings)
    if problems:
        raise SystemExit("compat: " + "\ncompat: ".join(problems))


if __name__ == "__main__":
    sys.exit(main())
