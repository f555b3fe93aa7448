"""PartitionLog: one Kafka partition on top of one managed ledger.

The produce path lands here. `publish_normal` takes a client data batch: idempotent batches (producer id >= 0) go
through Kafka's producer rules and the PIP-6 core (`dedup/`), then get offsets and are appended. The decision and
the offset assignment run synchronously, in call order, so appends to one partition happen in arrival order; it
returns a future of the result that resolves once the entry is durable, so many appends share one group-committed fsync. The bookkeeping
after a write (dedup's persisted map, snapshots) runs in callbacks, whether or not anyone awaits the result (acks=0).
"""
import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

from dedup import (DEDUP_CURSOR_NAME, Accept, DecideAgain, DedupConfig, Duplicate, KafkaProducers,
                   MessageDeduplication, PendingBatch, Reject, Status, WaitFor, WriteFailed)
from dedup import named_sequences
from dedup.named_sequences import RecordsDecision
from kop.compaction.stats import CleanerStats
from kop.dedup_storage import LedgerDedupStorage
from kop.sequence_filter import Answer, SequenceFilter
from kop.ledger import Entry, LedgerClosedError, LedgerWriteError, ManagedLedger, ManagedLedgerError, Position
from kop.transactions.partition_index import PartitionTransactions
from protocol.errors import ErrorCode
from protocol.records import (BatchHeader, WalkedRecords, assign_offsets, build_control_batch, set_log_append_time,
                              split_batches)
from proto.kop_pb2 import MarkerType, MessageMetadata

log = logging.getLogger(__name__)

TRANSACTIONS_CURSOR = "pulsar.transactions"  # exists once a transaction added the partition (system prefix: no group)

# A failed write is retriable: the client resends with the same sequence numbers.
WRITE_FAILED = ErrorCode.NOT_LEADER_OR_FOLLOWER
NO_CLIENT: Mapping[str, str] = {}  # log fields of a batch that came from no client request (tests, tools)


class DedupRecovering(Exception):
    """The partition's deduplication state is being rebuilt: what it holds is not the whole truth yet."""


@dataclass(frozen=True, slots=True)
class AppendResult:
    error: ErrorCode = ErrorCode.NONE
    base_offset: int = -1
    log_append_time: int = -1
    message: str | None = None
    record_errors: tuple[tuple[int, str], ...] = ()  # (index in the batch, reason) of the records that failed it


@dataclass(slots=True)
class DedupDecisions:
    """How the PIP-6 core judged this partition's idempotent batches (read by the metrics at scrape time)."""

    stored: int = 0  # NotDup: written
    duplicate: int = 0  # Dup: answered with the original's offset or DUPLICATE_SEQUENCE_NUMBER, not written
    unknown: int = 0  # a retry of a write still in flight, or refused while the state is being recovered


def _kafka_metadata(header: BatchHeader, accept: Accept) -> MessageMetadata:
    return MessageMetadata(producer_name=accept.producer_name, sequence_id=accept.sequence_id,
                           highest_sequence_id=accept.highest_sequence_id, producer_id=header.producer_id,
                           producer_epoch=header.producer_epoch, is_transactional=header.is_transactional)


def _resolved(result: AppendResult) -> asyncio.Future:
    future = asyncio.get_running_loop().create_future()
    future.set_result(result)
    return future


