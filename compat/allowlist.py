"""Allowlist files: one test per line, optional tags after it, `#` starts a comment.

    0090_idempotence        quick
    0003_msgmaxsize         plain-only   # why it is plain-only

Tags: `quick` (part of `--quick`), `plain-only` (left out of the idempotent `-P` pass), `full` (librdkafka:
run without test-runner's -Q, which would skip all of the test's sub-tests), `sasl` (librdkafka: only in the pass
whose clients authenticate on a SASL listener with SCRAM), `oauthbearer` (librdkafka: in the pass whose clients
authenticate with OAUTHBEARER tokens; a test may have both).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

KNOWN_TAGS = frozenset({"quick", "plain-only", "full", "sasl", "oauthbearer", "kip848", "kip848-only"})


@dataclass(frozen=True, slots=True)
class AllowedTest:
    name: str
    tags: frozenset[str]


def read_allowlist(path: Path) -> list[AllowedTest]:
    entries: list[AllowedTest] = []
    seen: set[str] = set()
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, *tags = line.split()
        unknown = set(tags) - KNOWN_TAGS
        if unknown:
            raise ValueError(f"{path}:{number}: unknown tag(s) {sorted(unknown)}")
        if name in seen:
            raise ValueError(f"{path}:{number}: {name} listed twice")
        seen.add(name)
        entries.append(AllowedTest(name, frozenset(tags)))
    return entries
