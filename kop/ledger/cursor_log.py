"""Cursors of one managed ledger, kept in an append-only cursor log.

Each mark-delete appends one ManagedCursorInfo record (name, position, properties) and completes after a group-committed
fsync, so position and properties are one atomic unit and thousands of commits share a few fsyncs. On open the latest
valid record of each cursor wins; a record that fails its CRC is skipped, so a corrupt latest record falls back to the
cursor's previous consistent (position, properties) pair rather than to a position with empty properties. The log is
compacted (rewritten with one record per cursor) when it grows well beyond its live content.
"""
import asyncio
import logging
import os
from collections.abc import Callable
from concurrent.futures import Executor

import crc32c

from kop.ledger.errors import CursorNotFoundError, InvalidMarkDeleteError, LedgerClosedError
from kop.ledger.framed_file import HEADER_SIZE, RECORD_HEADER, frame, replace_atomically, write_all
from kop.ledger.group_commit import GroupCommit
from kop.ledger.position import BEFORE_FIRST, Position
from proto.kop_pb2 import LongProperty, ManagedCursorInfo, PositionInfo, StringProperty

log = logging.getLogger(__name__)

MAX_CURSOR_RECORD = 64 * 1024 * 1024
COMPACT_MIN_BYTES = 4 * 1024 * 1024


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
                 last_confirmed: Callable[[], Position]) -> None:
        self.path = path
        self.last_confirmed = last_confirmed
        self.cursors: dict[str, ManagedCursor] = {}
        self._fd = -1
        self._size = 0
        self._closed = False
        self._durable_state: dict[str, ManagedCursorInfo] = {}  # the latest durable record of each live cursor
        self._group = GroupCommit(executor, durable, self._on_durable, self._on_failure, self._maybe_compact)

    def open(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        size = os.fstat(fd).st_size
        data = memoryview(os.pread(fd, size, 0))
        latest: dict[str, ManagedCursorInfo] = {}
        pos = 0
        while pos + HEADER_SIZE <= size:
            length, crc = RECORD_HEADER.unpack_from(data, pos)
            if length > MAX_CURSOR_RECORD or pos + HEADER_SIZE + length > size:
                break  # torn tail
            payload = data[pos + HEADER_SIZE: pos + HEADER_SIZE + length]
            pos += HEADER_SIZE + length
            info = _parse(payload, crc)
            if info is None:
                log.warning("cursor log %s: skipping a corrupt record at byte %d", self.path, pos)
                continue
            latest[info.name] = info
        if pos < size:
            os.ftruncate(fd, pos)
        self._fd, self._size = fd, pos
        for name, info in latest.items():
            if info.deleted:
                continue
            self._durable_state[name] = info
            p = info.position
            self.cursors[name] = ManagedCursor(
                self, name, Position(p.ledgerId, p.entryId),
                {lp.name: lp.value for lp in p.properties},
                {sp.name: sp.value for sp in p.string_properties})

    def open_cursor(self, name: str, initial: Position) -> ManagedCursor:
        cursor = self.cursors.get(name)
        if cursor is None:
            cursor = ManagedCursor(self, name, initial, {}, {})
            self.cursors[name] = cursor
        return cursor

    async def delete_cursor(self, name: str) -> None:
        if self.cursors.pop(name, None) is None:
            raise CursorNotFoundError(name)
        await self._write(ManagedCursorInfo(name=name, deleted=True))

    async def append(self, name: str, position: Position, props: dict[str, int], strings: dict[str, str]) -> None:
        info = ManagedCursorInfo(name=name, position=PositionInfo(
            ledgerId=position.ledger_id, entryId=position.entry_id,
            properties=[LongProperty(name=k, value=v) for k, v in props.items()],
            string_properties=[StringProperty(name=k, value=v) for k, v in strings.items()]))
        await self._write(info)

    async def _write(self, info: ManagedCursorInfo) -> None:
        if self._closed:
            raise LedgerClosedError(self.path)
        record = frame(info.SerializeToString())
        os.pwrite(self._fd, record, self._size)
        self._size += len(record)
        future = asyncio.get_running_loop().create_future()
        self._group.add(self._fd, (future, info))
        await future

    def _on_durable(self, items: list) -> None:
        for future, info in items:
            if info.deleted:
                self._durable_state.pop(info.name, None)
            else:
                self._durable_state[info.name] = info
            if not future.done():
                future.set_result(None)

    def _on_failure(self, exc: OSError, items: list) -> None:
        for future, _info in items:
            if not future.done():
                future.set_exception(exc)

    def _maybe_compact(self) -> None:
        """Rewrite the log as one record per live cursor once it is mostly superseded records. Runs only when
        every record written is durable and before any new one is, so the rewrite holds exactly the durable state."""
        if self._size < COMPACT_MIN_BYTES or self._closed:
            return
        live = b"".join(frame(info.SerializeToString()) for info in self._durable_state.values())
        if self._size < 4 * len(live):
            return
        replace_atomically(self.path, live)
        os.close(self._fd)
        self._fd = os.open(self.path, os.O_RDWR)
        self._size = len(live)

    async def close(self) -> None:
        self._closed = True
        await self._group.wait_idle()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _parse(payload: memoryview, crc: int) -> ManagedCursorInfo | None:
    if crc32c.crc32c(payload) != crc:
        return None
    info = ManagedCursorInfo()
    try:
        info.ParseFromString(bytes(payload))
    except Exception:  # a CRC-valid but undecodable record: treat as corrupt
        return None
    return info


__all__ = ["CursorLog", "ManagedCursor", "BEFORE_FIRST", "write_all"]
