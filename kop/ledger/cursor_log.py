"""Cursors of one managed ledger, kept in an append-only cursor log.

Each mark-delete appends one ManagedCursorInfo record (name, position, properties) and completes after a group-committed
fsync, so position and properties are one atomic unit and thousands of commits share a few fsyncs. On open the latest
intact record of each cursor wins (see cursor_scan): a damaged newest record falls back to the cursor's previous
consistent (position, properties) pair, never to a position with empty properties, and damage in the middle of the
log loses only the records it covers.

The log is compacted when it grows well beyond its live content: rewritten with the last two records of each cursor
(so a newest record damaged later still has its predecessor to fall back to), in a worker thread. New records keep
going to the old file meanwhile; only the final swap holds them back briefly (in order, in memory), until every
record of the old file is durable, those written since the rewrite began are appended to the new file, the new file
has replaced the old one and the directory entry is durable. If anything before the replace fails, the old file stays
live; if anything after it fails, the records held back fail and the next record retries the switch: nothing is ever
acknowledged from a file that is no longer the log.

A cursor whose records the damage may have destroyed (the log lost records of unknown cursors and holds no deletion of
this one written since) is recreated before the first entry, not at the caller's initial position: a later start could
skip entries it had not consumed (the dedup cursor would skip the replay that rebuilds its state).
"""
import asyncio
import functools
import logging
import os
from collections.abc import Callable
from concurrent.futures import Executor

from kop.ledger.cursor_scan import KeptRecord, marker_record, position_of, recover
from kop.ledger.errors import CursorNotFoundError, InvalidMarkDeleteError, LedgerClosedError
from kop.ledger.file_pool import FilePool, PooledFile
from kop.ledger.framed_file import append_at, frame, fsync_dir, write_synced
from kop.ledger.group_commit import GroupCommit
from kop.ledger.position import BEFORE_FIRST, Position
from proto.kop_pb2 import LongProperty, ManagedCursorInfo, PositionInfo, StringProperty

log = logging.getLogger(__name__)

COMPACT_MIN_BYTES = 4 * 1024 * 1024
LARGE_RECORD_PROPERTIES = 1000  # from this many properties on, a record is encoded in a worker thread


class ManagedCursor:
    """A named position in a managed ledger with a properties map that moves together with it."""

    def __init__(self, log_: "CursorLog", name: str, position: Position,
                 properties: dict[str, int], string_properties: dict[str, str]) -> None:
        self._log = log_
        self.name = name
        self.mark_delete_position = position
        self.properties = properties
        self.string_properties = string_properties
        self._submitted = position  # the newest position handed to the log, durable or not

    @property
    def is_durable(self) -> bool:
        """Whether a record of this cursor is on disk: one created in memory whose first write failed is not, and
        would not exist after a crash."""
        return self._log.has_durable_record(self.name)

    @property
    def recovery_floor(self) -> Position:
        """The earliest position a restart can bring this cursor back to (its older kept record, the fallback when
        the newest is damaged): entries after it must be kept for the replay that position implies."""
        return self._log.recovery_floor(self.name, self.mark_delete_position)

    async def mark_delete(self, position: Position, properties: dict[str, int] | None = None,
                          string_properties: dict[str, str] | None = None) -> None:
        """Move the mark-delete position (never backwards, never past the last confirmed entry), atomically with
        its properties, and return once the record is durable."""
        position = Position(*position)
        if position < self._submitted:
            raise InvalidMarkDeleteError(f"cursor {self.name}: {position} is before {self._submitted}")
        if position > self._log.last_confirmed():
            raise InvalidMarkDeleteError(f"cursor {self.name}: {position} is past the last confirmed entry")
        await self._move(position, properties, string_properties)

    async def reset(self, position: Position, properties: dict[str, int] | None = None,
                    string_properties: dict[str, str] | None = None) -> None:
        """Move the position anywhere up to the last confirmed entry, backwards included (Pulsar's resetCursor:
        a consumer group that seeks back and commits)."""
        position = Position(*position)
        if position > self._log.last_confirmed():
            raise InvalidMarkDeleteError(f"cursor {self.name}: {position} is past the last confirmed entry")
        await self._move(position, properties, string_properties)

    async def _move(self, position: Position, properties: dict[str, int] | None,
                    string_properties: dict[str, str] | None) -> None:
        props = dict(properties) if properties is not None else dict(self.properties)
        strings = dict(string_properties) if string_properties is not None else dict(self.string_properties)
        self._submitted = position
        await self._log.append(self.name, position, props, strings)
        # Applied in memory only once durable; records complete in submission order.
        self.mark_delete_position = position
        self.properties = props
        self.string_properties = strings


