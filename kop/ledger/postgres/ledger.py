"""The PostgreSQL managed-ledger engine: stateless brokers, the log in the database.

Every entry is a kop_entry row holding the file engine's framed entry bytes, keyed by its position (ledger id,
entry id), with its first offset (a PIP-33 marker covers no offset, so offsets do not tell entries apart). Appends
are group-committed: the entries submitted while one commit is in flight go together in the next single statement,
which also checks the owner's fencing epoch; an entry's future resolves only after that statement committed.

A failed commit's outcome is unknown (the connection may have dropped after the commit): the failed entries and every
later one are failed to their writers, and before anything more is accepted every row after the last confirmed entry
is deleted in a fenced transaction, so what was reported failed is really not stored; then a new ledger starts, as the
file engine rolls after a failed write. Ledgers roll on every open, on size and age, and after a failed write;
retention deletes whole closed ledgers. Log compaction replaces closed ledgers' entries in place (the same positions,
smaller batches), with the cleaned-through point, in one fenced transaction.

Memory: the index in full, the bytes through an entry cache (Pulsar's managed-ledger entry cache in front of
BookKeeper). For every entry of the partitions it owns the broker keeps its index metadata: first offset, span, batch
size, batch max timestamp and MessageMetadata (some 100-150 bytes an entry, whatever its batch's size), so offset and
time lookups, retention and stats never wait for the database. The entries' bytes are held in the broker's one
EntryCache (entry_cache.py, on the PgStore), least recently used dropped first once past its bound; an entry just
written enters it as the most recently used, so tailing reads (by far the common case) are served from memory.
- Bounded (`managed.ledger.cache.bytes`, 256 MiB by default): a takeover reads each entry's head only (the frame and
  entry header, the MessageMetadata and the batch header's first bytes: a substring of the uncompressed EXTERNAL
  column, which PostgreSQL reads without the rest) and the whole last entries of the last stored ledger, up to
  TAKEOVER_TAIL_BYTES or the bound (the tail). Memory is the bound plus the index (plus, for a moment, what a
  fill or a cleaner's pass has read).
- Unbounded (`managed.ledger.cache.bytes=-1`, PgStore(entry_cache_bytes=None)): every entry's bytes are held, as
  before the cache; a takeover reads every entry whole, and no read ever misses.
What a reader sees on a miss (the interface's reads stay synchronous):
- read_from_index / read_after return the entries up to the first one whose bytes are not held (none if it is the
  first) and start reading it and those after it back (at least FILL_MIN_BYTES: read-ahead) in the background. When
  they are in, the confirm listeners run, so a Fetch whose answer came back short and that long-polls is woken and
  reads again; a Fetch with max_wait 0 answers short and the client fetches again (Kafka clients do, for any short
  answer). A fill that fails (the database is unreachable) is logged; the next read starts another.
- read_after_async / read_from_index_async (the interface's async variants; the file engine's are its synchronous
  reads) wait for the fill instead: empty only when no durable entry follows, OSError when the bytes cannot be read.
  The readers that loop until an empty read use them: the dedup replay, the transaction index rebuild, the
  replicator and the replication rebuilds. find_by_timestamp (async) reads its entry back the same way.
- The log cleaner's snapshots (closed_ledgers) hold None for the entries not cached; with_entries reads those from
  the database for that pass only, not through the cache, so a pass does not push the tail out.
Bytes read back are checked against the frame's CRC and against the index (offsets, span, size, metadata): damaged
bytes are never served, and a fill that raced a truncation, compaction or deletion of its ledger is dropped.
"""
import asyncio
import errno
import logging
import os
import signal
import time
from array import array
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from kop import clock
from kop.ledger.errors import LedgerClosedError, LedgerFencedError, LedgerWriteError
from kop.ledger.framed_file import HEADER_SIZE, unframe
from kop.ledger.interface import Entry, TrimResult
from kop.ledger.ledger_base import LedgerBase, LedgerConfig
from kop.ledger.ledger_file import ENTRY_HEADER, RawEntry, decode_entry, encode_entry
from kop.ledger.position import Position
from kop.ledger.postgres.batcher import Batcher
from kop.ledger.postgres.cursors import PgCursors
from kop.ledger.postgres.entry_cache import EntryCache
from kop.ledger.postgres.store import FRAMED_ENTRY_HEADER, LedgerFencedOut, PgStore, StoredEntry
from kop.ledger.rewrites import LedgerSnapshot, RewrittenLedger
from kop.ledger.time_index import NO_TIMESTAMP, TimeIndex, batch_max_timestamp

