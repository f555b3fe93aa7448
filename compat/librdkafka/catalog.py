"""Every test librdkafka's test-runner knows, read from the `tests[]` table in tests/test.c."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_BRKVER = re.compile(r"TEST_BRKVER\(\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*\)")
_SCENARIO = re.compile(r'\.scenario\s*=\s*"([^"]*)"')
_FLAG = re.compile(r"TEST_F_[A-Z0-9_]+")


@dataclass(frozen=True, slots=True)
class CatalogTest:
    name: str  # e.g. "0090_idempotence"
    flags: frozenset[str]  # e.g. {"TEST_F_LOCAL"}
    scenario: str  # "default" unless the test needs another broker configuration
    min_broker: tuple[int, int, int, int] | None

    @property
    def number(self) -> str:
        return self.name.split("_", 1)[0]

    @property
    def local(self) -> bool:
        """Runs against librdkafka's in-process mock cluster (or no cluster): proves nothing about kop."""
        return "TEST_F_LOCAL" in self.flags

    @property
    def sockem(self) -> bool:
        return "TEST_F_SOCKEM" in self.flags

    @property
    def manual(self) -> bool:
        return "TEST_F_MANUAL" in self.flags


def read_catalog(tests_dir: Path) -> list[CatalogTest]:
    source = (tests_dir / "test.c").read_text()
    start = source.index("struct test tests[] = {")
    end = source.index("{NULL}};", start)
    return [_parse_entry(args) for args in _test_macro_args(source[start:end])]


def _test_macro_args(table: str) -> list[str]:
    """The argument text of each `_TEST(...)`, with nested parentheses kept whole."""
    entries = []
    position = 0
    while (found := table.find("_TEST(", position)) != -1:
        depth, cursor = 1, found + len("_TEST(")
        while depth:
            char = table[cursor]
            depth += char == "("
            depth -= char == ")"
            cursor += 1
        entries.append(table[found + len("_TEST(") : cursor - 1])
        position = cursor
    return entries


def _parse_entry(args: str) -> CatalogTest:
    name, rest = args.split(",", 1)
    flags_text = rest.split(",", 1)[0]
    version = _BRKVER.search(rest)
    scenario = _SCENARIO.search(rest)
    return CatalogTest(
        name=name.strip(),
        flags=frozenset(_FLAG.findall(flags_text)),
        scenario=scenario.group(1) if scenario else "default",
        min_broker=tuple(int(part) for part in version.groups()) if version else None,
    )
