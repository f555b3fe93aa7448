"""An in-memory DedupLedger: the storage Protocols' rules in a few lines, for tests and examples.

It is what survives a simulated crash: the durable entries and the cursors. It holds no dedup state of its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from dedup.interfaces import BEFORE_FIRST, Position, ReplayEntry
from proto.kop_pb2 import MessageMetadata


class InMemoryCursor:
    def __init__(self, ledger: InMemoryDedupLedger, position: Position) -> None:
        self._ledger = ledger
        self.mark_delete_position: Position = position
        self.properties: dict[str, int] = {}
        self.string_properties: dict[str, str] = {}
        self.mark_deletes = 0  # how many were stored, for tests

    async def mark_delete(self, position: Position, properties: dict[str, int],
                          string_properties: dict[str, str] | None = None) -> None:
        await asyncio.sleep(0)  # a real write yields; a crash may come before it lands
        if position < self.mark_delete_position:
            raise ValueError(f"mark-delete backwards: {position} < {self.mark_delete_position}")
        if position > self._ledger.last_position:
            raise ValueError(f"mark-delete past the last entry: {position} > {self._ledger.last_position}")
        # Position and properties change together: one record.
        self.mark_delete_position, self.properties = position, dict(properties)
        if string_properties is not None:
            self.string_properties = dict(string_properties)
        self.mark_deletes += 1


class InMemoryDedupLedger:
    def __init__(self) -> None:
        self.entries: list[ReplayEntry] = []
        self.cursors: dict[str, InMemoryCursor] = {}
        self._ledger_id = 0
        self._next_entry_id = 0

    @property
    def last_position(self) -> Position:
        return self.entries[-1].position if self.entries else BEFORE_FIRST

    def append(self, metadata: MessageMetadata, first_offset: int, last_offset: int) -> Position:
        """Store an entry durably; returns its position."""
        position = (self._ledger_id, self._next_entry_id)
        self._next_entry_id += 1
        self.entries.append(ReplayEntry(position, metadata, first_offset, last_offset))
        return position

    def roll(self) -> None:
        """Start a new ledger, as a restart or a failed write does."""
        self._ledger_id += 1
        self._next_entry_id = 0

    async def open_cursor(self, name: str) -> InMemoryCursor:
        if name not in self.cursors:
            self.cursors[name] = InMemoryCursor(self, self.last_position)
        return self.cursors[name]

    async def delete_cursor(self, name: str) -> None:
        self.cursors.pop(name, None)

    async def replay_after(self, position: Position) -> AsyncIterator[ReplayEntry]:
        index = 0
        while index < len(self.entries):
            entry = self.entries[index]
            index += 1
            if entry.position > position:
                yield entry
