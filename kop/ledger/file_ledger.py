"""The embedded, file-based managed-ledger engine (one machine).

Directory layout of one managed ledger:
    ledgers.info      ManagedLedgerInfo (protobuf), replaced atomically when the ledger list changes
    {id}.log/.idx     one ledger: entries and their offset index (see ledger_file)
    {id}.txnindex     a closed ledger's aborted-transaction index (kop/transactions' bytes), written whole by
                      rename once the ledger is closed, deleted with the ledger
    cursors.log       the cursor log (see cursor_log)
A new ledger is started on every open (so a crashed ledger is never appended to again), when the current one exceeds
`max_ledger_bytes` or is older than `max_ledger_age_ms` (Kafka's segment.bytes and segment.ms), and after a failed
write. Retention deletes whole closed ledgers, so trim also closes an idle current ledger once it is due (too old, or
wholly past retention): otherwise a quiet topic would keep its last records forever.
"""
import asyncio
import contextlib
import errno
import logging
import os
import re
import shutil
import signal
from array import array
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass

from kop import clock
from kop.ledger.cursor_log import CursorLog
from kop.ledger.errors import LedgerClosedError, LedgerWriteError
from kop.ledger.file_pool import FilePool
from kop.ledger.flusher import Flusher
from kop.ledger.framed_file import makedirs_durable, replace_atomically
from kop.ledger.group_commit import GroupCommit
from kop.ledger.interface import Entry, TrimResult
from kop.ledger.ledger_base import LedgerBase, LedgerConfig
from kop.ledger.ledger_file import LedgerFile, RawEntry
from kop.ledger.position import BEFORE_FIRST, Position
from kop.ledger.rewrites import LedgerSnapshot, RewrittenLedger
from kop.ledger.time_index import NO_TIMESTAMP
from google.protobuf.message import DecodeError

from proto.kop_pb2 import KeyValue, ManagedLedgerInfo

log = logging.getLogger(__name__)

# ledgers.info properties. The end floor keeps offsets rising after retention deleted every ledger with entries;
# deleted-before is Kafka's DeleteRecords low watermark.
END_FLOOR_KEY = "kop.end_floor"
DELETED_BEFORE_KEY = "kop.deleted_before"
# The last ledger the log cleaner compacted (kop/compaction): ledgers after it are its dirty section.
CLEANED_THROUGH_KEY = "kop.cleaned_through"
LEDGER_FILE = re.compile(r"^(\d+)\.(log|idx|txnindex)$")
COMPACTING_FILE = re.compile(r"^(\d+)\.(log|idx)\.compacting-\w+$")
TXN_INDEX_TMP = re.compile(r"^(\d+)\.txnindex\.tmp$")  # a transaction index a crash cut short: never renamed


@dataclass(slots=True)
class _PendingAdd:
    future: asyncio.Future
    ledger: LedgerFile
    entry_id: int
    end_index: int
    then: Callable[[asyncio.Future], None] | None = None
    pinned: bool = False  # written: its ledger's descriptor stays open until the fsync covering it is done


