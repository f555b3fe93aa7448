"""The managed ledger as the dedup core sees it (dedup.interfaces.DedupLedger): the `pulsar.dedup` cursor and a
replay of the entries after its mark-delete."""
import asyncio
from collections.abc import AsyncIterator

from dedup.interfaces import ReplayEntry
from kop.ledger import CursorNotFoundError, ManagedLedger, Position
from proto.kop_pb2 import MessageMetadata

REPLAY_BATCH = 100  # entries per read, as Pulsar's replay task


class LedgerDedupStorage:
    def __init__(self, ledger: ManagedLedger) -> None:
        self._ledger = ledger

    async def open_cursor(self, name: str):
        existing = self._ledger.cursors.get(name)
        if existing is not None:
            return existing
        # A new dedup cursor starts at the end of the log, and is made durable at once: were it only in memory,
        # a crash before the first snapshot would bring it back "at the end" and skip the replay it needs.
        cursor = self._ledger.open_cursor(name, self._ledger.last_confirmed)
        await cursor.reset(self._ledger.last_confirmed, {})
        return cursor

    async def delete_cursor(self, name: str) -> None:
        try:
            await self._ledger.delete_cursor(name)
        except CursorNotFoundError:
            pass

    async def replay_after(self, position) -> AsyncIterator[ReplayEntry]:
        after = Position(*position)
        while True:
            entries = self._ledger.read_after(after, REPLAY_BATCH)
            if not entries:
                return
            for entry in entries:
                metadata = MessageMetadata()
                metadata.ParseFromString(entry.metadata)
                yield ReplayEntry(entry.position, metadata, entry.first_index, entry.first_index + entry.span - 1)
            after = entries[-1].position
            await asyncio.sleep(0)  # let the broker serve others during a long replay