log = logging.getLogger(__name__)

RETRY_SECONDS = 0.5  # between attempts to clean up after a failed write while the database is unreachable
FILL_MIN_BYTES = 1 << 20  # a read the cache misses reads back at least this much of the ledger (read-ahead)
FILL_MAX_ENTRIES = 10_000  # and at most this many entries in one statement
TAKEOVER_TAIL_BYTES = 1 << 20  # a bounded cache: the bytes of a partition's last entries read at its takeover
# (or the bound, if smaller)
FILL_ATTEMPTS = 3  # an awaited read whose bytes are evicted again before it runs, or whose fill failed, tries again


@dataclass(slots=True, eq=False)  # eq=False: hashed by identity, a key of the entry cache
class _Ledger:
    """One ledger's durable (or in-flight) entries: every entry's index metadata, and the bytes of those the entry
    cache holds (None: read from the database when wanted)."""

    ledger_id: int
    cache: EntryCache
    first_indexes: array = field(default_factory=lambda: array("q"))
    spans: array = field(default_factory=lambda: array("q"))
    sizes: array = field(default_factory=lambda: array("q"))  # each entry's batch bytes
    metadata: list[bytes] = field(default_factory=list)  # each entry's MessageMetadata
    data: list[memoryview | None] = field(default_factory=list)
    times: TimeIndex = field(default_factory=TimeIndex)
    size: int = 0
    closed_ms: int | None = None
    generation: int = 0  # raised when entries change (truncated, compacted): a fill read before is dropped

    @property
    def entries(self) -> int:
        return len(self.first_indexes)

    def append(self, raw: RawEntry) -> None:
        self._index(raw.first_index, raw.span, raw.metadata, len(raw.data), batch_max_timestamp(raw.data))
        self.data.append(raw.data)
        self.cache.add(self, raw.entry_id, len(raw.data))

    def append_head(self, head: bytes, length: int) -> None:
        """Index an entry from its stored head (StoredHead), its bytes not held."""
        first_index, span, meta_len = ENTRY_HEADER.unpack_from(head, HEADER_SIZE)
        meta_end = FRAMED_ENTRY_HEADER + meta_len
        if len(head) < meta_end or length < meta_end:
            raise ValueError(f"ledger {self.ledger_id}: stored entry {self.entries} is too short for its header")
        self._index(first_index, span, bytes(head[FRAMED_ENTRY_HEADER:meta_end]), length - meta_end,
                    batch_max_timestamp(memoryview(head)[meta_end:]))
        self.data.append(None)

    def _index(self, first_index: int, span: int, metadata: bytes, size: int, timestamp: int) -> None:
        self.first_indexes.append(first_index)
        self.spans.append(span)
        self.sizes.append(size)
        self.metadata.append(metadata)
        self.times.append(timestamp)
        self.size += size

    def entry(self, entry_id: int) -> Entry | None:
        """The entry with its bytes (now the cache's most recently used), None if the cache does not hold them."""
        data = self.data[entry_id]
        if data is None:
            return None
        self.cache.touch(self, entry_id)
        return Entry(Position(self.ledger_id, entry_id), self.first_indexes[entry_id], self.spans[entry_id],
                     self.metadata[entry_id], data)

    def fill(self, raw: RawEntry) -> bool:
        """Hold the bytes read back for an indexed entry; False if they are not that entry's (it changed)."""
        i = raw.entry_id
        if i >= self.entries or (self.first_indexes[i], self.spans[i], self.sizes[i], self.metadata[i]) != \
                (raw.first_index, raw.span, len(raw.data), raw.metadata):
            return False
        if self.data[i] is None:
            self.data[i] = raw.data
            self.cache.add(self, i, len(raw.data))
        return True

    def replace(self, raw: RawEntry) -> None:
        """A compacted entry in place of the one at its position (same offsets and time, a smaller batch); its bytes
        held only if the old ones were (a pass over old ledgers does not push the tail out of the cache)."""
        i = raw.entry_id
        held = self.data[i] is not None
        if held:
            self.cache.discard(self, i, self.sizes[i])
        self.size += len(raw.data) - self.sizes[i]
        self.sizes[i] = len(raw.data)
        self.metadata[i] = raw.metadata
        self.data[i] = raw.data if held else None
        if held:
            self.cache.add(self, i, len(raw.data))
        self.generation += 1

    def drop_bytes(self, entry_id: int) -> None:
        """The entry cache evicted the entry's bytes."""
        self.data[entry_id] = None

    def truncate(self, count: int) -> None:
        for entry_id in range(count, self.entries):
            if self.data[entry_id] is not None:
                self.cache.discard(self, entry_id, self.sizes[entry_id])
        self.size -= sum(self.sizes[count:])
        del self.first_indexes[count:], self.spans[count:], self.sizes[count:], self.metadata[count:]
        del self.data[count:]
        self.times.truncate(count)
        self.generation += 1

    def release(self) -> None:
        """Give the cache back every byte held (the ledger is deleted, or its managed ledger closed)."""
        for entry_id, data in enumerate(self.data):
            if data is not None:
                self.cache.discard(self, entry_id, self.sizes[entry_id])
                self.data[entry_id] = None
        self.generation += 1

    def find(self, index: int) -> int:
        """The entry holding offset index, -1 if none (past the end included)."""
        i = bisect_right(self.first_indexes, index) - 1
        if i < 0:
            return -1
        return i if index < self.first_indexes[i] + self.spans[i] else -1

    def end(self) -> int:
        """One past the last offset of the last entry."""
        return self.first_indexes[-1] + self.spans[-1]


