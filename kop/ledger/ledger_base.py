"""What every managed-ledger engine keeps the same way: the offsets and the last confirmed entry, the ledger list and
its lookups by offset and by position, rollover, listeners and cursors. An engine adds how entries are stored and
read (`_read`), opened and recovered, and retention.

A ledger in `_ledgers` has `ledger_id`, `entries` (its count), `size`, `first_indexes` (each entry's first offset)
and `find(index)` (the entry holding an offset, -1 if none).
"""
import errno
from abc import abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from kop.ledger.interface import CursorStats, Entry, LedgerInternalStats, LedgerStats, ManagedLedger, TrimResult
from kop.ledger.position import BEFORE_FIRST, Position

WEEK_MS = 7 * 24 * 3600 * 1000


@dataclass(frozen=True)
class LedgerConfig:
    max_ledger_bytes: int = 256 * 1024 * 1024
    max_ledger_age_ms: int = WEEK_MS  # from the current ledger's first entry
    max_entry_bytes: int = 64 * 1024 * 1024
    fsync: bool = True  # the file engine: acknowledge only after an fsync
    # told of each group commit: (seconds, entries made durable); the broker's metrics
    flush_observer: Callable[[float, int], None] | None = None


class LedgerBase(ManagedLedger):
    def __init__(self, name: str, config: LedgerConfig) -> None:
        self.name = name
        self.config = config
        self._ledgers: list[Any] = []
        self._current: Any = None
        self._first_append_ms = 0  # wall-clock times of the current ledger's first and latest appends
        self._last_append_ms = 0
        self._lac = BEFORE_FIRST
        self._confirmed_end = 0
        self._written_end = 0
        self._start_index = 0
        self._deleted_before = 0  # DeleteRecords: readers see nothing below it
        self._last_ledger_id = -1
        self._listeners: list[Callable[[], None]] = []
        self._failure_listeners: list[Callable[[Exception], None]] = []
        self._replay_read_failures = 0  # test hooks (admin failpoints)
        self._txn_index_write_failures = 0
        self._crash_before_cleaned_through = False
        self._cursors: Any = None  # the engine's: .cursors, .open_cursor(name, initial), async .delete_cursor(name)
        self._roll_requested = False  # request_roll: the next append or trim starts a new ledger
        self._txn_indexed: set[int] = set()  # ledgers holding a transaction index

    # ---- state

    @property
    def start_index(self) -> int:
        return self._start_index

    @property
    def confirmed_end_index(self) -> int:
        return self._confirmed_end

    @property
    def written_end_index(self) -> int:
        return self._written_end

    @property
    def last_confirmed(self) -> Position:
        return self._lac

    @property
    def cursors(self) -> dict:
        return self._cursors.cursors

    def internal_stats(self) -> LedgerInternalStats:
        """A read-only copy of the ledger list, LAC and cursor states (durable positions and their properties)."""
        return LedgerInternalStats(
            ledgers=tuple(LedgerStats(l.ledger_id, l.entries, l.size) for l in self._ledgers),
            current_ledger_id=self._current.ledger_id if self._current is not None else -1,
            last_confirmed=self._lac,
            start_index=self._start_index,
            confirmed_end_index=self._confirmed_end,
            cursors=tuple(CursorStats(c.name, Position(*c.mark_delete_position), dict(c.properties),
                                      dict(c.string_properties))
                          for c in sorted(self.cursors.values(), key=lambda c: c.name)))

    def set_rollover(self, max_bytes: int, max_age_ms: int) -> None:
        self.config = replace(self.config, max_ledger_bytes=max_bytes, max_ledger_age_ms=max_age_ms)

    def request_roll(self) -> None:
        if self._current is not None and self._current.entries:
            self._roll_requested = True

    def _roll_due(self, now_ms: int) -> bool:
        ledger = self._current
        return bool(ledger.entries) and (self._roll_requested or ledger.size >= self.config.max_ledger_bytes
                                         or now_ms - self._first_append_ms >= self.config.max_ledger_age_ms)

    # ---- transaction indexes: the engine stores them; which ledgers have one is kept here

    def txn_indexed_ledgers(self) -> list[int]:
        return sorted(self._txn_indexed)

    def inject_txn_index_write_failures(self, count: int) -> None:
        """Failpoint (admin API, tests): the next `count` writes of a transaction index fail as a disk error
        would."""
        self._txn_index_write_failures += count

    def _check_txn_index_write(self, ledger_id: int) -> None:
        """Raise ValueError unless ledger_id is a closed ledger of this managed ledger, or the injected failure."""
        if ledger_id == self._current.ledger_id or not self._holds_ledger(ledger_id):
            raise ValueError(f"{self.name}: ledger {ledger_id} is not a closed ledger")
        if self._txn_index_write_failures:
            self._txn_index_write_failures -= 1
            raise OSError(errno.EIO, "injected transaction index write failure")

    def _holds_ledger(self, ledger_id: int) -> bool:
        return any(ledger.ledger_id == ledger_id for ledger in self._ledgers)

    def _fail_writes(self, error: Exception, futures: list) -> None:
        """Tell the failure listeners first (the owner resets what it derived from the failed writes before anything
        else runs), then fail the writes' futures."""
        for listener in self._failure_listeners:
            listener(error)
        for future in futures:
            if not future.done():
                future.set_exception(error)

    def add_confirm_listener(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    def add_failure_listener(self, listener: Callable[[Exception], None]) -> None:
        self._failure_listeners.append(listener)

    # ---- cursors

    def open_cursor(self, name: str, initial: Position | None = None):
        return self._cursors.open_cursor(name, self._lac if initial is None else initial)

    async def delete_cursor(self, name: str) -> None:
        await self._cursors.delete_cursor(name)

    # ---- reading: durable entries only, up to the LAC

    @abstractmethod
    def _read(self, ledger_pos: int, entry_id: int, max_bytes: int, max_entries: int) -> list[Entry]:
        """Durable entries from entry_id of the ledger at ledger_pos on, across ledgers, within the limits (the
        first one whatever its size, KIP-74)."""

    def _locate(self, index: int) -> tuple[int, int] | None:
        """(ledger position in list, entry id) of the durable entry holding offset index."""
        if index < self._start_index or index >= self._confirmed_end:
            return None
        lo, hi = 0, len(self._ledgers) - 1
        while lo < hi:  # last ledger whose first index <= index
            mid = (lo + hi + 1) // 2
            ledger = self._ledgers[mid]
            if ledger.entries and ledger.first_indexes[0] <= index:
                lo = mid
            else:
                hi = mid - 1
        entry_id = self._ledgers[lo].find(index)
        return (lo, entry_id) if entry_id >= 0 else None

    def _last_durable_entry(self, ledger_pos: int) -> int:
        ledger = self._ledgers[ledger_pos]
        if ledger.ledger_id == self._lac.ledger_id:
            return self._lac.entry_id
        return ledger.entries - 1 if ledger.ledger_id < self._lac.ledger_id else -1

    def read_from_index(self, index: int, max_bytes: int, max_entries: int = 1 << 30) -> list[Entry]:
        found = self._locate(index)
        return [] if found is None else self._read(found[0], found[1], max_bytes, max_entries)

    def inject_append_failures(self, count: int) -> None:
        """Failpoint (admin API, tests): the next `count` appends fail part-way through their write. Only an engine
        that writes entries to files of its own has that step."""
        raise NotImplementedError("this storage engine has no file write step")

    def inject_cursor_write_failures(self, count: int) -> None:
        """Failpoint (admin API, tests): the next `count` flushes of the cursor log fail. Only an engine with a
        cursor log of its own has one to fail."""
        raise NotImplementedError("this storage engine has no cursor log")

    # ---- compaction (kop/compaction): the cleaner reads closed ledgers and the engine installs their rewrites

    cleaned_through = -1  # the last ledger compacted

    def closed_ledgers(self) -> list:
        """The closed ledgers the log cleaner may rewrite (kop.ledger.rewrites.LedgerSnapshot each), oldest first."""
        return []

    async def with_entries(self, snapshots: list) -> list:
        """The cleaner's snapshots (from closed_ledgers) ready to read: an engine whose snapshots may lack some
        entries' bytes reads them in (OSError when it cannot)."""
        return snapshots

    def install_compacted(self, rewritten: Any) -> bool:
        raise NotImplementedError("this storage engine does not compact")

    def set_cleaned_through(self, ledger_id: int) -> None:
        raise NotImplementedError("this storage engine does not compact")

    async def install_compaction(self, rewritten: list, cleaned_through: int) -> list:
        """Put a pass's rewrites (kop.ledger.rewrites.RewrittenLedger each) in place of their ledgers and record how
        far the cleaner got; the rewrites installed (not those of ledgers that changed meanwhile). This engine
        installs each rewrite, then records the point."""
        installed = [r for r in rewritten if self.install_compacted(r)]
        self.set_cleaned_through(cleaned_through)
        return installed

    def inject_crash_before_cleaned_through(self) -> None:
        """Failpoint (admin API, tests): the broker kills itself (SIGKILL) when the cleaner next records how far it
        got, after it installed that pass's rewrites: a crash between a rewrite becoming the ledger and ledgers.info
        saying so."""
        raise NotImplementedError("this storage engine does not compact")

    def inject_replay_read_failures(self, count: int) -> None:
        """Test hook: the next `count` reads of the entries after a position (the dedup replay's) fail as a disk
        read error would."""
        self._replay_read_failures += count

    def read_after(self, position: Position, max_entries: int, max_bytes: int = 1 << 62) -> list[Entry]:
        if self._replay_read_failures:
            self._replay_read_failures -= 1
            raise OSError(errno.EIO, "injected read error")
        for pos, ledger in enumerate(self._ledgers):
            if ledger.ledger_id > position.ledger_id:
                return self._read(pos, 0, max_bytes, max_entries)
            if ledger.ledger_id == position.ledger_id:
                return self._read(pos, position.entry_id + 1, max_bytes, max_entries)
        return []

    def position_of_index(self, index: int) -> Position | None:
        found = self._locate(index)
        return None if found is None else Position(self._ledgers[found[0]].ledger_id, found[1])

    def _durable_spans(self, from_index: int) -> Iterator[tuple[Any, int, int]]:
        """(ledger, first entry, last durable entry) of each ledger holding durable entries from from_index on."""
        found = self._locate(max(from_index, self._start_index))
        if found is None:
            return
        pos, entry_id = found
        for pos in range(pos, len(self._ledgers)):
            last = self._last_durable_entry(pos)
            if last >= entry_id:
                yield self._ledgers[pos], entry_id, last
            entry_id = 0

    # ---- retention

    @abstractmethod
    def _end_of(self, ledger: Any) -> int:
        """One past the last offset of a ledger's last entry."""

    @abstractmethod
    def _closed_ms(self, ledger: Any, now_ms: int) -> int | None:
        """When a closed ledger's newest record was written; None while it is open."""

    @abstractmethod
    async def _delete_oldest(self) -> None:
        """Delete the oldest ledger durably and drop it from the list."""

    async def _delete_old_ledgers(self, now_ms: int, retention_ms: int, retention_bytes: int,
                                  keep_from: Position | None) -> TrimResult:
        """Delete whole closed ledgers, oldest first, past retention or wholly below delete_before, never one
        holding entries after keep_from."""
        total = sum(l.size for l in self._ledgers)
        deleted = 0
        while len(self._ledgers) > 1:
            oldest = self._ledgers[0]
            closed_ms = self._closed_ms(oldest, now_ms)
            if oldest is self._current or closed_ms is None:
                break
            expired = retention_ms >= 0 and now_ms - closed_ms > retention_ms
            oversized = retention_bytes >= 0 and total - oldest.size >= retention_bytes
            deleted_records = self._end_of(oldest) <= self._deleted_before
            if not (expired or oversized or deleted_records):
                break
            if keep_from is not None and keep_from < Position(oldest.ledger_id, oldest.entries - 1):
                return TrimResult(deleted, held_back=True)  # a cursor that must be replayed from still needs it
            await self._delete_oldest()
            total -= oldest.size
            nxt = self._ledgers[0]
            self._start_index = max(nxt.first_indexes[0] if nxt.entries else self._written_end, self._deleted_before)
            deleted += 1
        return TrimResult(deleted, held_back=False)
