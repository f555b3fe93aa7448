"""The broker's fsync threads, shared by every ledger: an fsync costs the event loop no task, future or pool hand-off.

The loop queues a flush (the files to sync and what to call when they are synced); a flusher thread takes it, syncs
its files, and queues the outcome for the loop. Outcomes are handed back in batches: the first one queued schedules a
single `call_soon_threadsafe`, and every outcome queued before that callback runs goes with it. Both queues are
`queue.SimpleQueue` (C): a Condition's Python-level wait and notify were a tenth of the loop's work per flush. Each thread syncs one
ledger's flush at a time and up to `threads` run at once, so the partitions' fsyncs overlap as they did in a thread
pool, while new writes queue for each ledger's next flush. Before, each partition's flush was its own
`run_in_executor` (a pool future, then an asyncio future and a task woken per flush); with many partitions flushing at
once that hand-off, not the fsync, was most of the broker's CPU per acknowledgement.
"""
import asyncio
import logging
import os
import queue
import threading
from collections.abc import Callable

# What to call on the loop with None, or the OSError that failed the flush.
Done = Callable[[OSError | None], None]
log = logging.getLogger(__name__)
THREADS = 8  # at most this many fsyncs at once (one slow partition does not hold up the others)
_STOP = None  # a thread that takes this from the queue ends


class Flusher:
    def __init__(self, threads: int = THREADS, name: str = "fsync") -> None:
        self._name = name
        self._max_threads = threads
        # The queues are C-level (SimpleQueue): handing a job over or back takes no Python-level lock or condition,
        # so the event loop pays a put per flush and a flusher thread holds the GIL only to take a job and return
        # its outcome.
        self._jobs: queue.SimpleQueue[tuple[list[int], Done] | None] = queue.SimpleQueue()
        self._outcomes: queue.SimpleQueue[tuple[Done, OSError | None]] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._scheduled = False  # a callback is due on the loop to complete the outcomes queued

    def submit(self, fds: list[int], done: Done) -> None:
        """fdatasync each of fds in a flusher thread, then call done(None or the error) on this event loop. The
        descriptors must stay open until then (the ledger pins them)."""
        if self._stopping:
            raise RuntimeError("the flusher is stopped")
        self._loop = asyncio.get_running_loop()
        self._jobs.put((fds, done))
        # A job no thread has taken yet: another thread, up to the limit (idle ones wait on the queue)
        if len(self._threads) < self._max_threads and not self._jobs.empty():
            thread = threading.Thread(target=self._run, name=f"{self._name}-{len(self._threads)}", daemon=True)
            self._threads.append(thread)
            thread.start()

    def stop(self) -> None:
        """Sync what is queued, then end the threads (the broker stops)."""
        self._stopping = True
        threads = list(self._threads)
        for _ in threads:
            self._jobs.put(_STOP)
        for thread in threads:
            thread.join()

    def _run(self) -> None:
        jobs, outcomes = self._jobs, self._outcomes
        while (job := jobs.get()) is not _STOP:
            fds, done = job
            error = None
            try:
                for fd in fds:
                    os.fdatasync(fd)
            except OSError as exc:
                error = exc
            outcomes.put((done, error))
            if not self._scheduled:  # the first outcome since the loop's last callback asks for the next one
                self._scheduled = True
                try:
                    self._loop.call_soon_threadsafe(self._complete)
                except RuntimeError:  # the loop is closed: nobody waits for these any more
                    pass

    def _complete(self) -> None:
        self._scheduled = False  # before taking them: an outcome queued from now on schedules another callback
        outcomes = self._outcomes
        while not outcomes.empty():
            done, error = outcomes.get_nowait()
            try:
                done(error)
            except Exception:  # one ledger's bug must not keep the others' writes from completing
                log.exception("completing a flush failed")
