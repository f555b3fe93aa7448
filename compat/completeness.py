"""The gate's completeness rule: every test of a suite is allowlisted or explained in FINDINGS.md, not both.

A finding is a table row whose first cell is the test's name in backticks (`| `0081_admin` | ... |`); names in
prose (the list of local tests, the notes) do not count, so a note may mention an allowlisted test.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_FINDING_ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|", re.MULTILINE)


@dataclass(frozen=True, slots=True)
class Completeness:
    neither: list[str]  # in the suite, not allowlisted and no finding
    both: list[str]  # allowlisted and also a finding
    unknown: list[str]  # findings that name no test of the suite

    def problems(self, allow: Path, findings: Path) -> list[str]:
        """One line per broken rule, naming the tests (empty when the rule holds)."""
        out = []
        if self.neither:
            out.append(f"{len(self.neither)} tests neither in {allow.name} nor in {findings.name}: "
                       + ", ".join(self.neither))
        if self.both:
            out.append(f"{len(self.both)} tests both allowlisted and in {findings.name}: " + ", ".join(self.both))
        if self.unknown:
            out.append(f"{findings.name} has rows for tests the suite does not have: " + ", ".join(self.unknown))
        return out


def finding_names(findings: Path) -> list[str]:
    return _FINDING_ROW.findall(findings.read_text()) if findings.exists() else []


def check(suite: list[str], allowed: set[str], findings: Path) -> Completeness:
    """`suite`: every test that counts (for librdkafka, those that need a broker)."""
    found = finding_names(findings)
    explained = set(found)
    known = set(suite)
    return Completeness(
        neither=[name for name in suite if name not in allowed and name not in explained],
        both=[name for name in suite if name in allowed and name in explained],
        unknown=[name for name in dict.fromkeys(found) if name not in known],
    )
