"""The broker's fsync threads, shared by every ledger: an fsync costs the event loop no task, future or pool hand-off.

The loop queues a flush (the files to sync and what to call when they are synced); a flusher thread takes it, syncs
its files, and queues the outcome for the loop. Outcomes are handed back in batches: the first one queued schedules a
single `call_soon_threadsafe`, and every outcome queued before that callback runs goes with it. Each thread syncs one
ledger's flush at a time and up to `threads` run at once, so the partitions' fsyncs overlap as they did in a thread
pool, while new writes queue for each ledger's next flush. Before, each partition's flush was its own
`run_in_executor` (a pool future, then an asyncio future and a task woken per flush); with many partitions flushing at
once that hand-off, not the fsync, was most of the broker's CPU per acknowledgement.
"""
import asyncio
import logging
import os
import threading
from collections import deque
from collections.abc import Callable

# What to call on the loop with None, or the OSError that failed the flush.
Done = Callable[[OSError | None], None]
log = logging.getLogger(__name__)
THREADS = 8  # at most this many fsyncs at once (one slow partition does not hold up the others)


class Flusher:
    def __init__(self, threads: int = THREADS, name: str = "fsync") -> None:
        self._name = name
        self._max_threads = threads
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._jobs: deque[tuple[list[int], Done]] = deque()
        self._threads: list[threading.Thread] = []
        self._idle = 0  # threads waiting for a job
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._outcomes: list[tuple[Done, OSError | None]] = []  # synced, waiting for the loop's callback

    def submit(self, fds: list[int], done: Done) -> None:
        """fdatasync each of fds in a flusher thread, then call done(None or the error) on this event loop. The
        descriptors must stay open until then (the ledger pins them)."""
        with self._lock:
            if self._stopping:
                raise RuntimeError("the flusher is stopped")
            self._loop = asyncio.get_running_loop()
            self._jobs.append((fds, done))
            if self._idle:
                self._work.notify()
            elif len(self._threads) < self._max_threads:
                thread = threading.Thread(target=self._run, name=f"{self._name}-{len(self._threads)}", daemon=True)
                self._threads.append(thread)
                thread.start()

    def stop(self) -> None:
        """Sync what is queued, then end the threads (the broker stops)."""
        with self._lock:
            self._stopping = True
            self._work.notify_all()
            threads = list(self._threads)
        for thread in threads:
            thread.join()

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._jobs and not self._stopping:
                    self._idle += 1
                    self._work.wait()
                    self._idle -= 1
                if not self._jobs:
                    return
                fds, done = self._jobs.popleft()
            error = None
            try:
                for fd in fds:
                    os.fdatasync(fd)
            except OSError as exc:
                error = exc
            with self._lock:
                self._outcomes.append((done, error))
                first, loop = len(self._outcomes) == 1, self._loop
            if first:
                try:
                    loop.call_soon_threadsafe(self._complete)
                except RuntimeError:  # the loop is closed: nobody waits for these any more
                    pass

    def _complete(self) -> None:
        with self._lock:
            outcomes, self._outcomes = self._outcomes, []
        for done, error in outcomes:
            try:
                done(error)
            except Exception:  # one ledger's bug must not keep the others' writes from completing
                log.exception("completing a flush failed")
