"""The managed-ledger interface: what the broker needs from a storage engine.

A managed ledger is one partition's log: a sequence of ledgers of entries addressed by Position(ledgerId, entryId).
Each entry carries a serialized MessageMetadata and a Kafka record batch whose offsets start at the entry's
`first_index` (Pulsar's broker-entry "index"); offsets are contiguous across entries. Cursors are named positions
with properties. The file engine implements it for one machine; a distributed engine implements the same methods.
"""
import asyncio
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

from kop.ledger.position import Position


@dataclass(frozen=True, slots=True)
class Entry:
    position: Position
    first_index: int
    span: int  # offsets covered: [first_index, first_index + span)
    metadata: bytes  # serialized proto.kop_pb2.MessageMetadata
    data: memoryview  # the record batch as stored


@dataclass(frozen=True, slots=True)
class LedgerStats:
    ledger_id: int
    entries: int
    size: int


@dataclass(frozen=True, slots=True)
class CursorStats:
    name: str
    mark_delete_position: Position
    properties: dict[str, int]
    string_properties: dict[str, str]


@dataclass(frozen=True, slots=True)
class LedgerInternalStats:
    """What Pulsar's `topics stats-internal` shows of a managed ledger: its ledgers, LAC and cursors."""

    ledgers: tuple[LedgerStats, ...]
    current_ledger_id: int
    last_confirmed: Position
    start_index: int
    confirmed_end_index: int
    cursors: tuple[CursorStats, ...]


@dataclass(frozen=True, slots=True)
class TrimResult:
    deleted: int  # ledgers deleted
    held_back: bool  # a ledger past retention was kept only because keep_from still needs it