class CursorLog:
    def __init__(self, path: str, executor: Executor | None, durable: bool,
                 last_confirmed: Callable[[], Position], files: FilePool | None = None) -> None:
        self.path = path
        self.last_confirmed = last_confirmed
        self.cursors: dict[str, ManagedCursor] = {}
        self._executor = executor
        self._durable = durable
        self._files = files if files is not None else FilePool()
        self._file: PooledFile | None = None  # the live log, through the broker's descriptor pool
        self._size = 0
        self._closed = False
        self._kept: dict[str, tuple[KeptRecord, ...]] = {}  # the last two durable records of each live cursor
        self._kept_bytes = 0
        self._damaged = False  # records of unknown cursors may have been lost
        self._known_deleted: set[str] = set()  # deleted since the damage, so not lost
        self._held: list[tuple[KeptRecord, asyncio.Future]] | None = None  # during a file switch
        self._carry: list[bytes] | None = None  # records made durable since the compaction's snapshot
        self._stale = False  # the file was replaced but is not reopened yet: the next write retries the switch
        self._task: asyncio.Task | None = None  # the compaction or switch in progress
        self._encoding: dict[str, asyncio.Future] = {}  # per cursor: done once its latest record is handed over
        self._group = GroupCommit(executor, durable, self._on_durable, self._on_failure)

    # ---- opening

    def open(self) -> None:
        created = not os.path.exists(self.path)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            self._open_from(fd, created)
        except BaseException:
            os.close(fd)
            raise

    def _open_from(self, fd: int, created: bool) -> None:
        if created and self._durable:
            fsync_dir(os.path.dirname(self.path) or ".")  # else a power loss can drop the file and every cursor
        size = os.fstat(fd).st_size
        state = recover(os.pread(fd, size, 0))
        if state.intact_end < size:
            # A damaged tail: replace it with a marker, so that the loss is still known once the bytes are gone.
            log.warning("cursor log %s: %d damaged bytes at the end replaced by a marker", self.path,
                        size - state.intact_end)
            marker = marker_record()
            _pwrite_all(fd, marker, state.intact_end)
            size = state.intact_end + len(marker)
            os.ftruncate(fd, size)
            if self._durable:
                os.fdatasync(fd)
            state.damaged = True
        if state.damaged:
            log.warning("cursor log %s: records were lost; recovered cursors %s, each at its latest intact record",
                        self.path, sorted(state.kept))
        self._file, self._size = self._files.adopt(self.path, fd), size
        self._damaged, self._known_deleted = state.damaged, state.known_deleted
        for name, kept in state.kept.items():
            self._keep(name, kept)
            p = kept[-1].info.position
            self.cursors[name] = ManagedCursor(
                self, name, kept[-1].position,
                {lp.name: lp.value for lp in p.properties},
                {sp.name: sp.value for sp in p.string_properties})

    def may_have_lost(self, name: str) -> bool:
        """Whether records of this (absent) cursor may have been destroyed by damage to the log."""
        return self._damaged and name not in self.cursors and name not in self._known_deleted

    def open_cursor(self, name: str, initial: Position) -> ManagedCursor:
        cursor = self.cursors.get(name)
        if cursor is None:
            if self.may_have_lost(name):
                log.warning("cursor log %s: cursor %s may have been lost; it starts before the first entry",
                            self.path, name)
                initial = BEFORE_FIRST
            cursor = ManagedCursor(self, name, initial, {}, {})
            self.cursors[name] = cursor
        return cursor

    def has_durable_record(self, name: str) -> bool:
        return name in self._kept

    def recovery_floor(self, name: str, default: Position) -> Position:
        return min((k.position for k in self._kept.get(name, ())), default=default)

    # ---- writing

    async def delete_cursor(self, name: str) -> None:
        deletion = functools.partial(_deletion_record, name)
        if self.cursors.pop(name, None) is None:
            if self.may_have_lost(name):
                # Record the deletion all the same: a later open_cursor is then a new cursor, not a lost one.
                await self._write(name, deletion, large=False)
            raise CursorNotFoundError(name)
        await self._write(name, deletion, large=False)

    def inject_write_failures(self, count: int) -> None:
        """Failpoint (admin API, tests): the next `count` flushes of this log fail as a disk error would."""
        self._group.injected_failures += count

    async def append(self, name: str, position: Position, props: dict[str, int], strings: dict[str, str]) -> None:
        large = len(props) + len(strings) >= LARGE_RECORD_PROPERTIES
        await self._write(name, functools.partial(_state_record, name, position, props, strings), large)

    async def _write(self, name: str, build: Callable[[], KeptRecord], large: bool) -> None:
        """Encode a record of cursor `name` and append it. A large record (a dedup snapshot of many producers) is
        encoded in a worker thread: done on the event loop it would stall every connection, while the thread leaves
        the loop its turns. The records of one cursor reach the log in the order they were written."""
        earlier = self._encoding.get(name)
        if earlier is None and not large:
            await self._submit(build())  # the common case: no wait, no thread
            return
        loop = asyncio.get_running_loop()
        handed_over = self._encoding[name] = loop.create_future()
        try:
            if earlier is not None:
                await asyncio.shield(earlier)
            record = await loop.run_in_executor(self._executor, build) if large else build()
            durable = self._submit(record)
        finally:
            handed_over.set_result(None)
            if self._encoding.get(name) is handed_over:
                del self._encoding[name]
        await durable

    def _submit(self, record: KeptRecord) -> asyncio.Future:
        if self._closed:
            raise LedgerClosedError(self.path)
        future = asyncio.get_running_loop().create_future()
        if self._held is not None:  # a file switch is in progress: wait behind it, in order
            self._held.append((record, future))
        elif self._stale:
            self._held = [(record, future)]
            self._task = asyncio.get_running_loop().create_task(self._switch())
        else:
            self._append(record, future)
        return future

    def _append(self, record: KeptRecord, future: asyncio.Future) -> None:
        live = self._file
        try:
            _pwrite_all(live.fd(), record.raw, self._size)
        except OSError as exc:
            future.set_exception(exc)
            return
        self._size += len(record.raw)
        # Pinned until its fsync is done: that fsync goes through the descriptor the write did, and sees its errors.
        self._group.add(live.pin(), (future, record, live))

    def _on_durable(self, items: list) -> None:
        for future, record, written_to in items:
            written_to.unpin()
            info = record.info
            if info.deleted:
                self._keep(info.name, ())
                if self._damaged:
                    self._known_deleted.add(info.name)
            else:
                self._keep(info.name, self._kept.get(info.name, ())[-1:] + (record,))
                self._known_deleted.discard(info.name)
            if self._carry is not None:
                self._carry.append(record.raw)
            if not future.done():
                future.set_result(None)
        self._maybe_compact()

    def _keep(self, name: str, kept: tuple[KeptRecord, ...]) -> None:
        self._kept_bytes += sum(len(k.raw) for k in kept) - sum(len(k.raw) for k in self._kept.get(name, ()))
        if kept:
            self._kept[name] = kept
        else:
            self._kept.pop(name, None)

    def _on_failure(self, exc: OSError, items: list) -> None:
        for future, _record, written_to in items:
            written_to.unpin()
            if not future.done():
                future.set_exception(exc)

    # ---- compaction

    def _maybe_compact(self) -> None:
        """Start a compaction once the log is mostly superseded records. The snapshot taken here is the durable
        state; records made durable from now on are carried over to the new file."""
        if self._size < COMPACT_MIN_BYTES or self._closed or self._task is not None or self._stale:
            return
        if self._size < 4 * self._kept_bytes:
            return
        parts = [marker_record()] if self._damaged else []
        parts += [frame(ManagedCursorInfo(name=n, deleted=True).SerializeToString())
                  for n in sorted(self._known_deleted - self._kept.keys())]
        parts += [k.raw for kept in self._kept.values() for k in kept]
        self._carry = []
        self._task = asyncio.get_running_loop().create_task(self._compact(parts))

    async def _compact(self, parts: list[bytes]) -> None:
        loop = asyncio.get_running_loop()
        tmp = f"{self.path}.tmp"
        try:
            try:
                await loop.run_in_executor(self._executor, _write_new_file, tmp, parts, self._durable)
                self._held = []
                await self._group.wait_idle()  # every record of the old file is durable (or failed)
                tail, self._carry = self._carry, None
                await loop.run_in_executor(self._executor, _finish_new_file, tmp, self.path, tail, self._durable)
            except Exception as exc:
                log.warning("cursor log %s: compaction failed, the old file stays live: %r", self.path, exc)
                self._carry = None
                _remove_quietly(tmp)
                self._release_held()
                return
            self._stale = True  # the path names the new file now; the old descriptor must not be written again
            await self._switch_now()
        finally:
            self._end_task()

    async def _switch(self) -> None:
        try:
            await self._switch_now()
        finally:
            self._end_task()

    def _end_task(self) -> None:
        self._task = None
        if self._held is not None:  # cancelled half way (the loop is stopping): nothing may wait forever
            self._fail_held(LedgerClosedError(self.path))

    async def _switch_now(self) -> None:
        """Write to the file the path names, once its directory entry is durable; then release the held records."""
        try:
            fd, size = await asyncio.get_running_loop().run_in_executor(
                self._executor, _open_live_file, self.path, self._durable)
        except Exception as exc:
            log.error("cursor log %s: cannot switch to the compacted file (%r); its records fail until it can",
                      self.path, exc)
            self._fail_held(exc)
            return
        self._file.close()
        self._file, self._size, self._stale = self._files.adopt(self.path, fd), size, False
        self._release_held()

    def _release_held(self) -> None:
        held, self._held = self._held or [], None
        for record, future in held:
            self._append(record, future)

    def _fail_held(self, exc: Exception) -> None:
        held, self._held = self._held or [], None
        for _record, future in held:
            if not future.done():
                future.set_exception(exc)

    async def close(self) -> None:
        self._closed = True
        if self._task is not None:
            await asyncio.shield(self._task)
        await self._group.wait_idle()
        if self._file is not None:
            self._file.close()
            self._file = None


