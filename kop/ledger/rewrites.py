"""What the log cleaner (kop/compaction) and a storage engine exchange: a closed ledger as the cleaner reads it, and
a complete rewrite of one for the engine to install.

The file engine's ledgers are files: the cleaner (in its own process) reads them by path and writes each rewrite as
new files beside them. The PostgreSQL engine keeps its entries in memory (those its entry cache dropped are read back
by `with_entries` before the pass): the cleaner (in a thread) reads those entries and hands back the bytes of each
entry it changed, which the engine stores in one transaction. Either
way every entry keeps its position (ledger id, entry id) and its offsets; only its batch shrinks.
"""
from collections.abc import Sequence
from dataclasses import dataclass

COMPACTING_SUFFIX = ".compacting"  # then a token of the job: a cleaner orphaned by a kill -9 never shares a file


@dataclass(frozen=True)
class LedgerSnapshot:
    """A closed ledger as the cleaner reads it: its files and where its entries are (the file engine), or its entries
    themselves (`entries`, kop.ledger.ledger_file.RawEntry each, by entry id: an engine that holds them in memory)."""

    ledger_id: int
    log_path: str
    idx_path: str
    positions: tuple[int, ...]
    size: int
    closed_ms: int  # wall-clock time of its last append
    entries: Sequence | None = None  # never changed once snapshotted (a list of its own); None items: not cached

    @classmethod
    def in_memory(cls, ledger_id: int, entries: Sequence, size: int, closed_ms: int) -> "LedgerSnapshot":
        return cls(ledger_id, "", "", (), size, closed_ms, entries)


@dataclass(frozen=True)
class RewrittenLedger:
    ledger_id: int
    log_path: str  # the file engine: the complete rewrite, to be renamed over the ledger's files
    idx_path: str
    positions: tuple[int, ...]
    size: int
    size_before: int  # the ledger's size when read: installed only if it is still the same ledger
    entries: tuple[tuple[int, bytes], ...] = ()  # in memory: (entry id, framed entry) of each entry that changed

    @property
    def in_memory(self) -> bool:
        return not self.log_path
