"""Group commit for the PostgreSQL engine: writes submitted while one commit is in flight go together in the next.

One flusher task per batcher; `flush(items)` performs one round trip for all of them. A slow database therefore
batches more instead of queueing more round trips, as the file engine's group fsync does.
"""
import asyncio
from collections.abc import Awaitable, Callable
from typing import Any


class Batcher:
    def __init__(self, flush: Callable[[list[Any]], Awaitable[None]]) -> None:
        self._flush = flush
        self._pending: list[Any] = []
        self._flusher: asyncio.Task | None = None
        self._idle = asyncio.Event()
        self._idle.set()

    def add(self, item: Any) -> None:
        self._pending.append(item)
        if self._flusher is None:
            self._idle.clear()
            self._flusher = asyncio.get_running_loop().create_task(self._run())

    def take_pending(self) -> list[Any]:
        """Everything submitted but not yet handed to a flush (a failure fails these too)."""
        taken, self._pending = self._pending, []
        return taken

    async def wait_idle(self) -> None:
        await self._idle.wait()

    async def _run(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                await self._flush(batch)
        finally:
            self._flusher = None
            self._idle.set()