class _SnapshotEntries(Sequence):
    """A closed ledger's entries as the cleaner reads them (RawEntry each, None where the cache does not hold the
    bytes), as they were when taken: copies of its lists (pointer copies, not an object per entry, for every check
    of the cleaner), unchanged by later evictions, compactions or deletions."""

    __slots__ = ("_first_indexes", "_spans", "_metadata", "_data")

    def __init__(self, ledger: _Ledger) -> None:
        self._first_indexes, self._spans = ledger.first_indexes[:], ledger.spans[:]
        self._metadata, self._data = ledger.metadata[:], ledger.data[:]

    def __len__(self) -> int:
        return len(self._data)

    def __getitem__(self, entry_id):
        if isinstance(entry_id, slice):
            return [self[i] for i in range(*entry_id.indices(len(self)))]
        data = self._data[entry_id]
        if data is None:
            return None
        entry_id %= len(self._data)  # a negative index names the entry counted from the end
        return RawEntry(entry_id, self._first_indexes[entry_id], self._spans[entry_id], self._metadata[entry_id],
                        data)


@dataclass(slots=True)
class _PendingAdd:
    future: asyncio.Future
    ledger: _Ledger
    raw: RawEntry
    payload: bytes


class PgManagedLedger(LedgerBase):
    def __init__(self, name: str, store: PgStore, config: LedgerConfig) -> None:
        super().__init__(name, config)
        self._store = store
        self._epoch = 0
        self._appends = Batcher(self._commit)
        self._cursors = PgCursors(lambda: self._lac, self._write_cursors)
        self._recovering: asyncio.Task | None = None  # cleaning up after a failed write: appends are refused
        self._fenced: LedgerFencedOut | None = None  # another broker took the ledger: nothing more is written
        self._closed = False
        self._injected_failures = 0  # failpoints (admin API)
        self._released = asyncio.Event()
        self._released.set()
        self._cache = store.entry_cache
        self._fills: dict[tuple[int, int], asyncio.Task] = {}  # (ledger id, first entry) -> reading them back
        self._damaged: set[tuple[int, int]] = set()  # (ledger id, entry id) read back failing their CRC
        self._miss: asyncio.Task | None = None  # the fill the last read started or joined, if it missed

    # ---- opening

    @classmethod
    async def open(cls, name: str, store: PgStore, config: LedgerConfig,
                   initial_index: int = 0) -> "PgManagedLedger":
        """Take ownership of the managed ledger (fencing out any earlier owner) and load it."""
        ml = cls(name, store, config)
        tail_bytes = None if ml._cache.max_bytes is None else min(TAKEOVER_TAIL_BYTES, ml._cache.max_bytes)
        loaded = await store.take_ownership(name, initial_index, tail_bytes)
        row = loaded.row
        ml._epoch, ml._last_ledger_id, ml._deleted_before = row.epoch, row.last_ledger_id, row.deleted_before
        ml.cleaned_through = row.cleaned_through
        by_id: dict[int, _Ledger] = {}

        def ledger_of(ledger_id: int) -> _Ledger:
            ledger = by_id.get(ledger_id)
            if ledger is None:
                ledger = by_id[ledger_id] = _Ledger(ledger_id, ml._cache)
                ml._ledgers.append(ledger)
            return ledger

        if loaded.heads is None:  # every entry whole
            for stored in loaded.entries:
                ledger_of(stored.ledger_id).append(_decode_stored(name, stored))
        else:  # the index, and the tail's bytes
            for head in loaded.heads:
                ledger_of(head.ledger_id).append_head(head.head, head.length)
            for stored in loaded.entries:
                if not by_id[stored.ledger_id].fill(_decode_stored(name, stored)):
                    raise ValueError(f"{name}: stored entry {stored.ledger_id}:{stored.entry_id} does not match "
                                     "its head")
        now = clock.now_ms()
        for ledger in ml._ledgers:
            ledger.closed_ms = loaded.closed_ms.get(ledger.ledger_id, now)
        end = row.end_floor
        if ml._ledgers:
            last = ml._ledgers[-1]
            ml._lac = Position(last.ledger_id, last.entries - 1)
            end = max(end, last.end())
            ml._start_index = ml._ledgers[0].first_indexes[0]
        elif ml._last_ledger_id >= 0:
            ml._lac = Position(ml._last_ledger_id, -1)
        ml._confirmed_end = ml._written_end = max(end, ml._deleted_before)
        if not ml._ledgers:
            ml._start_index = ml._confirmed_end
        ml._start_index = max(ml._start_index, ml._deleted_before)
        ml._cursors.load(loaded.cursors)
        ml._txn_indexed = {ledger_id for ledger_id in loaded.txn_indexed if ml._holds_ledger(ledger_id)}
        ml._start_new_ledger()
        return ml

    def _start_new_ledger(self) -> None:
        """Start the next ledger in memory; it is stored with its first entry (a ledger without entries is never
        stored). Ledger ids never go back: positions in cursors stay behind every new entry."""
        previous = self._current
        if previous is not None:
            if previous.entries:
                previous.closed_ms = self._last_append_ms or clock.now_ms()
            else:
                self._ledgers.remove(previous)
        self._last_ledger_id += 1
        self._current = _Ledger(self._last_ledger_id, self._cache)
        self._ledgers.append(self._current)
        self._first_append_ms = self._last_append_ms = 0
        self._roll_requested = False

    @property
    def epoch(self) -> int:
        """This owner's fencing epoch."""
        return self._epoch

    # ---- writing

    def add_entry(self, first_index: int, span: int, metadata: bytes, data: bytes | memoryview,
                  then: Callable[[asyncio.Future], None] | None = None) -> asyncio.Future:
        if self._closed:
            raise LedgerClosedError(self.name)
        if self._fenced is not None:
            raise LedgerClosedError(str(self._fenced))
        if self._recovering is not None:
            raise LedgerFencedError(f"{self.name}: recovering from a failed write; retry shortly")
        if first_index != self._written_end:
            raise ValueError(f"{self.name}: entry starts at {first_index}, expected {self._written_end}")
        if len(data) > self.config.max_entry_bytes:
            raise LedgerWriteError(f"{self.name}: entry of {len(data)} bytes exceeds {self.config.max_entry_bytes}")
        now_ms = clock.now_ms()
        if self._roll_due(now_ms):
            self._start_new_ledger()
        ledger = self._current
        payload = encode_entry(first_index, span, metadata, data)
        raw = decode_entry(ledger.entries, unframe(payload))
        ledger.append(raw)  # readers see only entries up to the LAC
        self._written_end = first_index + span
        self._first_append_ms = self._first_append_ms or now_ms
        self._last_append_ms = now_ms
        future = asyncio.get_running_loop().create_future()
        self._appends.add(_PendingAdd(future, ledger, raw, payload))
        if then is not None:
            future.add_done_callback(then)
        return future

    async def _commit(self, adds: list[_PendingAdd]) -> None:
        end = adds[-1].raw.first_index + adds[-1].raw.span
        rows = [(a.raw.first_index, a.ledger.ledger_id, a.raw.entry_id, a.payload) for a in adds]
        try:
            await self._released.wait()
            if self._injected_failures > 0:
                self._injected_failures -= 1
                raise OSError(errno.EIO, "injected write failure")
            started = time.perf_counter()
            await self._store.append(self.name, self._epoch, self._last_append_ms or clock.now_ms(), end, rows)
            if self.config.flush_observer is not None:  # the broker's group-commit metrics
                self.config.flush_observer(time.perf_counter() - started, len(adds))
        except Exception as exc:  # noqa: BLE001 - whatever went wrong, the outcome is unknown: clean up
            self._on_write_failed(exc, adds + self._appends.take_pending())
            return
        for add in adds:
            self._lac = Position(add.ledger.ledger_id, add.raw.entry_id)
        self._confirmed_end = end
        for add in adds:
            if not add.future.done():
                add.future.set_result(Position(add.ledger.ledger_id, add.raw.entry_id))
        for listener in self._listeners:
            listener()
        await asyncio.sleep(0)  # completions run before a later failure is reported

    def _on_write_failed(self, exc: Exception, adds: list[_PendingAdd]) -> None:
        log.error("%s: write failed (%s); failing %d pending entries", self.name, exc, len(adds))
        first = adds[0]
        first.ledger.truncate(first.raw.entry_id)
        for ledger in {id(a.ledger): a.ledger for a in adds[1:] if a.ledger is not first.ledger}.values():
            ledger.truncate(0)
            if ledger is not self._current:
                self._ledgers.remove(ledger)
        self._written_end = self._confirmed_end
        if isinstance(exc, LedgerFencedOut):
            self._fenced = exc
        elif not self._closed:
            self._recovering = asyncio.get_running_loop().create_task(self._drop_failed_tail())
        self._fail_writes(LedgerWriteError(f"{self.name}: {exc}"), [add.future for add in adds])

    async def _drop_failed_tail(self) -> None:
        """Make sure the failed entries are not stored (their commit may have happened after all), then start a new
        ledger; until then appends are refused. Retried while the database is unreachable."""
        self._start_new_ledger()
        try:
            while not self._closed:
                try:
                    await self._store.drop_tail(self.name, self._epoch, self._lac, self._confirmed_end,
                                               self._last_ledger_id)
                    log.info("%s: failed entries removed; writes resume in ledger %d", self.name,
                             self._current.ledger_id)
                    return
                except LedgerFencedOut as exc:
                    self._fenced = exc
                    return
                except Exception as exc:  # noqa: BLE001 - the database is unreachable: try again
                    log.warning("%s: cannot clean up after the failed write yet (%s)", self.name, exc)
                    await asyncio.sleep(RETRY_SECONDS)
        finally:
            self._recovering = None

    async def _write_cursors(self, rows: list[tuple[str, bytes | None]]) -> None:
        await self._store.write_cursors(self.name, self._epoch, rows)

    def inject_write_failures(self, count: int) -> None:
        """Failpoint (admin API, tests): the next `count` commits fail as a lost connection would."""
        self._injected_failures += count

    def hold_flushes(self, hold: bool) -> None:
        """Failpoint: while held, commits wait before reaching the database, as on a stalled server."""
        if hold:
            self._released.clear()
        else:
            self._released.set()

    # ---- reading: durable entries only, up to the LAC; their bytes from the entry cache, or read back

    def _read(self, pos: int, entry_id: int, max_bytes: int, max_entries: int) -> list[Entry]:
        """The entries from entry_id on whose bytes are held, up to the first that is not: its bytes (and those of the
        entries after it this read wants) are then read back in the background (self._miss), and the read is short
        (empty when that is its first entry)."""
        out: list[Entry] = []
        budget = max_bytes
        self._miss = None
        while pos < len(self._ledgers) and len(out) < max_entries:
            ledger = self._ledgers[pos]
            last = self._last_durable_entry(pos)
            while entry_id <= last and len(out) < max_entries:
                size = ledger.sizes[entry_id]
                if out and size > budget:  # only the first entry may exceed the limit (KIP-74)
                    return out
                entry = ledger.entry(entry_id)
                if entry is None:
                    if (ledger.ledger_id, entry_id) in self._damaged:  # read back before: a read error, not short
                        raise OSError(errno.EIO, f"{self.name}: stored entry {ledger.ledger_id}:{entry_id} fails "
                                                 "its CRC")
                    self._miss = self._fill_from(ledger, entry_id, last, budget, max_entries - len(out))
                    return out
                out.append(entry)
                budget -= size
                if budget <= 0:
                    return out
                entry_id += 1
            pos, entry_id = pos + 1, 0
        return out

    def _fill_from(self, ledger: _Ledger, entry_id: int, last: int, budget: int, max_entries: int) -> asyncio.Task:
        """Read back, in the background, the entries from entry_id on that a read of budget bytes wants (at least
        FILL_MIN_BYTES, at most FILL_MAX_ENTRIES and the cache's bound, within the ledger's durable ones), or join a
        fill already doing so."""
        key = (ledger.ledger_id, entry_id)
        task = self._fills.get(key)
        if task is not None:
            return task
        budget = max(budget, FILL_MIN_BYTES)
        if self._cache.max_bytes is not None:  # more than the cache keeps would be evicted as it is read
            budget = min(budget, self._cache.max_bytes)
        end = entry_id
        while end < last and end - entry_id < min(max_entries, FILL_MAX_ENTRIES) - 1 and budget > ledger.sizes[end] \
                and ledger.data[end + 1] is None:
            budget -= ledger.sizes[end]
            end += 1
        self._cache.misses += 1
        task = self._fills[key] = asyncio.get_running_loop().create_task(
            self._fill(ledger, entry_id, end, ledger.generation))
        task.add_done_callback(lambda _: self._fills.pop(key, None))
        return task

    async def _fill(self, ledger: _Ledger, first: int, last: int, generation: int) -> bool:
        """Read entries first..last of a ledger back into the cache; whether they were. A read that changed
        meanwhile (truncated, compacted, deleted) is dropped. Readers waiting for new entries are woken (the confirm
        listeners): a Fetch that came back short reads again."""
        try:
            stored = await self._store.entries(self.name, ledger.ledger_id, first, last)
        except Exception as exc:  # noqa: BLE001 - the database is unreachable: a later read tries again
            log.warning("%s: cannot read entries %d:%d-%d back (%s)", self.name, ledger.ledger_id, first, last, exc)
            return False
        if ledger.generation != generation or self._closed:
            return False
        filled = True
        for entry in reversed(stored):  # the first one last: the most recently used, evicted last
            raw = _decode_stored(self.name, entry, fail=False)
            if raw is None:  # damaged in the database: every later read of it fails at once (a Fetch answers
                self._damaged.add((entry.ledger_id, entry.entry_id))  # KAFKA_STORAGE_ERROR), not short for ever
            filled = raw is not None and ledger.fill(raw) and filled
        filled = filled and len(stored) == last - first + 1
        for listener in self._listeners:
            listener()
        return filled

    async def read_after_async(self, position: Position, max_entries: int, max_bytes: int = 1 << 62) -> list[Entry]:
        return await self._awaited(lambda: self.read_after(position, max_entries, max_bytes),
                                   f"the entries after {position}")

    async def read_from_index_async(self, index: int, max_bytes: int, max_entries: int = 1 << 30) -> list[Entry]:
        return await self._awaited(lambda: self.read_from_index(index, max_bytes, max_entries),
                                   f"the entries from offset {index}")

    async def _awaited(self, read: Callable[[], list[Entry]], what: str) -> list[Entry]:
        """A synchronous read, again once the bytes of its first entry are read back if the cache missed them:
        empty only when there is no durable entry to read. Raises OSError when they cannot be read."""
        for _ in range(FILL_ATTEMPTS):
            self._miss = None
            entries = read()
            miss, self._miss = self._miss, None
            if entries or miss is None:
                return entries
            await asyncio.shield(miss)  # shared with other readers: one cancelled must not cancel it for the rest
        raise OSError(errno.EIO, f"{self.name}: {what} could not be read back")

    def offsets_of(self, position: Position) -> tuple[int, int] | None:
        """From the index: no bytes needed."""
        for pos, ledger in enumerate(self._ledgers):
            if ledger.ledger_id == position.ledger_id:
                if 0 <= position.entry_id <= self._last_durable_entry(pos):
                    return ledger.first_indexes[position.entry_id], ledger.spans[position.entry_id]
                return None
        return None

    async def _entry_at(self, ledger: _Ledger, entry_id: int) -> Entry:
        """One durable entry, its bytes read back if the cache misses them."""
        for _ in range(FILL_ATTEMPTS):
            entry = ledger.entry(entry_id)
            if entry is not None:
                return entry
            await asyncio.shield(self._fill_from(ledger, entry_id, entry_id, 0, 1))  # shared, as above
        raise OSError(errno.EIO, f"{self.name}: entry {ledger.ledger_id}:{entry_id} could not be read back")

    async def find_by_timestamp(self, timestamp: int, from_index: int) -> Entry | None:
        for ledger, first, last in self._durable_spans(from_index):
            entry_id = ledger.times.first_at_least(timestamp, first, last)
            if entry_id >= 0:
                return await self._entry_at(ledger, entry_id)
        return None

    async def max_timestamp(self, from_index: int) -> int:
        return max((ledger.times.max_between(first, last) for ledger, first, last in self._durable_spans(from_index)),
                   default=NO_TIMESTAMP)

    # ---- retention and lifecycle

    async def delete_before(self, index: int) -> int:
        index = min(index, self._confirmed_end)
        if index > self._start_index:
            await self._store.set_deleted_before(self.name, self._epoch, index)
            self._deleted_before = self._start_index = max(index, self._start_index)
            log.info("%s: records before offset %d deleted", self.name, index)
        return self._start_index

    async def trim(self, now_ms: int, retention_ms: int, retention_bytes: int,
                   keep_from: Position | None) -> TrimResult:
        current = self._current
        expired = retention_ms >= 0 and now_ms - self._last_append_ms > retention_ms
        if (self._roll_due(now_ms) or (current.entries and expired)) and self._recovering is None \
                and current.ledger_id <= self._lac.ledger_id and self._lac.entry_id == current.entries - 1:
            # An idle current ledger, all durable: close it so retention can reach its records.
            closed_ms = self._last_append_ms or now_ms
            await self._store.close_ledger(self.name, self._epoch, current.ledger_id, closed_ms)
            if self._current is current and current.entries - 1 == self._lac.entry_id:
                self._start_new_ledger()
        return await self._delete_old_ledgers(now_ms, retention_ms, retention_bytes, keep_from)

    def _end_of(self, ledger: _Ledger) -> int:
        return ledger.end()

    def _closed_ms(self, ledger: _Ledger, now_ms: int) -> int | None:
        return ledger.closed_ms

    async def _delete_oldest(self) -> None:
        await self._store.delete_ledger(self.name, self._epoch, self._ledgers[0].ledger_id)
        self._txn_indexed.discard(self._ledgers[0].ledger_id)  # its row held it
        self._ledgers[0].release()
        del self._ledgers[0]

    # ---- compaction (kop/compaction): the cleaner reads closed ledgers' entries here and hands back changed ones

    def closed_ledgers(self) -> list[LedgerSnapshot]:
        """The closed ledgers whose entries are all durable, oldest first, as the cleaner reads them: a list of
        their entries each, taken now (an install changes the ledger, never this list); None for an entry whose
        bytes the cache does not hold, which `with_entries` reads back."""
        return [LedgerSnapshot.in_memory(l.ledger_id, _SnapshotEntries(l), l.size, l.closed_ms)
                for l in self._ledgers if l is not self._current and l.entries and l.closed_ms is not None
                and Position(l.ledger_id, l.entries - 1) <= self._lac]

    async def with_entries(self, snapshots: list[LedgerSnapshot]) -> list[LedgerSnapshot]:
        """The snapshots with every entry's bytes, those the cache missed read from the database (for this pass
        only: a compaction pass does not push the tail's bytes out of the cache). Raises OSError when they cannot
        be read whole (retention deleted the ledger meanwhile, or the database is unreachable)."""
        out = []
        for snapshot in snapshots:
            entries = list(snapshot.entries)  # RawEntry each, from here on (the rest read below)
            missing = [i for i, raw in enumerate(entries) if raw is None]
            if missing:
                stored = await self._store.entries(self.name, snapshot.ledger_id, missing[0], missing[-1])
                for entry in stored:
                    if entries[entry.entry_id] is None:
                        entries[entry.entry_id] = _decode_stored(self.name, entry, fail=False)
                if any(raw is None for raw in entries):
                    raise OSError(errno.EIO, f"{self.name}: ledger {snapshot.ledger_id} could not be read whole")
            out.append(replace(snapshot, entries=entries))
        return out

    async def install_compaction(self, rewritten: list[RewrittenLedger], cleaned_through: int) -> list:
        """Store the rewrites' changed entries at their positions and the cleaned-through point in one fenced
        transaction, then serve them. Every entry keeps its position, offsets and time, so cursors, dedup snapshots
        and the offset and time lookups stay true. A rewrite of a ledger that changed meanwhile (deleted by
        retention) is not installed. If the commit's outcome is unknown (a lost connection), memory keeps the
        originals: the stored state is either those or the rewrites, both the same records at the same offsets,
        and the next pass compacts again."""
        if self._closed or self._fenced is not None:
            return []
        by_id = {l.ledger_id: l for l in self._ledgers if l is not self._current}
        current = [r for r in rewritten if r.ledger_id in by_id and by_id[r.ledger_id].size == r.size_before]
        rows = [(r.ledger_id, entry_id, payload) for r in current for entry_id, payload in r.entries]
        try:
            stored = await self._store.install_compaction(self.name, self._epoch, rows, cleaned_through,
                                                          self._crash_failpoint(cleaned_through))
        except LedgerFencedOut as exc:
            log.info("%s: compaction not installed: %s", self.name, exc)
            return []
        self.cleaned_through = max(self.cleaned_through, cleaned_through)
        installed = []
        for r in current:
            ledger = by_id[r.ledger_id]
            if r.ledger_id not in stored or ledger not in self._ledgers:  # deleted by retention meanwhile
                continue
            for entry_id, payload in r.entries:
                ledger.replace(decode_entry(entry_id, unframe(payload)))
            ledger.size = r.size
            installed.append(r)
        return installed

    def _crash_failpoint(self, cleaned_through: int) -> Callable[[], None] | None:
        if not self._crash_before_cleaned_through:
            return None

        def crash() -> None:
            log.warning("%s: failpoint: killing the broker before recording ledger %d as cleaned (the rewrites' "
                        "transaction not committed)", self.name, cleaned_through)
            os.kill(os.getpid(), signal.SIGKILL)
        return crash

    def inject_crash_before_cleaned_through(self) -> None:
        """Failpoint: the broker kills itself inside the transaction that installs the cleaner's next pass, after
        its statements ran and before it commits: rewrites and cleaned-through point are one commit here, so there
        is no moment between them to crash in."""
        self._crash_before_cleaned_through = True

    # ---- transaction indexes: a column of the ledger's row

    async def write_txn_index(self, ledger_id: int, data: bytes) -> None:
        if self._closed:
            raise LedgerClosedError(self.name)
        self._check_txn_index_write(ledger_id)
        if await self._store.write_txn_index(self.name, self._epoch, ledger_id, data) and \
                self._holds_ledger(ledger_id):
            self._txn_indexed.add(ledger_id)

    async def read_txn_index(self, ledger_id: int) -> bytes | None:
        if ledger_id not in self._txn_indexed:
            return None
        return await self._store.read_txn_index(self.name, ledger_id)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._released.set()
        await self._appends.wait_idle()
        if self._recovering is not None:
            self._recovering.cancel()
        for ledger in self._ledgers:  # a fill still running drops what it reads: the ledger is closed
            ledger.release()
        await self._cursors.close()

    async def delete(self) -> None:
        await self.close()
        await self._store.remove(self.name)


def _decode_stored(name: str, stored: StoredEntry, fail: bool = True) -> RawEntry | None:
    """A stored entry, checked against its CRC: one that fails it was never written so by kop, and is refused
    (ValueError, or None when not `fail`) rather than served as damaged records."""
    payload = unframe(stored.payload)
    if payload is None:
        if fail:
            raise ValueError(f"{name}: stored entry {stored.ledger_id}:{stored.entry_id} fails its CRC")
        log.error("%s: stored entry %d:%d fails its CRC; not served", name, stored.ledger_id, stored.entry_id)
        return None
    return decode_entry(stored.entry_id, payload)