class FileManagedLedger(LedgerBase):
    def __init__(self, name: str, directory: str, config: LedgerConfig, executor: Executor | None,
                 files: FilePool | None = None, flusher: Flusher | None = None) -> None:
        super().__init__(name, config)
        self.directory = directory
        self._executor = executor
        self._files = files if files is not None else FilePool()
        self._closed_times: dict[int, int] = {}
        self.cleaned_through = -1  # the last ledger compacted (ledgers.info property)
        self._group = GroupCommit(executor, config.fsync, self._on_durable, self._on_write_failed,
                                  config.flush_observer, flusher)
        self._cursors = CursorLog(os.path.join(directory, "cursors.log"), executor, config.fsync,
                                  lambda: self._lac, self._files)
        self._closed = False
        self._roll_pending = False  # a write failed: the next write starts a new ledger first, or is refused
        self._torn_writes = 0  # failpoint (inject_append_failures): the next n appends write half, then fail

    # ---- opening and recovery

    @classmethod
    def open(cls, name: str, directory: str, config: LedgerConfig, executor: Executor | None,
             initial_index: int = 0, files: FilePool | None = None,
             flusher: Flusher | None = None) -> "FileManagedLedger":
        """Open (or create) the managed ledger in directory, recovering after a crash, and start a new ledger.
        Ledger files are opened through `files`, the broker's shared pool (a pool of its own when none is given);
        fsyncs run in `flusher`, the broker's fsync thread (in `executor` when none is given)."""
        makedirs_durable(directory, durable=config.fsync)
        ml = cls(name, directory, config, executor, files, flusher)
        try:
            ml._recover(initial_index)
            ml._cursors.open()
        except BaseException:
            ml._release_files()
            raise
        return ml

    def _release_files(self) -> None:
        for ledger in self._ledgers:
            ledger.close()

    def _info_path(self) -> str:
        return os.path.join(self.directory, "ledgers.info")

    def _recover(self, initial_index: int) -> None:
        info = ManagedLedgerInfo()
        if os.path.exists(self._info_path()):
            with open(self._info_path(), "rb") as f:
                try:
                    info.ParseFromString(f.read())
                except DecodeError as exc:
                    raise ValueError(f"{self._info_path()} is not a valid ledger list ({exc})") from exc
        self._start_index = self._written_end = initial_index
        properties = {p.key: p.value for p in info.properties}
        self._deleted_before = int(properties.get(DELETED_BEFORE_KEY, 0))
        self.cleaned_through = int(properties.get(CLEANED_THROUGH_KEY, -1))
        end_floor = int(properties.get(END_FLOOR_KEY, initial_index))
        listed = list(info.ledgerInfo)
        # Ledger ids never go back, even when every listed ledger turns out empty: positions stored in cursors must
        # stay behind every new entry.
        self._last_ledger_id = max((li.ledgerId for li in listed), default=-1)
        for i, li in enumerate(listed):
            if not os.path.exists(os.path.join(self.directory, f"{li.ledgerId}.log")):
                log.warning("%s: ledger %d listed but missing", self.name, li.ledgerId)
                continue
            ledger = LedgerFile.open_existing(self._files, self.directory, li.ledgerId, self.config.max_entry_bytes)
            self._ledgers.append(ledger)
            if i < len(listed) - 1 and li.HasField("entries") and ledger.entries > li.entries:
                # Closed with li.entries entries; more on disk are failed writes whose truncation a power loss undid.
                # Their batches were retried into a later ledger: serving them too would duplicate them.
                log.warning("%s: ledger %d holds %d entries but was closed with %d; dropping the failed ones",
                            self.name, li.ledgerId, ledger.entries, li.entries)
                ledger.truncate(li.entries)
                ledger.sync()
            ledger.closed = True
            if li.HasField("max_timestamp"):
                ledger.recorded_max_timestamp = li.max_timestamp
            self._closed_times[ledger.ledger_id] = li.timestamp or clock.now_ms()
            if ledger.entries == 0:
                self._ledgers.pop()
                ledger.delete_files()
        if self._ledgers:
            first = self._ledgers[0]
            self._start_index = first.first_indexes[0]
            last = self._ledgers[-1]
            self._lac = Position(last.ledger_id, last.entries - 1)
            self._written_end = self._end_of(last)
        else:
            # Every entry went with deleted ledgers: the log is empty but keeps its offsets and, for cursors that
            # point into the deleted ledgers, a last confirmed position after them.
            self._start_index = self._written_end = end_floor
            if self._last_ledger_id >= 0:
                self._lac = Position(self._last_ledger_id, -1)
        self._written_end = max(self._written_end, end_floor, self._deleted_before)
        self._start_index = max(self._start_index, self._deleted_before)
        self._confirmed_end = self._written_end
        self._remove_unlisted({li.ledgerId for li in listed})
        self._start_new_ledger()

    def _remove_unlisted(self, listed: set[int]) -> None:
        """Ledger files that ledgers.info does not list are garbage: a ledger created just before a crash (listed
        only once the list is written) or one deleted whose unlink a power loss undid. Notes which ledgers kept
        hold a transaction index."""
        kept = {ledger.ledger_id for ledger in self._ledgers}
        for name in os.listdir(self.directory):
            match = LEDGER_FILE.match(name)
            if match and int(match[1]) not in listed:
                log.warning("%s: removing unlisted ledger file %s", self.name, name)
                os.unlink(os.path.join(self.directory, name))
            elif match and match[2] == "txnindex" and int(match[1]) in kept:
                self._txn_indexed.add(int(match[1]))
            elif COMPACTING_FILE.match(name) or TXN_INDEX_TMP.match(name):  # cut short by a crash: never read
                log.info("%s: removing the unfinished file %s", self.name, name)
                os.unlink(os.path.join(self.directory, name))

    def _end_of(self, ledger: LedgerFile) -> int:
        """One past the last offset of a ledger's last entry."""
        entry = ledger.read(ledger.entries - 1, ledger.entries - 1, 1 << 62)[0]
        return entry.first_index + entry.span

    def _start_new_ledger(self) -> None:
        """Close the current ledger and start a new one, recording the ledger list atomically. When that fails (a
        full disk), nothing changes: the new ledger's files go, the current ledger stays as it was, and the error
        is raised."""
        next_id = max((l.ledger_id for l in self._ledgers), default=-1) + 1
        next_id = max(next_id, self._last_ledger_id + 1)
        previous = self._current
        ledgers, closed_times = list(self._ledgers), dict(self._closed_times)
        if previous is not None:
            next_id = max(next_id, previous.ledger_id + 1)
            # Retention counts from the ledger's newest record, not from when it happened to be closed.
            closed_times[previous.ledger_id] = self._last_append_ms or clock.now_ms()
            if previous.entries == 0:
                ledgers.remove(previous)
        self._last_ledger_id = next_id  # ids never go back, even for a ledger whose start failed
        ledger = LedgerFile.create(self._files, self.directory, next_id)
        ledgers.append(ledger)
        try:
            # Lists the new ledger and fsyncs the directory, which makes the new files' entries durable too.
            self._write_info(ledgers, closed_times, ledger)
        except OSError:
            ledger.delete_files()
            raise
        if previous is not None:
            previous.closed = True
            if previous.entries == 0:
                previous.delete_files()
            else:
                _write_index(previous)
        self._ledgers, self._closed_times, self._current = ledgers, closed_times, ledger
        self._first_append_ms = self._last_append_ms = 0
        self._roll_pending = self._roll_requested = False

    def _write_info(self, ledgers: list[LedgerFile] | None = None, closed_times: dict[int, int] | None = None,
                    current: LedgerFile | None = None) -> None:
        """Replace ledgers.info with the given ledger list (the live one by default); every ledger but `current`
        is closed."""
        if ledgers is None:
            ledgers, closed_times, current = self._ledgers, self._closed_times, self._current
        info = ManagedLedgerInfo()
        for ledger in ledgers:
            li = info.ledgerInfo.add()
            li.ledgerId = ledger.ledger_id
            li.entries = ledger.entries
            li.size = ledger.size
            li.timestamp = closed_times.get(ledger.ledger_id, 0)
            li.first_index = ledger.first_indexes[0] if ledger.entries else -1
            max_timestamp = ledger.max_timestamp() if ledger is not current else None  # the current one still grows
            if max_timestamp is not None:
                li.max_timestamp = max_timestamp
        info.properties.append(KeyValue(key=END_FLOOR_KEY, value=str(self._confirmed_end)))
        if self._deleted_before:
            info.properties.append(KeyValue(key=DELETED_BEFORE_KEY, value=str(self._deleted_before)))
        if self.cleaned_through >= 0:
            info.properties.append(KeyValue(key=CLEANED_THROUGH_KEY, value=str(self.cleaned_through)))
        replace_atomically(self._info_path(), info.SerializeToString(), durable=self.config.fsync)

    # ---- writing

    def add_entry(self, first_index: int, span: int, metadata: bytes, data: bytes | memoryview,
                  then: Callable[[asyncio.Future], None] | None = None) -> asyncio.Future:
        if self._closed:
            raise LedgerClosedError(self.name)
        if first_index != self._written_end:
            raise ValueError(f"{self.name}: entry starts at {first_index}, expected {self._written_end}")
        now_ms = clock.now_ms()
        failing = self._group.failing  # an earlier write failed: nothing more goes into this ledger
        if not failing and (self._roll_pending or self._roll_due(now_ms)):
            try:
                self._start_new_ledger()
            except OSError as exc:
                if self._roll_pending:  # the current ledger saw a failed write: refuse until a new one starts
                    raise LedgerWriteError(f"{self.name}: cannot start a new ledger: {exc}") from exc
                log.warning("%s: cannot roll the ledger (%s); appending to the current one", self.name, exc)
        ledger = self._current
        self._written_end = first_index + span
        future = asyncio.get_running_loop().create_future()
        add = _PendingAdd(future, ledger, ledger.entries, self._written_end, then)
        if failing:
            self._group.fail(OSError(errno.EIO, "an earlier write failed"), add)
            return future
        try:
            torn, self._torn_writes = self._torn_writes > 0, max(0, self._torn_writes - 1)
            ledger.append(first_index, span, metadata, data, torn)
        except OSError as exc:
            # Failed like a flush: once the writes before it complete, it and every later one fail and the ledger
            # rolls (_on_write_failed), so the owner sees one failure, in log order.
            log.error("%s: write of entry %d failed: %s", self.name, add.entry_id, exc)
            self._group.fail(exc, add)
            return future
        self._first_append_ms = self._first_append_ms or now_ms
        self._last_append_ms = now_ms
        add.pinned = True
        self._group.add(ledger.log.pin(), add)
        return future

    def _on_durable(self, adds: list[_PendingAdd]) -> None:
        """The entries are on disk: index them, then answer them. Nothing here may raise: a write left unanswered
        would hold its producer (or a transactional id) for ever."""
        _unpin(adds)
        positions = []
        for add in adds:
            add.ledger.durable = add.entry_id + 1
            positions.append(Position(add.ledger.ledger_id, add.entry_id))
        for ledger in {add.ledger: None for add in adds}:  # a rolled ledger gets its last index records now
            try:
                ledger.write_index(ledger.durable, at_once=ledger.closed)
            except OSError as exc:  # a full disk, no descriptor: a later write, or the repair at open, indexes it
                log.warning("%s: index not written (%s); the entries are durable, the index catches up with a later "
                            "write or is repaired from the log at open", self.name, exc)
        self._lac = positions[-1]
        self._confirmed_end = adds[-1].end_index
        for add, position in zip(adds, positions):
            if not add.future.done():
                add.future.set_result(position)
            if add.then is not None:
                _call_then(add)
        for listener in self._listeners:
            listener()

    def _on_write_failed(self, exc: OSError, adds: list[_PendingAdd]) -> None:
        """Entries of the failed flush and all later ones are not durable: drop them and roll to a new ledger."""
        log.error("%s: write failed (%s); failing %d pending entries and rolling the ledger", self.name, exc, len(adds))
        _unpin(adds)
        for add in adds:
            if add.ledger.entries > add.entry_id:
                try:
                    add.ledger.truncate(add.entry_id)
                except OSError as cut_error:  # left out of the ledger all the same; its next open drops them
                    log.error("%s: cannot cut the failed entries off ledger %d: %s", self.name, add.ledger.ledger_id,
                              cut_error)
        self._written_end = self._confirmed_end
        if not self._closed:
            self._roll_pending = True
            try:
                self._start_new_ledger()
            except OSError as roll_error:  # the next write tries again; until a roll succeeds, writes are refused
                log.error("%s: cannot start a new ledger after the failed write: %s", self.name, roll_error)
        self._fail_writes(LedgerWriteError(f"{self.name}: {exc}"), [add.future for add in adds])
        for add in adds:
            if add.then is not None:
                _call_then(add)

    def inject_write_failures(self, count: int) -> None:
        """Failpoint (admin API, tests): the next `count` flushes fail as a disk error would."""
        self._group.injected_failures += count

    def inject_append_failures(self, count: int) -> None:
        """Failpoint (admin API, tests): the next `count` appends to the ledger file write half their record, then
        fail with EIO, as a disk error part-way through a write would (the flush failpoint is write_failures)."""
        self._torn_writes += count

    def inject_cursor_write_failures(self, count: int) -> None:
        """Failpoint (admin API, tests): the next `count` flushes of the cursor log fail as a disk error would."""
        self._cursors.inject_write_failures(count)

    def hold_flushes(self, hold: bool) -> None:
        """Failpoint (admin API, tests): while held, this ledger's flushes stall in their worker thread, as on a
        stuck disk."""
        if hold:
            self._group.released.clear()
        else:
            self._group.released.set()

    # ---- reading

    def _read(self, ledger_pos: int, entry_id: int, max_bytes: int, max_entries: int) -> list[Entry]:
        out: list[Entry] = []
        budget = max_bytes
        while ledger_pos < len(self._ledgers) and len(out) < max_entries:
            last = self._last_durable_entry(ledger_pos)
            if entry_id > last:
                if last < 0 or ledger_pos + 1 >= len(self._ledgers):
                    break
                ledger_pos, entry_id = ledger_pos + 1, 0
                continue
            ledger = self._ledgers[ledger_pos]
            last = min(last, entry_id + max_entries - len(out) - 1)
            # Only the response's first entry may exceed the limit (KIP-74), so not the first of a later ledger.
            raws = ledger.read(entry_id, last, budget if out else max(budget, 1), at_least_one=not out)
            if not raws:
                break
            for raw in raws:
                out.append(_entry(ledger, raw))
                budget -= len(raw.data)
            if budget <= 0 or raws[-1].entry_id < last:
                break
            ledger_pos, entry_id = ledger_pos + 1, 0
        return out

    # ---- timestamps (ListOffsets by time)

    async def find_by_timestamp(self, timestamp: int, from_index: int) -> Entry | None:
        return await self._with_time_indexes(lambda: self._find_by_timestamp(timestamp, from_index))

    async def max_timestamp(self, from_index: int) -> int:
        return await self._with_time_indexes(lambda: self._max_timestamp(from_index))

    async def _with_time_indexes(self, search: Callable):
        """Run a synchronous search; when it names a ledger whose time index is not built, build that in a thread
        and search again (from scratch: the ledger list may have changed meanwhile). Each round builds one index."""
        while True:
            result = search()
            if not isinstance(result, LedgerFile):
                return result
            positions = array("q", result.file_positions)  # closed: no longer changes, but copy on the loop
            times = await asyncio.get_running_loop().run_in_executor(
                self._executor, result.read_time_index, positions)
            if result.times is None:
                result.times = times

    def _find_by_timestamp(self, timestamp: int, from_index: int) -> Entry | LedgerFile | None:
        for ledger, first, last in self._durable_spans(from_index):
            known = ledger.max_timestamp()
            if first == 0 and last == ledger.entries - 1 and known is not None and known < timestamp:
                continue  # the whole ledger is older than the target
            if ledger.times is None:
                return ledger
            entry_id = ledger.times.first_at_least(timestamp, first, last)
            if entry_id >= 0:
                return _entry(ledger, ledger.read(entry_id, entry_id, 1)[0])
        return None

    def _max_timestamp(self, from_index: int) -> int | LedgerFile:
        best = NO_TIMESTAMP
        for ledger, first, last in self._durable_spans(from_index):
            known = ledger.max_timestamp()
            if first == 0 and last == ledger.entries - 1 and known is not None:
                best = max(best, known)
            elif ledger.times is None:
                return ledger
            else:
                best = max(best, ledger.times.max_between(first, last))
        return best

    # ---- retention and lifecycle

    async def delete_before(self, index: int) -> int:
        index = min(index, self._confirmed_end)
        if index > self._start_index:
            before = self._deleted_before, self._start_index
            self._deleted_before = self._start_index = index
            try:
                self._write_info()  # on the loop, as every ledger-list write is: they share one temporary file
            except OSError:  # not recorded: readers keep seeing the records, as they would after a restart
                self._deleted_before, self._start_index = before
                raise
            log.info("%s: records before offset %d deleted", self.name, index)
        return self._start_index

    async def trim(self, now_ms: int, retention_ms: int, retention_bytes: int,
                   keep_from: Position | None) -> TrimResult:
        expired = retention_ms >= 0 and now_ms - self._last_append_ms > retention_ms
        due = self._roll_due(now_ms) or (self._current.entries and expired)
        if due and not self._closed and not self._group.failing:  # a failing ledger rolls once its writes failed
            try:
                self._start_new_ledger()  # an idle current ledger: due to roll, or every record in it past retention
            except OSError as exc:
                log.warning("%s: cannot roll the idle ledger for retention (%s); trying again later", self.name, exc)
        return await self._delete_old_ledgers(now_ms, retention_ms, retention_bytes, keep_from)

    def _closed_ms(self, ledger: LedgerFile, now_ms: int) -> int | None:
        return self._closed_times.get(ledger.ledger_id, now_ms) if ledger.closed else None

    async def _delete_oldest(self) -> None:
        oldest = self._ledgers.pop(0)
        self._write_info()
        oldest.delete_files()
        if oldest.ledger_id in self._txn_indexed:
            self._txn_indexed.discard(oldest.ledger_id)
            _remove(self._txn_index_path(oldest.ledger_id))

    # ---- transaction indexes

    def _txn_index_path(self, ledger_id: int) -> str:
        return os.path.join(self.directory, f"{ledger_id}.txnindex")

    async def write_txn_index(self, ledger_id: int, data: bytes) -> None:
        if self._closed:
            raise LedgerClosedError(self.name)
        self._check_txn_index_write(ledger_id)
        path = self._txn_index_path(ledger_id)
        await asyncio.get_running_loop().run_in_executor(self._executor, replace_atomically, path, data,
                                                         self.config.fsync)
        if self._holds_ledger(ledger_id):
            self._txn_indexed.add(ledger_id)
        else:  # retention deleted the ledger while its index was being written
            _remove(path)

    async def read_txn_index(self, ledger_id: int) -> bytes | None:
        if ledger_id not in self._txn_indexed:
            return None
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, _read_file,
                                                                    self._txn_index_path(ledger_id))
        except FileNotFoundError:  # deleted with its ledger meanwhile
            return None

    # ---- compaction (kop/compaction): the cleaner reads closed ledgers and installs their rewrites

    def closed_ledgers(self) -> list[LedgerSnapshot]:
        """The closed ledgers, oldest first, as the cleaner reads them (in its own process, by path)."""
        return [LedgerSnapshot(l.ledger_id, l.log_path, l.idx_path, tuple(l.file_positions), l.size,
                               self._closed_times.get(l.ledger_id, 0))
                for l in self._ledgers if l.closed and l is not self._current and l.entries]

    def install_compacted(self, rewritten: RewrittenLedger) -> bool:
        """Put a complete rewrite of a closed ledger in its place: renamed over its files (the commit point: a
        crash before it leaves the original, after it the rewrite), then read from at once. Entry ids and offsets
        are the same, so cursors, the offset index and the time index stay true. False (and the rewrite removed)
        when the ledger changed meanwhile (deleted by retention, or the ledger closed)."""
        at = next((i for i, l in enumerate(self._ledgers) if l.ledger_id == rewritten.ledger_id), None)
        old = self._ledgers[at] if at is not None else None
        installable = not self._closed and old is not None and old is not self._current \
            and old.size == rewritten.size_before
        try:
            if installable:
                os.replace(rewritten.log_path, old.log_path)
        except OSError as exc:
            log.warning("%s: cannot install the compacted ledger %d (%s); it stays as it was", self.name,
                        rewritten.ledger_id, exc)
            installable = False
        if not installable:
            _remove(rewritten.log_path, rewritten.idx_path)
            return False
        # From here the rewrite is the ledger: read it at once, whatever becomes of its index.
        old.close()  # its descriptors still read the original's bytes: none may be used again
        self._ledgers[at] = LedgerFile.rewritten(self._files, old, rewritten.positions, rewritten.size)
        try:
            os.replace(rewritten.idx_path, old.idx_path)
        except OSError as exc:  # the old index: checked against the log and rebuilt on the next open
            log.warning("%s: compacted ledger %d keeps its old index until reopened (%s)", self.name,
                        rewritten.ledger_id, exc)
            _remove(rewritten.idx_path)
        return True

    def set_cleaned_through(self, ledger_id: int) -> None:
        """Record, durably with the ledger list (and the rewrites' new sizes), how far the cleaner has been."""
        if self._closed:  # the partition went (its topic deleted) while the cleaner worked
            return
        if self._crash_before_cleaned_through:
            log.warning("%s: failpoint: killing the broker before recording ledger %d as cleaned", self.name,
                        ledger_id)
            os.kill(os.getpid(), signal.SIGKILL)
        self.cleaned_through = ledger_id
        self._write_info()

    def inject_crash_before_cleaned_through(self) -> None:
        self._crash_before_cleaned_through = True

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._group.wait_idle()
        if self._current is not None and self._current.entries:
            _write_index(self._current)
        await self._cursors.close()
        self._release_files()

    async def delete(self) -> None:
        await self.close()
        shutil.rmtree(self.directory, ignore_errors=True)


def _read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _remove(*paths: str) -> None:
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _call_then(add: _PendingAdd) -> None:
    """The owner's callback of a write now done; an error in it must not keep the other writes from being answered."""
    try:
        add.then(add.future)
    except Exception:
        log.exception("a completed write's callback failed")


def _write_index(ledger: LedgerFile) -> None:
    """The index records of a ledger's durable entries not yet written (it rolls or closes). A failure only costs a
    scan of the log's tail when the ledger is opened again."""
    try:
        ledger.write_index(ledger.durable)
    except OSError as exc:
        log.warning("cannot write the index of ledger %s (%s); it is rebuilt from the log when opened", ledger.log_path,
                    exc)


def _unpin(adds: list[_PendingAdd]) -> None:
    for add in adds:
        if add.pinned:
            add.pinned = False
            add.ledger.log.unpin()


def _entry(ledger: LedgerFile, raw: RawEntry) -> Entry:
    return Entry(Position(ledger.ledger_id, raw.entry_id), raw.first_index, raw.span, raw.metadata, raw.data)
