"""Which of a partition's closed ledgers the cleaner may compact now, and whether it should: Kafka's
LogCleanerManager rules, on ledger close times (no I/O, so every boundary is testable on a given clock)."""
from collections.abc import Sequence
from dataclasses import dataclass

from kop.compaction.settings import CompactionSettings
from kop.ledger.rewrites import LedgerSnapshot


@dataclass(frozen=True)
class Selection:
    cleanable: tuple[LedgerSnapshot, ...]  # oldest first: the range a pass reads and may rewrite
    dirty_ratio: float  # dirty bytes / cleanable bytes
    lag_ms: int  # how long the oldest dirty ledger has waited (0: none waits)
    due: bool  # clean now: the dirty ratio reached min.cleanable.dirty.ratio, or the oldest dirty ledger is overdue


def select(closed: Sequence[LedgerSnapshot], cleaned_through: int, settings: CompactionSettings,
           now_ms: int) -> Selection:
    """The cleanable range is the closed ledgers, oldest first, up to the first one that closed less than
    min.compaction.lag.ms ago: its records, and every later one's, are too young to be compacted away or to
    supersede older versions. The ledgers after `cleaned_through` are dirty. max.compaction.lag.ms makes a pass due
    whatever the dirty ratio once the oldest dirty ledger closed that long ago (never for one still within
    min.compaction.lag.ms, which is not cleanable yet)."""
    cleanable = []
    for snapshot in closed:
        if now_ms - snapshot.closed_ms < settings.min_lag_ms:
            break
        cleanable.append(snapshot)
    dirty = [s for s in cleanable if s.ledger_id > cleaned_through]
    total = sum(s.size for s in cleanable)
    ratio = sum(s.size for s in dirty) / total if total else 0.0
    lag_ms = now_ms - dirty[0].closed_ms if dirty else 0
    overdue = bool(dirty) and lag_ms >= settings.max_lag_ms
    due = bool(dirty) and (ratio >= settings.min_dirty_ratio or overdue)
    return Selection(tuple(cleanable), ratio, lag_ms, due)
