"""Tests of the gate's own parsing (run with `python -m pytest compat/test_compat.py`).

The test-runner outputs under testdata/ were captured from the real librdkafka 2.12 test-runner: a passing
local test, a test that timed out against a closed port, and a test that did nothing under -Q.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from compat import completeness
from compat.allowlist import read_allowlist
from compat.broker import KopBroker, api_versions_ok
from compat.kafka_python import fetch as kp_fetch
from compat.kafka_python.runner import _read_report, collect
from compat.librdkafka import build
from compat.librdkafka.catalog import _parse_entry, _test_macro_args, read_catalog
from compat.librdkafka.kafka_libs import LIBS_DIR, ensure_kafka_libs
from compat.librdkafka.runner import KAFKA_PATH, did_nothing, failure_messages, parse_summary, runner_args
from compat.run import KP_ALLOW, KP_FINDINGS, RDK_ALLOW, RDK_FINDINGS
from compat.results import FAILED, PASSED, SKIPPED, SuiteResult, TestOutcome, write_compatibility_md
from compat.system import free_port

DATA = Path(__file__).parent / "testdata"


def test_summary_of_a_passing_run() -> None:
    table = parse_summary((DATA / "rdk_0004_passed.log").read_text())
    assert list(table) == ["0004_conf"]
    assert table["0004_conf"].status == PASSED
    assert table["0004_conf"].duration == pytest.approx(0.006)


def test_timed_out_test_is_failed_with_its_reason() -> None:
    output = (DATA / "rdk_0002_timeout.log").read_text()
    table = parse_summary(output)
    assert table["0002_unkpart"].status == FAILED
    assert failure_messages(output) == {
        "0002_unkpart": "failed at test.c:1411:check_test_timeouts(): "
        "Test 0002_unkpart timed out (timeout set to 0 seconds)"
    }


def test_a_test_whose_subtests_all_skip_under_quick_mode_did_nothing() -> None:
    noop = (DATA / "rdk_0018_noop_quick.log").read_text()
    assert parse_summary(noop)["0018_cgrp_term"].status == PASSED
    assert did_nothing(noop, "0018_cgrp_term")
    worked = (DATA / "rdk_0002_timeout.log").read_text()
    assert not did_nothing(worked, "0002_unkpart")


def test_summary_rows_map_states_and_keep_the_reason() -> None:
    output = "\n".join([
        "TEST 20260101000000 (bare, scenario default) SUMMARY",
        "#==================================================================#",
        "|\x1b[32m <MAIN>                                   |     PASSED |   1.000s \x1b[0m|",
        "|\x1b[31m 0090_idempotence                         |     FAILED |   2.500s \x1b[0m|\x1b[31m "
        "0090-idempotence.c:120: dr_cb: expected no error\x1b[0m",
        "|\x1b[36m 0091_max_poll_interval_timeout           |    SKIPPED |   0.000s \x1b[0m|\x1b[36m "
        "Filtered due to negative test flags\x1b[0m",
        "#==================================================================#",
    ])
    table = parse_summary(output)
    assert table["0090_idempotence"] == TestOutcome(
        "0090_idempotence", FAILED, "0090-idempotence.c:120: dr_cb: expected no error", 2.5)
    assert table["0091_max_poll_interval_timeout"].status == SKIPPED
    assert "<MAIN>" not in table


def test_runner_args_follow_the_pass() -> None:
    assert runner_args(idempotent=False, allow_sockem=False) == ["-p1", "-Q", "-L", "-E"]
    assert runner_args(idempotent=True, allow_sockem=True) == ["-p1", "-Q", "-L", "-P"]
    assert runner_args(idempotent=False, allow_sockem=False, scenario="noautocreate", quick=False) == [
        "-p1", "-L", "-E", "-s", "noautocreate"]


def test_catalog_entry_with_nested_macros() -> None:
    table = '''_TEST(0045_subscribe_update_topic_remove,
          0,
          TEST_BRKVER(0, 9, 0, 0),
          .scenario = "noautocreate"),
    _TEST(0079_fork, TEST_F_LOCAL | TEST_F_KNOWN_ISSUE, .extra = "fork"),'''
    entries = [_parse_entry(args) for args in _test_macro_args(table)]
    assert entries[0].name == "0045_subscribe_update_topic_remove"
    assert entries[0].scenario == "noautocreate" and entries[0].min_broker == (0, 9, 0, 0)
    assert entries[1].local and "TEST_F_KNOWN_ISSUE" in entries[1].flags and entries[1].number == "0079"


@pytest.mark.skipif(not build.is_built(), reason="librdkafka not built yet (python -m compat.run builds it)")
def test_catalog_of_the_built_suite() -> None:
    catalog = read_catalog(build.tests_dir())
    names = {test.name for test in catalog}
    assert {"0001_multiobj", "0090_idempotence", "0144_idempotence_mock"} <= names
    assert next(test for test in catalog if test.name == "0144_idempotence_mock").local
    assert next(test for test in catalog if test.name == "0094_idempotence_msg_timeout").sockem


@pytest.mark.skipif(not build.is_built(), reason="librdkafka not built yet (python -m compat.run builds it)")
def test_the_built_suite_asks_one_broker_for_its_transaction_topics() -> None:
    for name in build.ONE_BROKER_SOURCES:
        source = (build.tests_dir() / name).read_text()
        assert build._REPLICATION_FACTOR_3.search(source) is None, name
        assert "_wait_exists(" in source and ", -1, 5000)" in source, name


def test_completeness_needs_each_test_allowlisted_or_a_finding_row_not_both(tmp_path: Path) -> None:
    findings = tmp_path / "FINDINGS.md"
    findings.write_text("Prose naming `0003_c` is no finding.\n\n| Test | Error |\n| --- | --- |\n"
                        "| `0002_b` | boom |\n| `0001_a` | also allowlisted |\n| `0009_gone` | renamed |\n")
    result = completeness.check(["0001_a", "0002_b", "0003_c"], {"0001_a"}, findings)
    assert result == completeness.Completeness(neither=["0003_c"], both=["0001_a"], unknown=["0009_gone"])
    assert len(result.problems(tmp_path / "tests.allow", findings)) == 3
    assert completeness.check(["0001_a", "0002_b"], {"0001_a"}, findings).problems(tmp_path, findings) == [
        "1 tests both allowlisted and in FINDINGS.md: 0001_a",
        "FINDINGS.md has rows for tests the suite does not have: 0009_gone"]


@pytest.mark.skipif(not build.is_built(), reason="librdkafka not built yet (python -m compat.run builds it)")
def test_every_librdkafka_broker_test_is_allowlisted_or_a_finding() -> None:
    catalog = read_catalog(build.tests_dir())
    suite = [test.name for test in catalog if not test.local and not test.manual]
    allowed = {entry.name for entry in read_allowlist(RDK_ALLOW)}
    assert allowed <= set(suite), "allowlisted tests that are local, manual or unknown"
    assert completeness.check(suite, allowed, RDK_FINDINGS).problems(RDK_ALLOW, RDK_FINDINGS) == []


@pytest.mark.skipif(not (kp_fetch.sdist_root() / "test" / "integration" / "conftest.py").exists(),
                    reason="kafka-python's sdist not fetched yet (python -m compat.run fetches it)")
def test_every_kafka_python_integration_test_is_allowlisted_or_a_finding() -> None:
    suite = collect(kp_fetch.ensure_sdist())  # the sdist is there: this only lays the shim over it
    allowed = {entry.name for entry in read_allowlist(KP_ALLOW)}
    assert allowed <= set(suite), "allowlisted tests kafka-python does not have"
    assert completeness.check(suite, allowed, KP_FINDINGS).problems(KP_ALLOW, KP_FINDINGS) == []


def test_allowlists_parse_and_reject_unknown_tags(tmp_path: Path) -> None:
    for allow in (Path(__file__).parent / "librdkafka" / "tests.allow",
                  Path(__file__).parent / "kafka_python" / "tests.allow"):
        read_allowlist(allow)
    bad = tmp_path / "tests.allow"
    bad.write_text("0001_multiobj  quick  # fine\n0002_unkpart fast\n")
    with pytest.raises(ValueError, match="unknown tag"):
        read_allowlist(bad)


def test_kafka_python_report_merges_phases(tmp_path: Path) -> None:
    report = tmp_path / "report.jsonl"
    rows = [
        {"nodeid": "test/integration/test_a.py::test_ok", "outcome": "passed", "reason": "", "duration": 0.5},
        {"nodeid": "test/integration/test_a.py::test_bad[gzip]", "outcome": "failed",
         "reason": "call: AssertionError: boom", "duration": 1.0},
    ]
    report.write_text("".join(json.dumps(row) + "\n" for row in rows))
    recorded = _read_report(report)
    assert recorded["test_a.py::test_ok"].status == PASSED
    assert recorded["test_a.py::test_bad[gzip]"].detail == "call: AssertionError: boom"


def test_compatibility_md_lists_counts_and_failures(tmp_path: Path) -> None:
    result = SuiteResult("librdkafka", "librdkafka test suite", "librdkafka 2.12.0", "python -m compat.run",
                         (TestOutcome("0001_multiobj", PASSED), TestOutcome("0002_unkpart", FAILED, "timed out")),
                         109)
    assert result.summary_line() == "librdkafka: 1 passed, 1 failed, 0 skipped"
    target = tmp_path / "COMPATIBILITY.md"
    write_compatibility_md(target, [result], tmp_path, "kop at commit `abc1234`")
    text = target.read_text()
    assert "Broker tested: kop at commit `abc1234`." in text
    assert "| librdkafka test suite | librdkafka 2.12.0 | 1 / 2 | 109 |" in text
    assert "`0002_unkpart`: timed out" in text


def test_api_versions_probe_fails_on_a_closed_port() -> None:
    assert api_versions_ok("127.0.0.1", free_port(), timeout=1.0) is False


def test_kafka_topics_shim_creates_alters_and_deletes_topics_on_kop(tmp_path: Path) -> None:
    """The KAFKA_PATH stand-in does what librdkafka's tests ask of Kafka's kafka-topics.sh, and fails as it does."""
    from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient

    with KopBroker(log_path=tmp_path / "broker.log", properties={"auto.create.topics.enable": "false"}) as broker:
        def topics(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run([str(KAFKA_PATH / "bin" / "kafka-topics.sh"), "--bootstrap-server", broker.bootstrap,
                                   *args], capture_output=True, text=True, timeout=60,
                                  env={"PATH": "/usr/bin:/bin", "KOP_COMPAT_PYTHON": sys.executable})

        created = topics("--create", "--topic", "t", "--replication-factor", "1", "--partitions", "1",
                         "--config", "message.timestamp.type=LogAppendTime")
        assert created.returncode == 0, created.stderr
        assert topics("--alter", "--topic", "t", "--partitions", "3").returncode == 0
        admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
        try:
            assert len(admin.describe_topics(["t"])[0]["partitions"]) == 3
            configs = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, "t")])["topic"]["t"]
            assert configs["message.timestamp.type"]["value"] == "LogAppendTime"
            assert topics("--delete", "--topic", "t").returncode == 0
            assert "t" not in admin.list_topics()
        finally:
            admin.close()
        missing = topics("--delete", "--topic", "t")
        assert missing.returncode == 1 and "Topic 't' does not exist as expected" in missing.stderr
        assert topics("--delete", "--topic", "t", "--if-exists").returncode == 0
        assert topics("--create", "--topic", "u", "--replication-factor", "3").returncode == 1  # one broker


def test_kafka_run_class_shim_runs_a_class_built_against_libs(tmp_path: Path) -> None:
    """As librdkafka's tests/java/Makefile and run-class.sh do: compile against libs/kafka-clients-*.jar, then run
    the class through $KAFKA_PATH/bin/kafka-run-class.sh with CLASSPATH set to the classes' directory."""
    missing = ensure_kafka_libs()
    if missing:
        pytest.skip(f"no Java client: {missing}")
    clients = list(LIBS_DIR.glob("kafka-clients-*.jar"))
    assert len(clients) == 1
    (tmp_path / "Version.java").write_text(
        "public class Version { public static void main(String[] args) {"
        " System.out.println(org.apache.kafka.common.utils.AppInfoParser.getVersion()); } }\n")
    subprocess.run(["javac", "-classpath", str(clients[0]), "Version.java"], cwd=tmp_path, check=True, timeout=120)
    ran = subprocess.run([str(KAFKA_PATH / "bin" / "kafka-run-class.sh"), "Version"], capture_output=True, text=True,
                         timeout=60, env={"PATH": "/usr/bin:/bin", "CLASSPATH": str(tmp_path)})
    assert ran.returncode == 0, ran.stderr
    assert clients[0].name == f"kafka-clients-{ran.stdout.strip()}.jar"


def test_ssl_pass_material_opens_in_every_encoding(tmp_path: Path) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.serialization import pkcs12

    from compat.librdkafka.tls import SslAccess
    access = SslAccess.create(free_port(), tmp_path)
    env = access.env()
    ca = x509.load_pem_x509_certificate(Path(env["SSL_all_cas_pem"]).read_bytes())
    key, cert, extra = pkcs12.load_key_and_certificates(Path(env["SSL_pkcs"]).read_bytes(),
                                                        env["SSL_password"].encode())
    assert extra == [ca]  # the tests read the CA back out of the keystore
    assert cert == x509.load_der_x509_certificate(Path(env["SSL_pub_der"]).read_bytes())
    der_key = serialization.load_der_private_key(Path(env["SSL_priv_der"]).read_bytes(), None)
    assert der_key.private_numbers() == key.private_numbers()
    assert x509.load_der_x509_certificate(Path(env["SSL_ca_der"]).read_bytes()) == ca
    assert access.client_conf()["ssl.certificate.location"] == env["SSL_pub_pem"]
    assert access.broker_properties()["ssl.client.auth"] == "required"
