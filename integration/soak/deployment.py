"""What a soak runs against, behind one interface: where the clients connect, how the checker reads what is stored
(from whichever broker serves each partition), the fault kinds it can suffer, and the counts that show its faults
happened. One broker (`single`), two clusters that replicate (`geo`) and three brokers on PostgreSQL (`cluster`)
implement it."""
from __future__ import annotations

import abc
from collections.abc import Callable, Iterable

from integration.idem_raw import StoredRecord

Fault = Callable[[float], None]  # holds the fault for the given seconds, then ends it


class Deployment(abc.ABC):
    bootstrap: str  # where the clients connect (fault proxies in front of the brokers)

    @abc.abstractmethod
    def faults(self) -> dict[str, Fault]:
        """Every fault kind this deployment can suffer."""

    @abc.abstractmethod
    def create_topics(self, topics: Iterable[str], partitions: int) -> None: ...

    @abc.abstractmethod
    def end_offsets(self, topic: str, partitions: range, committed: bool = False) -> dict[int, int]:
        """Per partition the end (committed: the last stable offset), from the broker that serves it."""

    @abc.abstractmethod
    def read(self, topic: str, partitions: range) -> list[StoredRecord]:
        """Everything stored in the partitions, in offset order per partition."""

    @abc.abstractmethod
    def controls(self) -> dict[str, int]:
        """Counts that show the faults happened (responses cut, processes killed, log lines of a fault)."""

    @abc.abstractmethod
    def close(self) -> None: ...


def count_lines(paths: Iterable[str], needle: str) -> int:
    """Lines holding `needle` in the given log files (missing files count nothing)."""
    total = 0
    for path in paths:
        try:
            with open(path, encoding="utf-8", errors="replace") as log:
                total += sum(1 for line in log if needle in line)
        except OSError:
            pass
    return total
