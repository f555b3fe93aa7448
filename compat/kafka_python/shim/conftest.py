"""Stand-in for kafka-python's test/conftest.py: records each test's outcome for compat.run.

Writes one JSON object per test (nodeid, outcome, reason, duration) to the file named by
$KOP_COMPAT_REPORT, so the gate need not parse pytest's terminal output. With $KOP_COMPAT_OWN_BROKERS set, the
fixture's brokers of their own are kop (kop_fixture.py).
"""
from __future__ import annotations

import json
import os

import pytest

_phases: dict[str, dict] = {}


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("KOP_COMPAT_OWN_BROKERS"):
        from test.integration.fixtures import KafkaFixture
        from test.kop_fixture import install
        install(KafkaFixture)


def _reason(report: pytest.TestReport) -> str:
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2])
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return crash.message.splitlines()[0] if crash.message else ""
    return str(report.longrepr).strip().splitlines()[-1] if report.longrepr else ""


@pytest.hookimpl(trylast=True)
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    entry = _phases.setdefault(report.nodeid, {"outcome": "passed", "reason": "", "duration": 0.0})
    entry["duration"] += report.duration
    if report.failed and entry["outcome"] != "failed":
        entry["outcome"] = "failed"
        entry["reason"] = f"{report.when}: {_reason(report)}"
    elif report.skipped and entry["outcome"] == "passed":
        entry["outcome"] = "skipped"
        entry["reason"] = _reason(report)
    if report.when == "teardown":
        path = os.environ.get("KOP_COMPAT_REPORT")
        if path:
            with open(path, "a") as handle:
                handle.write(json.dumps({"nodeid": report.nodeid, **_phases.pop(report.nodeid)}) + "\n")
