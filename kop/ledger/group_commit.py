"""Group commit: many writes share one fsync, and each completes only once an fsync covers it.

Writes go to the page cache at once (in submission order); a flush syncs everything written so far, then hands the
covered writes back to the owner in order. While one flush runs, new writes queue up for the next one, so a slow disk
batches more instead of queueing more fsyncs. Each managed ledger has its own group commit, so one partition's slow
fsync does not hold up another's acknowledgements; the fsyncs themselves run in the broker's flusher threads
(`flusher`), which hand their outcomes back to the event loop in batches. A held flush (a failpoint) goes to a pool
thread of its own instead. A flush is a callback scheduled on the event loop, not a task: with fsync off (or between
fsyncs) completing a write costs no coroutine.

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

from kop.ledger.flusher import Flusher


class GroupCommit:
    def __init__(
        self,
        executor: Executor | None,
        durable: bool,
        on_durable: Callable[[list[Any]], None],
        on_failure: Callable[[OSError, list[Any]], None],
        observer: Callable[[float, int], None] | None = None,
        flusher: Flusher | None = None,
    ) -> None:
        """observer(seconds, entries): told of every successful flush, how long it took and how many writes it
        made durable (the broker's metrics). flusher: the broker's fsync threads; without one, each fsync runs in
        `executor` (tools and tests that open a ledger by itself)."""
        self._executor = executor
        self._flusher = flusher
        self._durable = durable
        self._on_durable = on_durable
        self._on_failure = on_failure
        self._observer = observer
        self._pending: list[tuple[int, Any]] = []
        self._failure: OSError | None = None  # a write failed before reaching the file: it and all later ones fail
        self._failed_from = 0  # index in _pending of that write
        self._scheduled = False  # a flush is due on the event loop
        self._flushing: list[tuple[int, Any]] | None = None  # the writes of the flush under way
        self._idle_waiters: list[asyncio.Future] = []  # wait_idle's
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
        if not self._scheduled and self._flushing is None:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    async def wait_idle(self) -> None:
        """Until nothing is written but not yet flushed."""
        while self._scheduled or self._flushing is not None or self._pending:
            waiter = asyncio.get_running_loop().create_future()
            self._idle_waiters.append(waiter)
            await waiter

    def _now_idle(self) -> None:
        waiters, self._idle_waiters = self._idle_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _flush(self) -> None:
        self._scheduled = False
        if not self._pending:
            self._now_idle()
            return
        batch, self._pending = self._pending, []
        # A failure registered while this batch is flushed belongs to the next one.
        cut = self._failed_from if self._failure is not None else len(batch)
        good = batch[:cut]
        self._flushing = batch
        started = time.perf_counter()
        if not good:
            return self._flushed(cut, started, None)
        if self.injected_failures > 0:
            self.injected_failures -= 1
            return self._flushed(cut, started, OSError(errno.EIO, "injected write failure"))
        fds = list({fd: None for fd, _ in good})
        if not self.released.is_set() or (self._durable and self._flusher is None):
            # held (a failpoint), or no flusher: a pool thread of its own, so a stuck flush holds up no other ledger
            future = asyncio.get_running_loop().run_in_executor(self._executor, _fsync_all, fds, self._durable,
                                                                self.released)
            future.add_done_callback(lambda f: self._flushed(cut, started, f.exception()))
        elif self._durable:
            self._flusher.submit(fds, lambda error: self._flushed(cut, started, error))
        else:
            self._flushed(cut, started, None)

    def _flushed(self, cut: int, started: float, error: BaseException | None) -> None:
        batch, self._flushing = self._flushing, None
        good = batch[:cut] if error is None else []
        if good:
            if self._observer is not None:
                self._observer(time.perf_counter() - started, len(good))
            self._on_durable([item for _, item in good])
        failure = error if isinstance(error, OSError) or error is None else OSError(errno.EIO, str(error))
        if failure is None and cut < len(batch):
            failure = self._failure
        if failure is not None:
            failed = [item for _, item in batch[len(good):]] + [item for _, item in self._pending]
            self._pending, self._failure = [], None
            self._on_failure(failure, failed)
        # The next flush is a callback after those the completions above scheduled, so "durable" is always reported
        # before a later failure is.
        if self._pending:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)
        elif self._idle_waiters:
            self._now_idle()


HOLD_LIMIT_SECONDS = 120  # a held flush goes on by itself after this, so a forgotten hold cannot wedge a broker


def _fsync_all(fds: list[int], durable: bool, released: threading.Event) -> None:
    released.wait(HOLD_LIMIT_SECONDS)
    if durable:
        for fd in fds:
            os.fdatasync(fd)
