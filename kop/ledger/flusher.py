"""One thread that fsyncs for every ledger of a broker, so an fsync costs the event loop no thread hop of its own.

The loop queues a flush (the files to sync and what to call when they are synced); the thread takes every flush
queued since its last round, syncs each, and hands the whole round back to the loop with one `call_soon_threadsafe`.
While it syncs, new flushes queue for the next round: a slow disk batches more rather than queueing more work. Before,
each partition's flush was its own `run_in_executor` (a pool thread's wake-up and a future chained back per flush);
with many partitions flushing at once that hand-off, not the fsync, was most of the broker's CPU per acknowledgement.
"""
import asyncio
import logging
import os
import threading
from collections.abc import Callable

# (the files to sync, what to call on the loop with None or the OSError that failed them)
Done = Callable[[OSError | None], None]
log = logging.getLogger(__name__)


class Flusher:
    def __init__(self, name: str = "fsync") -> None:
        self._name = name
        self._queue: list[tuple[asyncio.AbstractEventLoop, list[int], Done]] = []
        self._cond = threading.Condition(threading.Lock())
        self._thread: threading.Thread | None = None
        self._stopping = False

    def submit(self, fds: list[int], done: Done) -> None:
        """fdatasync each of fds in the flusher's thread, then call done(None or the error) on this event loop.
        The descriptors must stay open until then (the ledger pins them)."""
        job = (asyncio.get_running_loop(), fds, done)
        with self._cond:
            if self._stopping:
                raise RuntimeError("the flusher is stopped")
            self._queue.append(job)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            elif len(self._queue) == 1:
                self._cond.notify()

    def stop(self) -> None:
        """Sync what is queued, then end the thread (the broker stops)."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
            thread = self._thread
        if thread is not None:
            thread.join()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stopping:
                    self._cond.wait()
                if not self._queue:
                    return
                jobs, self._queue = self._queue, []
            by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Done, OSError | None]]] = {}
            for loop, fds, done in jobs:
                error = None
                try:
                    for fd in fds:
                        os.fdatasync(fd)
                except OSError as exc:
                    error = exc
                by_loop.setdefault(loop, []).append((done, error))
            for loop, outcomes in by_loop.items():
                try:
                    loop.call_soon_threadsafe(_complete, outcomes)
                except RuntimeError:  # that loop is closed: nobody waits for these any more
                    pass


def _complete(outcomes: list[tuple[Done, OSError | None]]) -> None:
    for done, error in outcomes:
        try:
            done(error)
        except Exception:  # one ledger's bug must not keep the others' writes from completing
            log.exception("completing a flush failed")
