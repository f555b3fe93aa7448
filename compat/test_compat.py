"""Tests of the gate's own parsing (run with `python -m pytest compat/test_compat.py`).

The test-runner outputs under testdata/ were captured from the real librdkafka 2.12 test-runner: a passing
local test, a test that timed out against a closed port, and a test that did nothing under -Q.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from compat.allowlist import read_allowlist
from compat.broker import api_versions_ok
from compat.kafka_python.runner import _read_report
from compat.librdkafka import build
from compat.librdkafka.catalog import _parse_entry, _test_macro_args, read_catalog
from compat.librdkafka.runner import did_nothing, failure_messages, parse_summary, runner_args
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