def _state_record(name: str, position: Position, props: dict[str, int], strings: dict[str, str]) -> KeptRecord:
    info = ManagedCursorInfo(name=name, position=PositionInfo(
        ledgerId=position.ledger_id, entryId=position.entry_id,
        properties=[LongProperty(name=k, value=v) for k, v in props.items()],
        string_properties=[StringProperty(name=k, value=v) for k, v in strings.items()]))
    return KeptRecord(position, info, frame(info.SerializeToString()))


def _deletion_record(name: str) -> KeptRecord:
    info = ManagedCursorInfo(name=name, deleted=True)
    return KeptRecord(position_of(info), info, frame(info.SerializeToString()))


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    """Every write into the live cursor log goes through here (tests make it fail as a full disk would)."""
    append_at(fd, data, offset)


def _write_new_file(tmp: str, parts: list[bytes], durable: bool) -> None:
    write_synced(tmp, b"".join(parts), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, durable)


def _finish_new_file(tmp: str, path: str, tail: list[bytes], durable: bool) -> None:
    """Append the records made durable since the snapshot, then let the new file replace the log."""
    write_synced(tmp, b"".join(tail), os.O_WRONLY | os.O_APPEND, durable)
    os.replace(tmp, path)


def _open_live_file(path: str, durable: bool) -> tuple[int, int]:
    fd = os.open(path, os.O_RDWR)
    try:
        if durable:
            fsync_dir(os.path.dirname(path) or ".")
        return fd, os.fstat(fd).st_size
    except OSError:
        os.close(fd)
        raise


def _remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


__all__ = ["CursorLog", "ManagedCursor"]
