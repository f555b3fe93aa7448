"""Group commit: many writes share one fsync, and each completes only once an fsync covers it.

Writes go to the page cache at once (in submission order); a single flusher runs fsync in a worker thread for
everything written so far, then hands the covered writes back to the owner in order. While one fsync runs, new writes
queue up for the next one, so a slow disk batches more instead of queueing more fsyncs. Each managed ledger has its
own flusher, so one partition's slow fsync does not hold up another's acknowledgements.
"""
import asyncio
import errno
import os
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any


class GroupCommit:
    def __init__(
        self,
        executor: Executor | None,
        durable: bool,
        on_durable: Callable[[list[Any]], None],
        on_failure: Callable[[OSError, list[Any]], None],
        on_idle: Callable[[], None] | None = None,
    ) -> None:
        self._executor = executor
        self._durable = durable
        self._on_durable = on_durable
        self._on_failure = on_failure
        self._on_idle = on_idle  # called when everything written is durable, before any new write can start
        self._pending: list[tuple[int, Any]] = []
        self._flusher: asyncio.Task | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        self.injected_failures = 0  # test hook: fail the next N flushes as a disk would (EIO)

    def add(self, fd: int, item: Any) -> None:
        """Register a write already made to fd; item is handed to on_durable once it is on disk."""
        self._pending.append((fd, item))
        if self._flusher is None:
            self._idle.clear()
            self._flusher = asyncio.get_running_loop().create_task(self._flush_loop())

    @property
    def busy(self) -> bool:
        return self._flusher is not None

    async def wait_idle(self) -> None:
        await self._idle.wait()

    async def _flush_loop(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                fds = list(dict.fromkeys(fd for fd, _ in batch))
                try:
                    if self.injected_failures > 0:
                        self.injected_failures -= 1
                        raise OSError(errno.EIO, "injected write failure")
                    if self._durable:
                        await loop.run_in_executor(self._executor, _fsync_all, fds)
                except OSError as exc:
                    failed = [item for _, item in batch] + [item for _, item in self._pending]
                    self._pending = []
                    self._on_failure(exc, failed)
                    continue
                self._on_durable([item for _, item in batch])
                # Let the owners' completion callbacks run before the next flush can fail, so "durable" is always
                # reported before a later failure is.
                await asyncio.sleep(0)
            if self._on_idle is not None:
                self._on_idle()
        finally:
            self._flusher = None
            self._idle.set()


def _fsync_all(fds: list[int]) -> None:
    for fd in fds:
        os.fdatasync(fd)
