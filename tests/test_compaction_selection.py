"""Which closed ledgers the cleaner takes, on a given clock: min.compaction.lag.ms keeps the young ones (and every
one after them) out of the cleanable range, min.cleanable.dirty.ratio decides when a pass is due, and
max.compaction.lag.ms forces one below that ratio."""
from kop.compaction.selection import select
from kop.compaction.settings import CompactionSettings
from kop.ledger.rewrites import LedgerSnapshot

NOW = 1_000_000


def ledger(ledger_id: int, closed_ago_ms: int, size: int = 100) -> LedgerSnapshot:
    return LedgerSnapshot(ledger_id, f"{ledger_id}.log", f"{ledger_id}.idx", (0,), size, NOW - closed_ago_ms)


def settings(min_lag_ms: int = 0, max_lag_ms: int = 2**63 - 1, ratio: float = 0.5) -> CompactionSettings:
    return CompactionSettings(delete_retention_ms=0, min_lag_ms=min_lag_ms, max_lag_ms=max_lag_ms,
                              min_dirty_ratio=ratio)


def ids(selection) -> list[int]:
    return [s.ledger_id for s in selection.cleanable]


def test_ledgers_younger_than_min_compaction_lag_are_not_cleanable():
    closed = [ledger(0, 9000), ledger(1, 6000), ledger(2, 4000), ledger(3, 1000)]
    chosen = select(closed, -1, settings(min_lag_ms=5000), NOW)
    assert ids(chosen) == [0, 1] and chosen.due  # 2 and 3 are too young: their records neither go nor supersede
    assert ids(select(closed, -1, settings(min_lag_ms=4000), NOW)) == [0, 1, 2]  # exactly the lag: cleanable
    assert ids(select(closed, -1, settings(min_lag_ms=4001), NOW)) == [0, 1]
    nothing = select(closed, -1, settings(min_lag_ms=10_000), NOW)
    assert (ids(nothing), nothing.due, nothing.dirty_ratio, nothing.lag_ms) == ([], False, 0.0, 0)


def test_a_pass_is_due_once_dirty_bytes_reach_the_ratio_of_the_cleanable_bytes():
    closed = [ledger(0, 9000, size=300), ledger(1, 8000, size=100)]
    below = select(closed, 0, settings(ratio=0.5), NOW)  # 100 dirty of 400
    assert (below.dirty_ratio, below.due, below.lag_ms) == (0.25, False, 8000)
    assert select(closed, 0, settings(ratio=0.25), NOW).due
    assert not select(closed, 1, settings(ratio=0.0), NOW).due  # nothing dirty: never due


def test_max_compaction_lag_forces_a_pass_below_the_ratio():
    closed = [ledger(0, 9000, size=300), ledger(1, 8000, size=100)]
    assert not select(closed, 0, settings(max_lag_ms=8001), NOW).due
    forced = select(closed, 0, settings(max_lag_ms=8000), NOW)
    assert (forced.due, forced.dirty_ratio, ids(forced)) == (True, 0.25, [0, 1])
    # a dirty ledger still within min.compaction.lag.ms is not cleanable, so max.compaction.lag.ms cannot force it
    assert not select(closed, 0, settings(min_lag_ms=8500, max_lag_ms=1), NOW).due
