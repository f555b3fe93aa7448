"""What the log cleaner (kop/compaction) and the file engine exchange: a closed ledger as the cleaner reads it, and
a complete rewrite of one for the engine to install."""
from dataclasses import dataclass

COMPACTING_SUFFIX = ".compacting"  # then a token of the job: a cleaner orphaned by a kill -9 never shares a file


@dataclass(frozen=True)
class LedgerSnapshot:
    """A closed ledger as the cleaner reads it: its files and where its entries are."""

    ledger_id: int
    log_path: str
    idx_path: str
    positions: tuple[int, ...]
    size: int
    closed_ms: int  # wall-clock time of its last append


@dataclass(frozen=True)
class RewrittenLedger:
    ledger_id: int
    log_path: str  # the complete rewrite, to be renamed over the ledger's files
    idx_path: str
    positions: tuple[int, ...]
    size: int
    size_before: int  # the ledger's size when read: installed only if it is still the same ledger
