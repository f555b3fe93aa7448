"""The managed ledger as the dedup core sees it (dedup.interfaces.DedupLedger): the `pulsar.dedup` cursor and a
replay of the entries after its mark-delete.

The replay also covers the writes already handed to the ledger when it reaches the end: it waits for them to land
(or fail) and reads on. Batches accepted before dedup was enabled at run time are then part of the state the
partition starts from, so a retry of one still in flight is recognised, not stored again."""
import asyncio
from collections.abc import AsyncIterator

from dedup.interfaces import ReplayEntry
from kop.ledger import CursorNotFoundError, ManagedLedger, Position
from proto.kop_pb2 import MessageMetadata

REPLAY_BATCH = 100  # entries per read, as Pulsar's replay task ...
REPLAY_BYTES = 1 << 20  # ... and bytes (the first entry whatever its size): 100 batches of 1 MB are not read at once


class LedgerDedupStorage:
    def __init__(self, ledger: ManagedLedger) -> None:
        self._ledger = ledger
        self._changed = asyncio.Event()  # set when writes land or fail
        ledger.add_confirm_listener(self._changed.set)
        ledger.add_failure_listener(lambda _error: self._changed.set())

    async def open_cursor(self, name: str):
        cursor = self._ledger.cursors.get(name)
        if cursor is None:
            # A new dedup cursor starts at the end of the log (Pulsar's runtime enable). One the cursor log may
            # have lost (damage destroyed its records) is opened before the first entry instead: with its snapshot
            # gone, only replaying everything still stored rebuilds the state.
            cursor = self._ledger.open_cursor(name, self._ledger.last_confirmed)
        elif cursor.is_durable:
            return cursor
        # Made durable before use, where it stands: were it only in memory, a crash before the first snapshot would
        # bring it back "at the end" of a longer log and skip the replay it needs. A cursor whose first write failed
        # is still only in memory, at the position it was opened at: the retried recovery writes it there.
        await cursor.reset(cursor.mark_delete_position, {})
        return cursor

    async def delete_cursor(self, name: str) -> None:
        try:
            await self._ledger.delete_cursor(name)
        except CursorNotFoundError:
            pass

    async def replay_after(self, position) -> AsyncIterator[ReplayEntry]:
        after = Position(*position)
        waited = False
        while True:
            entries = await self._ledger.read_after_async(after, REPLAY_BATCH, REPLAY_BYTES)
            if not entries:
                if waited or not await self._writes_in_flight_landed():
                    return
                waited = True  # once: writes accepted from now on are not the replay's (dedup is recovering)
                continue
            for entry in entries:
                metadata = MessageMetadata()
                metadata.ParseFromString(entry.metadata)
                yield ReplayEntry(entry.position, metadata, entry.first_index, entry.first_index + entry.span - 1)
            after = entries[-1].position
            await asyncio.sleep(0)  # let the broker serve others during a long replay

    async def _writes_in_flight_landed(self) -> bool:
        """Wait until the writes handed to the ledger so far are durable or failed; False if there were none."""
        ledger = self._ledger
        target = ledger.written_end_index
        if ledger.confirmed_end_index >= target:
            return False
        while ledger.confirmed_end_index < target <= ledger.written_end_index:  # a failure lowers written_end
            self._changed.clear()
            await self._changed.wait()
        return True
