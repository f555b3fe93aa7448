"""The log cleaner: compacts the partitions of topics whose cleanup.policy has `compact`, as Kafka's LogCleaner
does, one partition at a time.

A partition's cleanable range is its closed ledgers, oldest first, up to the first one that closed less than
min.compaction.lag.ms ago (the current ledger is never cleaned: a record becomes cleanable once its ledger rolls, by
segment.bytes, segment.ms or max.compaction.lag.ms). The ledgers after the last one cleaned are the dirty section;
the partition is cleaned when dirty bytes / cleanable bytes reach min.cleanable.dirty.ratio, or when its oldest dirty
ledger closed max.compaction.lag.ms ago (selection.py). The reading and rewriting (kop/compaction/rewrite.py) happen
off the event loop: for the file engine in the cleaner's own process, so it does not even share the interpreter lock;
for the PostgreSQL engine, whose entries are in the broker's memory, in a thread. The event loop only installs the
finished rewrites and records how far the cleaner got: two renames each and the ledger list (file engine), or one
fenced transaction that stores the changed entries and the cleaned-through point together (PostgreSQL).
"""
import asyncio
import contextlib
import ctypes
import logging
import multiprocessing
import signal
import threading
import uuid
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import replace
from typing import TYPE_CHECKING

from kop import clock
from kop.compaction.rewrite import CleanerStopped, CompactionJob, CompactionResult, LedgerChanged, compact
from kop.compaction.selection import select
from kop.compaction.settings import CompactionSettings
from kop.compaction.stats import CleanerStats

if TYPE_CHECKING:
    from kop.admin.metrics import BrokerMetrics
    from kop.partition import PartitionLog
    from kop.topics import TopicManager

log = logging.getLogger(__name__)
PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """In the cleaner process: end with the broker, even one killed with SIGKILL, so no cleaner outlives it to write
    files a restarted broker would have to wait for (Linux's PR_SET_PDEATHSIG; elsewhere it ends once its work
    is done and it finds the broker gone)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class LogCleaner:
    def __init__(self, topics: "TopicManager", metrics: "BrokerMetrics", io_bytes_per_second: float) -> None:
        self._topics = topics
        self._metrics = metrics
        self._io_bytes_per_second = io_bytes_per_second
        self._executor: ProcessPoolExecutor | None = None
        self._stop = threading.Event()  # a pass in a thread ends at the next entry once set

    async def run(self, interval_s: float) -> None:
        try:
            while True:
                await asyncio.sleep(interval_s)
                try:
                    await self.clean_once()
                except Exception:
                    log.exception("log cleaner pass failed")
        finally:
            self.close()

    def close(self) -> None:
        self._stop.set()
        self._drop_pool()

    def _drop_pool(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    async def clean_once(self) -> int:
        """One pass over every compacted partition; returns how many were cleaned."""
        cleaned = 0
        for topic in list(self._topics.topics.values()):
            if not topic.settings.compacted:
                continue
            settings = CompactionSettings.parse(topic.configs)
            for partition in list(topic.partitions):
                cleaned += await self._clean(partition, settings)
        return cleaned

    async def _clean(self, partition: "PartitionLog", settings: CompactionSettings) -> bool:
        ledger = partition.ledger
        now = clock.now_ms()
        selection = select(ledger.closed_ledgers(), ledger.cleaned_through, settings, now)
        stats = partition.cleaner_stats
        stats.dirty_ratio, stats.lag_ms = selection.dirty_ratio, selection.lag_ms
        labels = (partition.topic, str(partition.partition))
        self._metrics.compaction_dirty_ratio.labels(*labels).set(stats.dirty_ratio)
        self._metrics.compaction_lag.labels(*labels).set(stats.lag_ms / 1000)
        if not selection.due:
            return False
        try:
            cleanable = await ledger.with_entries(selection.cleanable)
        except OSError as exc:
            log.info("%s: compaction pass dropped, its ledgers could not be read (%s)", partition.name, exc)
            return False
        job = CompactionJob(partition.name, uuid.uuid4().hex, tuple(cleanable), now - settings.delete_retention_ms,
                            ledger.config.max_entry_bytes, ledger.config.fsync, self._io_bytes_per_second)
        log.info("%s: compacting ledgers %d-%d (dirty ratio %.2f)", partition.name, cleanable[0].ledger_id,
                 cleanable[-1].ledger_id, stats.dirty_ratio)
        try:
            if cleanable[0].entries is not None:  # the engine's entries are in this process's memory: a thread
                result = await asyncio.to_thread(compact, replace(job, stop=self._stop))
            else:
                result = await asyncio.get_running_loop().run_in_executor(self._pool(), compact, job)
        except CleanerStopped:
            return False
        except (LedgerChanged, FileNotFoundError) as exc:
            log.info("%s: compaction pass dropped, a ledger changed while it was read (%s)", partition.name, exc)
            return False
        except BrokenProcessPool:
            log.warning("%s: the cleaner process died; a new one takes the next pass", partition.name)
            self._drop_pool()
            return False
        installed = await ledger.install_compaction(result.rewritten, cleanable[-1].ledger_id)
        if len(installed) != len(result.rewritten):
            log.info("%s: %d compacted ledgers not installed: they changed meanwhile", partition.name,
                     len(result.rewritten) - len(installed))
        self._record(partition, stats, result, installed, now, cleanable[-1].ledger_id)
        return True

    def _pool(self) -> ProcessPoolExecutor:
        if self._executor is None:
            # spawn, not fork: the broker's threads (the ledger executor) must not be copied mid-operation
            self._executor = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                                                 initializer=die_with_parent)
        return self._executor

    def _record(self, partition: "PartitionLog", stats: CleanerStats, result: CompactionResult, installed: list,
                now: int, through: int) -> None:
        reclaimed = sum(r.size_before - r.size for r in installed)
        stats.runs += 1
        stats.last_run_ms = now
        stats.records_removed += result.records_removed
        stats.tombstones_removed += result.tombstones_removed
        stats.aborted_removed += result.aborted_removed
        stats.bytes_reclaimed += reclaimed
        stats.cleaned_through_ledger = through
        stats.dirty_ratio = 0.0
        stats.lag_ms = 0
        metrics = self._metrics
        metrics.compaction_runs.inc()
        metrics.compaction_records_removed.inc(result.records_removed)
        metrics.compaction_bytes_reclaimed.inc(reclaimed)
        metrics.compaction_dirty_ratio.labels(partition.topic, str(partition.partition)).set(0.0)
        metrics.compaction_lag.labels(partition.topic, str(partition.partition)).set(0.0)
        log.info("%s: compacted through ledger %d: %d keys, %d of %d records removed (%d tombstones, %d of aborted "
                 "transactions), %d ledgers rewritten, %d bytes reclaimed", partition.name, through, result.keys,
                 result.records_removed, result.records_read, result.tombstones_removed, result.aborted_removed,
                 len(installed), reclaimed)
