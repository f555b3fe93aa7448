"""Cursors of a managed ledger stored in PostgreSQL: one kop_cursor row per cursor (ManagedCursorInfo: position and
properties together), upserted in the owner's fenced transaction. Mark-deletes of all of a ledger's cursors share one
round trip while one is in flight, and complete in submission order."""
import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from kop.ledger.errors import CursorNotFoundError, InvalidMarkDeleteError, LedgerClosedError
from kop.ledger.position import Position
from kop.ledger.postgres.batcher import Batcher
from proto.kop_pb2 import LongProperty, ManagedCursorInfo, PositionInfo, StringProperty


class PgCursor:
    """A named position with properties that move together (the file engine's ManagedCursor, stored in a row)."""

    def __init__(self, cursors: "PgCursors", name: str, position: Position, properties: dict[str, int],
                 string_properties: dict[str, str], durable: bool) -> None:
        self._cursors = cursors
        self.name = name
        self.mark_delete_position = position
        self.properties = properties
        self.string_properties = string_properties
        self.is_durable = durable
        self._submitted = position

    @property
    def recovery_floor(self) -> Position:
        """A restart brings the cursor back to exactly its stored row: nothing earlier needs keeping for it."""
        return self.mark_delete_position

    async def mark_delete(self, position: Position, properties: dict[str, int] | None = None,
                          string_properties: dict[str, str] | None = None) -> None:
        position = Position(*position)
        if position < self._submitted:
            raise InvalidMarkDeleteError(f"cursor {self.name}: {position} is before {self._submitted}")
        await self.reset(position, properties, string_properties)

    async def reset(self, position: Position, properties: dict[str, int] | None = None,
                    string_properties: dict[str, str] | None = None) -> None:
        position = Position(*position)
        if position > self._cursors.last_confirmed():
            raise InvalidMarkDeleteError(f"cursor {self.name}: {position} is past the last confirmed entry")
        props = dict(properties) if properties is not None else dict(self.properties)
        strings = dict(string_properties) if string_properties is not None else dict(self.string_properties)
        self._submitted = position
        await self._cursors.write(encode_cursor(self.name, position, props, strings))
        self.mark_delete_position, self.properties, self.string_properties = position, props, strings
        self.is_durable = True


@dataclass(slots=True)
class _Write:
    name: str
    info: bytes | None  # None: delete the cursor
    future: asyncio.Future


class PgCursors:
    def __init__(self, last_confirmed: Callable[[], Position],
                 store_rows: Callable[[list[tuple[str, bytes | None]]], Awaitable[None]]) -> None:
        self.last_confirmed = last_confirmed
        self.cursors: dict[str, PgCursor] = {}
        self._store_rows = store_rows
        self._batcher = Batcher(self._flush)
        self._closed = False

    def load(self, rows: list[bytes]) -> None:
        for row in rows:
            info = ManagedCursorInfo.FromString(row)
            position = Position(info.position.ledgerId, info.position.entryId)
            self.cursors[info.name] = PgCursor(
                self, info.name, position, {p.name: p.value for p in info.position.properties},
                {p.name: p.value for p in info.position.string_properties}, durable=True)

    def open_cursor(self, name: str, initial: Position) -> PgCursor:
        cursor = self.cursors.get(name)
        if cursor is None:
            cursor = self.cursors[name] = PgCursor(self, name, initial, {}, {}, durable=False)
        return cursor

    async def delete_cursor(self, name: str) -> None:
        if self.cursors.pop(name, None) is None:
            raise CursorNotFoundError(name)
        await self._submit(name, None)

    async def write(self, info: tuple[str, bytes]) -> None:
        await self._submit(*info)

    async def _submit(self, name: str, info: bytes | None) -> None:
        if self._closed:
            raise LedgerClosedError(name)
        future = asyncio.get_running_loop().create_future()
        self._batcher.add(_Write(name, info, future))
        await future

    async def _flush(self, writes: list[_Write]) -> None:
        latest = {w.name: w.info for w in writes}  # rows are replaced whole: the last write of each cursor wins
        try:
            await self._store_rows(list(latest.items()))
        except Exception as exc:  # noqa: BLE001 - any failure (connection lost, fenced) fails these writes
            for w in writes:
                if not w.future.done():
                    w.future.set_exception(exc)
            return
        for w in writes:
            if not w.future.done():
                w.future.set_result(None)

    async def close(self) -> None:
        self._closed = True
        await self._batcher.wait_idle()


def encode_cursor(name: str, position: Position, props: dict[str, int], strings: dict[str, str]) -> tuple[str, bytes]:
    info = ManagedCursorInfo(name=name, position=PositionInfo(
        ledgerId=position.ledger_id, entryId=position.entry_id,
        properties=[LongProperty(name=k, value=v) for k, v in props.items()],
        string_properties=[StringProperty(name=k, value=v) for k, v in strings.items()]))
    return name, info.SerializeToString()
