"""Group commit: many writes share one fsync, and each completes only once an fsync covers it.

Writes go to the page cache at once (in submission order); a single flusher runs fsync in a worker thread for
everything written so far, then hands the covered writes back to the owner in order. While one fsync runs, new writes
queue up for the next one, so a slow disk batches more instead of queueing more fsyncs. Each managed ledger has its
own flusher, so one partition's slow fsync does not hold up another's acknowledgements.

A write that fails before it reaches the file (`fail`) is reported in log order: the writes before it are flushed
and completed first, then it and every write after it go to `on_failure` together, as a failed fsync's do.

`on_durable` and `on_failure` must not raise: an exception ends the flusher with the writes it was handing back
never answered (and the owner waiting on them for ever).
"""
import asyncio
import errno
import os
import threading
import time
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
        observer: Callable[[float, int], None] | None = None,
    ) -> None:
        """observer(seconds, entries): told of every successful flush, how long it took and how many writes it
        made durable (the broker's metrics)."""
        self._executor = executor
        self._durable = durable
        self._on_durable = on_durable
        self._on_failure = on_failure
        self._observer = observer
        self._pending: list[tuple[int, Any]] = []
        self._failure: OSError | None = None  # a write failed before reaching the file: it and all later ones fail
        self._failed_from = 0  # index in _pending of that write
        self._flusher: asyncio.Task | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        # Failpoints (FileManagedLedger.inject_write_failures / hold_flushes, behind the admin API's
        # adminFailpointsEnabled): fail the next N flushes as a disk would (EIO); while `released` is clear, flushes
        # stall in their thread as on a stuck disk.
        self.injected_failures = 0
        self.released = threading.Event()
        self.released.set()

    def add(self, fd: int, item: Any) -> None:
        """Register a write already made to fd; item is handed to on_durable once it is on disk."""
        self._pending.append((fd, item))
        self._wake()

    def fail(self, exc: OSError, item: Any) -> None:
        """Register a write that failed before reaching its file; it fails, with every write registered after it,
        once the writes registered before it are durable."""
        if self._failure is None:
            self._failure, self._failed_from = exc, len(self._pending)
        self._pending.append((-1, item))
        self._wake()

    @property
    def failing(self) -> bool:
        """A failure is registered and not yet reported: a write now would only fail with it."""
        return self._failure is not None

    def _wake(self) -> None:
        if self._flusher is None:
            self._idle.clear()
            self._flusher = asyncio.get_running_loop().create_task(self._flush_loop())

    async def wait_idle(self) -> None:
        await self._idle.wait()

    async def _flush_loop(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                # A failure registered while this batch is flushed belongs to the next one.
                cut = self._failed_from if self._failure is not None else len(batch)
                good, failure = batch[:cut], None
                try:
                    if good:
                        started = time.perf_counter()
                        await self._flush({fd: None for fd, _ in good})
                        if self._observer is not None:
                            self._observer(time.perf_counter() - started, len(good))
                except OSError as exc:
                    failure, good = exc, []
                if good:
                    self._on_durable([item for _, item in good])
                    # Let the owners' completion callbacks run before the next flush can fail, so "durable" is
                    # always reported before a later failure is.
                    await asyncio.sleep(0)
                if failure is None and cut < len(batch):
                    failure = self._failure
                if failure is not None:
                    failed = [item for _, item in batch[len(good):]] + [item for _, item in self._pending]
                    self._pending, self._failure = [], None
                    self._on_failure(failure, failed)
        finally:
            self._flusher = None
            self._idle.set()

    async def _flush(self, fds: dict[int, None]) -> None:
        if self.injected_failures > 0:
            self.injected_failures -= 1
            raise OSError(errno.EIO, "injected write failure")
        if self._durable or not self.released.is_set():
            await asyncio.get_running_loop().run_in_executor(self._executor, _fsync_all, list(fds), self._durable,
                                                             self.released)


HOLD_LIMIT_SECONDS = 120  # a held flush goes on by itself after this, so a forgotten hold cannot wedge a broker


def _fsync_all(fds: list[int], durable: bool, released: threading.Event) -> None:
    released.wait(HOLD_LIMIT_SECONDS)
    if durable:
        for fd in fds:
            os.fdatasync(fd)