class PartitionLog:
    def __init__(self, topic: str, partition: int, ledger: ManagedLedger, dedup_config: DedupConfig,
                 system_topic: bool = False) -> None:
        self.topic = topic
        self.partition = partition
        self.name = f"{topic}-{partition}"
        self.ledger = ledger
        self.dedup = MessageDeduplication(LedgerDedupStorage(ledger), dedup_config, system_topic=system_topic,
                                          log_name=self.name)
        self.producers = KafkaProducers(self.dedup)
        self.sequences = SequenceFilter(self.dedup, self.name)
        self.cleaner_stats = CleanerStats()  # kop/compaction's work here (compacted topics)
        self.log_append_time = False  # topic config message.timestamp.type=LogAppendTime
        # Plain counts on the hot path; the metrics read them at scrape time.
        self.bytes_in = 0  # bytes of batches stored (durable)
        self.bytes_out = 0  # bytes of batches served to fetches
        self.dedup_decisions = DedupDecisions()
        self.transactions = PartitionTransactions()
        self._waiters: list[asyncio.Future] = []
        ledger.add_confirm_listener(self._wake_waiters)
        ledger.add_failure_listener(self._on_ledger_failure)

    async def apply_dedup_policy(self, enabled: bool) -> Status:
        """Enable (recover from snapshot + replay) or disable deduplication; the partition takes writes only after
        the first call returns."""
        return await self.dedup.check_status(enabled)

    # ---- offsets

    @property
    def high_watermark(self) -> int:
        return self.ledger.confirmed_end_index

    @property
    def log_start_offset(self) -> int:
        return self.ledger.start_index

    @property
    def last_stable_offset(self) -> int:
        """Where read_committed consumers stop: the first offset of the oldest open transaction, else the HW."""
        return self.transactions.last_stable_offset(self.high_watermark)

    @property
    def may_hold_transactions(self) -> bool:
        """Whether a transaction ever added this partition (so it may hold transactional batches and markers)."""
        cursor = self.ledger.cursors.get(TRANSACTIONS_CURSOR)
        return cursor is not None and cursor.is_durable

    async def expect_transactions(self) -> None:
        """Record, durably and before a transaction's first batch can be written here, that this partition may hold
        transactional batches: only such partitions read their stored batches at load to rebuild their open
        transactions and aborted index (a cursor of its own, which holds nothing back)."""
        if not self.may_hold_transactions:
            cursor = self.ledger.open_cursor(TRANSACTIONS_CURSOR)
            await cursor.mark_delete(cursor.mark_delete_position)

    def load_transactions(self) -> int:
        """Rebuild the open transactions and the aborted index from the stored batches (before any write), for a
        partition a transaction ever added; returns how many entries were read."""
        return self.transactions.rebuild(self.ledger) if self.may_hold_transactions else 0

    # ---- writing

    def publish_normal(self, header: BatchHeader, view: memoryview, timeout_ms: int = 30000,
                       records: WalkedRecords | None = None, client: Mapping[str, str] = NO_CLIENT) -> asyncio.Future:
        """Append a client data batch; resolves to an AppendResult once durable, deduplicated or rejected.
        `records`: the batch's records as validation walked them, watching for application-chosen sequence ids
        (`judges_sequence_headers`), so records that carry them are judged one by one. `client`: the log fields
        naming the sender (RequestContext.log_fields)."""
        named = records is not None and records.scanned is not None and self.judges_sequence_headers()
        if header.producer_id < 0:
            if named:
                return self._publish_named(header, view, records, None, client)
            return self._append(header, view, MessageMetadata(), None)
        decision = self.producers.check(header.producer_id, header.producer_epoch, header.base_sequence,
                                        header.last_offset_delta)
        decisions = self.dedup_decisions
        if isinstance(decision, Accept):
            if named:
                return self._publish_named(header, view, records, decision, client)
            decisions.stored += 1
            return self._append(header, view, _kafka_metadata(header, decision), decision)
        if isinstance(decision, Duplicate):
            decisions.duplicate += 1
            return _resolved(AppendResult(ErrorCode.NONE, decision.base_offset, self._append_time(decision)))
        if isinstance(decision, Reject):
            if self.dedup.awaiting_recovery:  # the client retries; a failed recovery is retried meanwhile
                decisions.unknown += 1
                self.dedup.retry_recovery()
            log.info("%s: producer %d epoch %d seq %d rejected (%d): %s", self.name, header.producer_id,
                     header.producer_epoch, header.base_sequence, decision.error_code, decision.message, extra=client)
            return _resolved(AppendResult(ErrorCode(decision.error_code), message=decision.message))
        if isinstance(decision, WaitFor):
            decisions.unknown += 1
            return asyncio.ensure_future(self._await_original(decision, timeout_ms))
        assert isinstance(decision, DecideAgain)
        return asyncio.ensure_future(self._decide_again(decision, header, view, timeout_ms, records, client))

    def publish_control(self, producer_id: int, producer_epoch: int, commit: bool,
                        coordinator_epoch: int = 0) -> asyncio.Future:
        """Append a transaction's COMMIT or ABORT marker: a control batch, checked against the producer's epoch
        here but not deduplicated (it carries no sequence). Resolves to an AppendResult once durable."""
        current = self.producers.epoch(producer_id)
        if current is not None and current > producer_epoch:
            return _resolved(AppendResult(ErrorCode.INVALID_PRODUCER_EPOCH,
                                          message=f"marker epoch {producer_epoch} is older than {current}"))
        base = self.ledger.written_end_index
        batch = build_control_batch(base_offset=base, producer_id=producer_id, producer_epoch=producer_epoch,
                                    commit=commit, coordinator_epoch=coordinator_epoch,
                                    timestamp_ms=int(time.time() * 1000))
        header, view = split_batches(batch)[0]
        metadata = MessageMetadata(producer_id=producer_id, producer_epoch=producer_epoch, is_control=True,
                                   is_transactional=True,
                                   marker_type=MarkerType.TXN_COMMIT if commit else MarkerType.TXN_ABORT)
        result = self._append(header, view, metadata, None)
        # Closed once the marker is durable: a marker whose write fails leaves the transaction open until the
        # coordinator writes it again (or replays it after a crash).
        result.add_done_callback(lambda done: self._on_marker_written(producer_id, commit, done.result()))
        return result

    def _on_marker_written(self, producer_id: int, commit: bool, result: AppendResult) -> None:
        if result.error == ErrorCode.NONE:
            self.transactions.on_marker(producer_id, result.base_offset, commit, self.high_watermark)

    def judges_sequence_headers(self) -> bool:
        """Whether records with application-chosen sequence ids are deduplicated here (dedup on, or recovering)."""
        return self.dedup.is_enabled or self.dedup.awaiting_recovery

    def _publish_named(self, header: BatchHeader, view: memoryview, records: WalkedRecords,
                       accept: Accept | None, client: Mapping[str, str]) -> asyncio.Future:
        """A batch whose records may carry application-chosen sequence ids: each is judged on its own."""
        if not self.dedup.is_enabled:  # wanted, but the state to judge them by is being recovered
            self.dedup.retry_recovery()
            step = Answer(ErrorCode.REQUEST_TIMED_OUT, "the partition's deduplication state is being recovered, "
                                                       "retry", owed=True)
        else:
            step = self.sequences.filter(header, view, records, idempotent=accept is not None, client=client)
        if accept is not None:  # an idempotent batch: its PIP-6 decision, once its records are judged
            if not isinstance(step, Answer):
                self.dedup_decisions.stored += 1
            elif step.owed:
                self.dedup_decisions.unknown += 1
        if isinstance(step, Answer):
            if step.owed and accept is not None:
                self.producers.refuse(accept, step.error)
            if step.error:
                log.info("%s: batch refused (%d): %s", self.name, step.error, step.message, extra=client)
            return _resolved(AppendResult(step.error, message=step.message))
        metadata = _kafka_metadata(step.header, accept) if accept is not None else MessageMetadata()
        for name, sequence_id in step.decision.highest.items():
            metadata.named_sequences.add(name=name, sequence_id=sequence_id)
        return self._append(step.header, step.view, metadata, accept, step.decision)

    async def _await_original(self, decision: WaitFor, timeout_ms: int) -> AppendResult:
        """A retry of a batch still being written: answer whatever the original gets."""
        try:
            original = await asyncio.wait_for(decision.future, max(timeout_ms, 1) / 1000)
        except asyncio.TimeoutError:
            return AppendResult(ErrorCode.REQUEST_TIMED_OUT, message="the original write is still in progress")
        except WriteFailed as exc:
            return AppendResult(ErrorCode(exc.error_code), message="the original write failed, retry")
        return AppendResult(ErrorCode.NONE, original.base_offset, self._append_time(original))

    async def _decide_again(self, decision: DecideAgain, header, view, timeout_ms: int, records,
                            client: Mapping[str, str]) -> AppendResult:
        try:
            await asyncio.wait_for(decision.future, max(timeout_ms, 1) / 1000)
        except asyncio.TimeoutError:
            return AppendResult(ErrorCode.REQUEST_TIMED_OUT, message="earlier writes of this producer in progress")
        return await self.publish_normal(header, view, timeout_ms, records, client)

    def _append_time(self, duplicate: Duplicate) -> int:
        """The original log-append time of a deduplicated batch (-1 for CreateTime topics, as Kafka answers)."""
        return duplicate.log_append_time if self.log_append_time else -1

    def _append(self, header: BatchHeader, view: memoryview, metadata: MessageMetadata, accept: Accept | None,
                named: RecordsDecision | None = None) -> asyncio.Future:
        """Assign offsets to one batch and hand it to the ledger; `named`: the application-chosen sequence ids it
        stores."""
        base = self.ledger.written_end_index
        last = base + header.last_offset_delta
        batch = bytearray(view)
        assign_offsets(batch, 0, base)
        now = int(time.time() * 1000)
        if self.log_append_time:
            set_log_append_time(batch, 0, now)
        metadata.publish_time = now
        metadata.num_messages = header.records_count
        try:
            # A write that fails comes back through the ledger's failure path, after the writes before it.
            written = self.ledger.add_entry(base, header.last_offset_delta + 1, metadata.SerializeToString(), batch)
        except LedgerClosedError as exc:  # the partition is going away (topic deleted, broker stopping)
            return _resolved(AppendResult(ErrorCode.NOT_LEADER_OR_FOLLOWER, message=str(exc)))
        except ManagedLedgerError as exc:
            return _resolved(AppendResult(ErrorCode.KAFKA_STORAGE_ERROR, message=str(exc)))
        # After add_entry, so a write refused above leaves no dedup state behind; nothing runs in between.
        if header.is_transactional and not header.is_control:  # opens early: the LSO may only err low
            self.transactions.on_data(header.producer_id, base)
        pending = self.producers.on_pushed(accept, base, last, now) if accept is not None else None
        if named is not None:
            named_sequences.commit(self.dedup, named)
        result = asyncio.get_running_loop().create_future()
        append_time = now if self.log_append_time else -1
        size = len(batch)
        written.add_done_callback(lambda f: self._on_written(f, base, size, append_time, pending, named, result))
        return result

    def _on_written(self, written: asyncio.Future, base: int, size: int, append_time: int,
                    pending: PendingBatch | None, named: RecordsDecision | None, result: asyncio.Future) -> None:
        exc = written.exception()
        if exc is None:
            self.bytes_in += size
            if named is not None:  # first: the entry's count (on_persisted) may snapshot, with them
                self.dedup.record_persisted_names(named.highest.items())
            self.producers.on_persisted(pending, written.result())
            outcome = AppendResult(ErrorCode.NONE, base, append_time)
        elif isinstance(exc, LedgerWriteError):
            outcome = AppendResult(WRITE_FAILED, message=f"write failed, retry: {exc}")
        else:
            outcome = AppendResult(ErrorCode.KAFKA_STORAGE_ERROR, message=str(exc))
        if not result.done():
            result.set_result(outcome)

    def _on_ledger_failure(self, error: Exception) -> None:
        """PIP-6 fencing: every write in flight failed; go back to the persisted state before anything else runs,
        so the clients' retries are accepted again and nothing overtakes them."""
        log.warning("%s: write failed (%s); dedup state reset to what is persisted", self.name, error)
        self.producers.on_write_failed(WRITE_FAILED)

    def last_sequence_id(self, producer_name: str) -> int | None:
        """The highest `kop.sequence.id` stored for the application producer name on this partition (Pulsar's
        getLastSequenceId), or None when it is not known: never seen, purged, or deduplication off. Raises
        DedupRecovering while the state is being rebuilt: then no answer would be sure."""
        if self.dedup.awaiting_recovery:
            self.dedup.retry_recovery()  # a failed recovery is retried by whoever needs the state
            raise DedupRecovering(f"{self.name}: the deduplication state is being recovered")
        return self.dedup.persisted_sequence_id(named_sequences.core_name(producer_name))

    # ---- reading

    def read(self, offset: int, max_bytes: int) -> list[Entry]:
        """Durable entries from the one holding `offset`, up to max_bytes (at least one entry if any)."""
        return self.ledger.read_from_index(offset, max_bytes)

    def watch(self, future: asyncio.Future) -> None:
        """Resolve future (if still pending) the next time new entries become durable."""
        self._waiters.append(future)

    def unwatch(self, future: asyncio.Future) -> None:
        if future in self._waiters:
            self._waiters.remove(future)

    def _wake_waiters(self) -> None:
        waiters, self._waiters = self._waiters, []
        for future in waiters:
            if not future.done():
                future.set_result(None)

    # ---- housekeeping

    async def enforce_retention(self, now_ms: int, retention_ms: int, retention_bytes: int) -> int:
        """Delete the ledgers retention allows; returns how many. When the dedup cursor's records hold back a
        ledger that is due (a quiet topic: no new snapshot moves them), snapshot again at the last entry so the
        next pass can delete it. Pulsar's time-based snapshot does not move a cursor already at the last entry."""
        result = await self.ledger.trim(now_ms, retention_ms, retention_bytes, self.retention_floor())
        self.transactions.forget_before(self.log_start_offset)
        if result.held_back and self.dedup.snapshot_now():
            log.info("%s: dedup snapshot taken so retention can delete the ledgers behind it", self.name)
        return result.deleted

    def retention_floor(self) -> Position | None:
        """Retention never deletes entries the dedup cursor would have to replay, from its older kept snapshot on
        (the one recovery falls back to if the newest record is damaged)."""
        wanted = self.dedup.is_enabled or self.dedup.awaiting_recovery  # a failed recovery's retry replays too
        cursor = self.ledger.cursors.get(DEDUP_CURSOR_NAME) if wanted else None
        return Position(*cursor.recovery_floor) if cursor is not None else None

    async def close(self) -> None:
        self._wake_waiters()
        await self.dedup.close()
        await self.ledger.close()
