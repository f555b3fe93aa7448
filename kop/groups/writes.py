"""Group state written to the generation log (kop/groups/generations.py) in the order of its changes, each answer
after a write that holds its change.

A group's changes made while one of its writes is in flight go out together in its next write: the record holds the
whole group and is made when it is written, so a rebalance of many members costs a few writes, not one per member,
and a change costs nothing until it is written.
"""
import asyncio
import logging
from collections.abc import Awaitable, Callable

from proto.kop_pb2 import GroupGeneration

log = logging.getLogger(__name__)

MakeRecord = Callable[[], GroupGeneration | None]


class GroupWrites:
    def __init__(self, record: Callable[[GroupGeneration], Awaitable[None]]) -> None:
        """record(r): append r durably (the generation log's)."""
        self._record = record
        self._unwritten: dict[str, MakeRecord] = {}  # group id -> what makes its record, not being written yet
        self._next: dict[str, asyncio.Future] = {}  # group id -> True once that record is durable (False: failed)
        self._in_flight: dict[str, asyncio.Future] = {}  # group id -> the same, of the record being written
        self._writers: dict[str, asyncio.Task] = {}  # group id -> what writes its records, while it has any

    def write(self, group_id: str, make: MakeRecord) -> None:
        """make(): the group's record, made when it is written (so it holds every change made until then); None:
        nothing to write any more (the group was deleted, or changed kind and was recorded as its new kind)."""
        self._unwritten[group_id] = make
        loop = asyncio.get_running_loop()
        if group_id not in self._next:
            self._next[group_id] = loop.create_future()
        if group_id not in self._writers:
            self._writers[group_id] = loop.create_task(self._write_group(group_id))

    async def _write_group(self, group_id: str) -> None:
        try:
            while group_id in self._unwritten:
                make = self._unwritten.pop(group_id)
                done = self._in_flight[group_id] = self._next.pop(group_id)
                try:
                    record = make()
                    if record is not None:
                        await self._record(record)
                    done.set_result(True)
                except Exception as exc:  # whatever the engine raised: the members waiting are told
                    log.error("group %s: could not store its state: %s", group_id, exc)
                finally:
                    del self._in_flight[group_id]
                    if not done.done():
                        done.set_result(False)
        finally:
            del self._writers[group_id]  # with no await since the last check: a change after it starts a writer

    def _latest(self, group_id: str) -> asyncio.Future | None:
        return self._next.get(group_id) or self._in_flight.get(group_id)

    async def stored(self, group_id: str) -> bool:
        """Wait until the group's latest change is durable; False if its write failed."""
        latest = self._latest(group_id)
        return True if latest is None else await asyncio.shield(latest)

    def when_stored(self, group_id: str, result, failed) -> asyncio.Future:
        """A future of `result` once the group's latest change is durable (`failed` if it could not be written)."""
        future = asyncio.get_running_loop().create_future()
        latest = self._latest(group_id)
        if latest is None:
            future.set_result(result)
            return future

        def done(finished: asyncio.Future) -> None:
            if not future.done():
                future.set_result(result if not finished.cancelled() and finished.result() else failed)
        latest.add_done_callback(done)
        return future

    def pending(self) -> list[asyncio.Task]:
        return list(self._writers.values())