class ManagedLedger(ABC):
    name: str

    @property
    @abstractmethod
    def start_index(self) -> int:
        """First Kafka offset still stored (Kafka's log start offset)."""

    @property
    @abstractmethod
    def confirmed_end_index(self) -> int:
        """One past the last durable offset: Kafka's high watermark."""

    @property
    @abstractmethod
    def written_end_index(self) -> int:
        """One past the last offset handed to add_entry, durable or not: where the next entry must start."""

    @property
    @abstractmethod
    def last_confirmed(self) -> Position:
        """Position of the last durable entry (LAC), or BEFORE_FIRST-like when none."""

    @abstractmethod
    def internal_stats(self) -> LedgerInternalStats:
        """A read-only copy of the ledger list, LAC and cursor states (admin stats, DescribeLogDirs sizes)."""

    @abstractmethod
    def add_entry(self, first_index: int, span: int, metadata: bytes, data: bytes | memoryview,
                  then: Callable[[asyncio.Future], None] | None = None) -> asyncio.Future:
        """Append one entry covering offsets [first_index, first_index + span); the future resolves to its Position
        once durable, or fails with LedgerWriteError (after which the ledger has rolled). `then(future)` is called
        once it is done, in log order: by the file engine at once, with no loop iteration between (the produce
        path's bookkeeping), by others as a done callback."""

    @abstractmethod
    def read_from_index(self, index: int, max_bytes: int, max_entries: int = 1 << 30) -> list[Entry]:
        """Durable entries starting with the one that holds `index`, up to max_bytes: the first entry is returned
        whatever its size, each later one only if it still fits (KIP-74)."""

    @abstractmethod
    def read_after(self, position: Position, max_entries: int, max_bytes: int = 1 << 62) -> list[Entry]:
        """Durable entries strictly after position, in order, up to max_entries and max_bytes (the first entry
        whatever its size)."""

    async def read_after_async(self, position: Position, max_entries: int, max_bytes: int = 1 << 62) -> list[Entry]:
        """read_after for a reader that can wait: an engine that holds only some entries' bytes in memory reads the
        missing ones back first, so the answer is empty only when no durable entry follows position (a synchronous
        read may come back short while it does). Raises OSError when they cannot be read."""
        return self.read_after(position, max_entries, max_bytes)

    def offsets_of(self, position: Position) -> tuple[int, int] | None:
        """(first_index, span) of the durable entry at position, None if there is none: an engine that keeps its
        entries' offsets in memory answers without their bytes."""
        found = self.read_after(Position(position.ledger_id, position.entry_id - 1), 1)
        if not found or found[0].position != position:
            return None
        return found[0].first_index, found[0].span

    async def read_from_index_async(self, index: int, max_bytes: int, max_entries: int = 1 << 30) -> list[Entry]:
        """read_from_index for a reader that can wait, as read_after_async is read_after's."""
        return self.read_from_index(index, max_bytes, max_entries)

    @abstractmethod
    def position_of_index(self, index: int) -> Position | None:
        """The durable entry holding offset `index`, if any."""

    @abstractmethod
    async def find_by_timestamp(self, timestamp: int, from_index: int) -> Entry | None:
        """The first durable entry, in offset order from the one holding from_index (at least start_index), whose
        record batch's maxTimestamp is >= timestamp; None if there is none. Finds it without reading older
        ledgers or decompressing any batch."""

    @abstractmethod
    async def max_timestamp(self, from_index: int) -> int:
        """The greatest batch maxTimestamp of the durable entries from the one holding from_index on, -1 if none."""

    @abstractmethod
    def set_rollover(self, max_bytes: int, max_age_ms: int) -> None:
        """Start a new ledger once the current one holds max_bytes or its first entry is max_age_ms old (a topic's
        segment.bytes and segment.ms); takes effect from the next append or trim."""

    @abstractmethod
    def request_roll(self) -> None:
        """Start a new ledger at the next append or trim, if the current one holds entries by then (the transaction
        index asks once the current ledger holds many aborted transactions: it keeps them in memory until it
        closes)."""

    # ---- the aborted-transaction index of each closed ledger (Kafka's .txnindex of a segment)

    @abstractmethod
    def txn_indexed_ledgers(self) -> list[int]:
        """The ids of the ledgers that hold a transaction index, ascending."""

    @abstractmethod
    async def write_txn_index(self, ledger_id: int, data: bytes) -> None:
        """Store data, durably, as the transaction index of the closed ledger ledger_id (bytes the engine does not
        read); it is deleted with the ledger. Raises ValueError for a ledger that is not closed or not there,
        ManagedLedgerError or OSError when the write fails."""

    @abstractmethod
    async def read_txn_index(self, ledger_id: int) -> bytes | None:
        """The transaction index stored for the ledger, None if it has none. Raises ManagedLedgerError or OSError
        when it cannot be read."""

    @property
    @abstractmethod
    def cursors(self) -> dict:
        """The open cursors by name (dedup, consumer groups, replicators); read-only for callers."""

    @abstractmethod
    def open_cursor(self, name: str, initial: Position | None = None):
        """The cursor `name`, created at `initial` (default: the last confirmed entry) if it does not exist, or
        before the first entry if its records may have been lost to damage (never later than what it had). A cursor
        has `mark_delete_position`, `properties`, `is_durable` (a record of it is stored: a new one is not until its
        first mark-delete or reset completes) and the async `mark_delete` and `reset`."""

    @abstractmethod
    async def delete_cursor(self, name: str) -> None: ...

    @abstractmethod
    def add_confirm_listener(self, listener: Callable[[], None]) -> None:
        """Called after new entries become durable."""

    @abstractmethod
    def add_failure_listener(self, listener: Callable[[Exception], None]) -> None:
        """Called synchronously when a write fails, before the failed entries' futures are failed, so the owner
        can reset state derived from them before anything else runs."""

    @abstractmethod
    async def delete_before(self, index: int) -> int:
        """Kafka's DeleteRecords: offsets below `index` (at most the durable end) are gone for readers from now
        on, durably; `start_index` moves there. Whole ledgers below it are deleted by the next trim.
        Returns the new start_index."""

    @abstractmethod
    async def trim(self, now_ms: int, retention_ms: int, retention_bytes: int,
                   keep_from: Position | None) -> TrimResult:
        """Delete whole closed ledgers past retention or wholly below delete_before, never one holding entries
        after keep_from. The current ledger is closed first when its roll is due or all of it is past retention_ms,
        so retention reaches a quiet topic's last records."""

    @abstractmethod
    async def close(self) -> None: ...

    @abstractmethod
    async def delete(self) -> None: ...
