"""PartitionLog: one Kafka partition on top of one managed ledger.

The produce path lands here. `publish_normal` takes a client data batch: idempotent batches (producer id >= 0) go
through Kafka's producer rules and the PIP-6 core (`dedup/`), then get offsets and are appended. The decision and
the offset assignment run synchronously, in call order, so appends to one partition happen in arrival order; it
returns a future of the result that resolves once the entry is durable, so many appends share one group-committed fsync. The bookkeeping
after a write (dedup's persisted map, snapshots) runs in callbacks, whether or not anyone awaits the result (acks=0).
"""
import asyncio
import gc
import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from dedup import (DEDUP_CURSOR_NAME, Accept, DecideAgain, DedupConfig, Duplicate, DupStatus, KafkaProducers,
                   MessageDeduplication, PendingBatch, Reject, Status, WaitFor, WriteFailed, acknowledged_range)
from dedup import named_sequences
from dedup.named_sequences import RecordsDecision
from kop.compaction.stats import CleanerStats
from kop.dedup_storage import LedgerDedupStorage
from kop.sequence_filter import Answer, SequenceFilter, Store
from kop.producer_ids import SharedProducerIds
from kop.ledger import Entry, LedgerClosedError, LedgerWriteError, ManagedLedger, ManagedLedgerError, Position
from kop.transactions.aborted_index import Listed
from kop.transactions.index_cache import IndexCache
from kop.transactions.index_snapshots import IndexSnapshots
from kop.transactions.partition_index import DEFAULT_MAX_ABORTED_PER_LEDGER, PartitionTransactions
from protocol.errors import ErrorCode
from protocol.records import (BatchHeader, RecordBatchError, WalkedRecords, assign_offsets, build_control_batch,
                              build_marker_batch, clear_transactional, keep_records, set_log_append_time,
                              split_batches, validate_batch)
from protocol.sequence_headers import SequenceHeaderScan
from proto.kop_pb2 import MarkerType, MessageMetadata

log = logging.getLogger(__name__)

TRANSACTIONS_CURSOR = "pulsar.transactions"  # exists once a transaction added the partition (system prefix: no group)
MARKER_PRODUCER = "pulsar.marker"  # the producer name of marker entries, as in Pulsar

# Told of each marker a replicator stored here, once durable: (partition, its metadata, its batch, its position).
MarkerListener = Callable[["PartitionLog", MessageMetadata, bytes, Position], None]

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
    duplicate: bool = False  # deduplicated, not written (replicated entries: found by their source position)
    position: Position | None = None  # where the entry was stored


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


def replicator_name(source_cluster: str, topic_id: uuid.UUID) -> str:
    """The dedup name a replicator's entries are judged under in the target (Pulsar's replicator producer): one per
    incarnation of the source topic, whose positions start again when it is deleted and created anew."""
    return f"pulsar.repl.{source_cluster}.{topic_id}"


def source_position_key(ledger_id: int, entry_id: int) -> int:
    """A source position as one int64 that orders as (ledgerId, entryId) does, to be a PIP-6 sequence id."""
    if not (0 <= ledger_id < 1 << 31 and 0 <= entry_id < 1 << 32):
        raise ValueError(f"source position {ledger_id}:{entry_id} out of range")
    return (ledger_id << 32) | entry_id


def _acknowledge(metadata: MessageMetadata, offset: int, repeated: tuple[str, int] | None) -> None:
    """Mark an empty batch of only duplicates: answered with `offset`, where the first record it repeats
    (`repeated`: its application producer name and sequence id) was stored."""
    metadata.acknowledged_offset = offset
    if repeated is not None:
        metadata.acknowledged_sequence.name, metadata.acknowledged_sequence.sequence_id = repeated


def _resolved(result: AppendResult) -> asyncio.Future:
    future = asyncio.get_running_loop().create_future()
    future.set_result(result)
    return future


MARKER_READ_AHEAD = 64 << 10  # bytes a consumer's read past PIP-33 markers reads at least
REPLICATOR_CURSOR_PREFIX = "pulsar.repl."  # a replicator's cursor: pulsar.repl.<remote cluster>


class PartitionLog:
    def __init__(self, topic: str, partition: int, ledger: ManagedLedger, dedup_config: DedupConfig,
                 system_topic: bool = False, index_cache: IndexCache | None = None,
                 max_aborted_per_ledger: int = DEFAULT_MAX_ABORTED_PER_LEDGER) -> None:
        """index_cache: the broker's cache of stored aborted-transaction indexes (one of its own by default)."""
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
        self.transactions = PartitionTransactions(ledger, index_cache, max_aborted_per_ledger, self.name)
        self.transaction_snapshots = IndexSnapshots(self.transactions, self.name)
        self._writes_in_flight = 0  # handed to the ledger, not yet stored or failed
        # Markers handed to the ledger per producer id: a transactional batch that waited for earlier writes is
        # stored only if none came meanwhile.
        self._markers_handed: dict[int, int] = {}
        # producer id -> its marker being written ((epoch, commit, coordinator epoch), its result), until it is
        # stored or fails or a transactional batch of the producer is handed on after it
        self._marker_in_flight: dict[int, tuple[tuple[int, bool, int], asyncio.Future]] = {}
        # producer id -> resolved once its last batch held for its coordinator's verification was handed on (or
        # refused): its later batches wait behind it, in order
        self.verifying: dict[int, asyncio.Future] = {}
        self.marker_listener: MarkerListener | None = None
        # Producer ids that mean the same producer in the clusters this one replicates with (kop/producer_ids.py)
        self.shared_producer_ids = SharedProducerIds()
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
        """Where read_committed consumers stop: the first offset of the oldest open transaction (never below the log
        start), else the HW."""
        return max(self.transactions.last_stable_offset(self.high_watermark), self.log_start_offset)

    @property
    def may_hold_transactions(self) -> bool:
        """Whether a transaction ever added this partition (so it may hold transactional batches and markers)."""
        cursor = self.ledger.cursors.get(TRANSACTIONS_CURSOR)
        return cursor is not None and cursor.is_durable

    async def expect_transactions(self) -> None:
        """Record, durably and before a transaction's first batch can be written here, that this partition may hold
        transactional batches: only such partitions read their stored batches at load to rebuild their open
        transactions and aborted indexes. A cursor of its own, holding the (empty) state's snapshot at the last
        entry: a load reads from there on."""
        if not self.may_hold_transactions:
            cursor = self.ledger.open_cursor(TRANSACTIONS_CURSOR)
            await cursor.mark_delete(cursor.mark_delete_position,
                                     string_properties=self.transactions.snapshot(self.high_watermark))
            self.transaction_snapshots.enable(cursor)

    async def load_transactions(self) -> int:
        """Rebuild the open transactions and the aborted indexes (before any write), for a partition a transaction
        ever added: from the last snapshot and the stored batches after it, storing the indexes of the ledgers they
        are in; returns how many entries were read."""
        if not self.may_hold_transactions:
            return 0
        cursor = self.ledger.cursors[TRANSACTIONS_CURSOR]
        read = await self.transactions.load(cursor.string_properties)
        self.transaction_snapshots.enable(cursor, (self.ledger.last_confirmed, self.high_watermark), read)
        return read

    async def aborted_transactions(self, first: Entry, fetch_offset: int, upper: int) -> list[Listed]:
        """The aborted transactions, as (producer id, first offset), a read_committed fetch at fetch_offset lists
        when it returns the entries from `first` (the one holding fetch_offset) up to offset `upper` (the consumer
        drops their batches). Raises ManagedLedgerError or OSError when a stored index cannot be read."""
        return await self.transactions.aborted_between(first.position.ledger_id, fetch_offset, upper)

    # ---- writing

    def publish_normal(self, header: BatchHeader, view: memoryview, timeout_ms: int = 30000,
                       records: WalkedRecords | None = None, client: Mapping[str, str] = NO_CLIENT) -> asyncio.Future:
        """Append a client data batch; resolves to an AppendResult once durable, deduplicated or rejected. A
        writable `view` (a produce request's own bytes) gets its offsets in place; a read-only one is copied.
        `records`: the batch's records as validation walked them, watching for application-chosen sequence ids
        (`judges_sequence_headers`), so records that carry them are judged (kop/sequence_filter.py). `client`: the log
        fields naming the sender (RequestContext.log_fields)."""
        named = records is not None and records.headers is not None and self.judges_sequence_headers()
        if header.producer_id < 0:
            if named:
                return self._publish_named(header, view, records, None, client)
            return self._append(header, view, MessageMetadata(), None)
        decision = self.producers.check(header.producer_id, header.producer_epoch, header.base_sequence,
                                        header.last_offset_delta, self.shared_producer_ids.shared(header.producer_id))
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
        guard = self._markers_handed.get(header.producer_id, 0) if header.is_transactional else 0
        return asyncio.ensure_future(self._decide_again(decision, header, view, timeout_ms, records, client, guard))

    def publish_control(self, producer_id: int, producer_epoch: int, commit: bool,
                        coordinator_epoch: int = 0) -> asyncio.Future:
        """Append a transaction's COMMIT or ABORT marker: a control batch, checked against the producer's epoch
        here but not deduplicated (it carries no sequence). Resolves to an AppendResult once durable."""
        current = self.producers.epoch(producer_id)
        if current is not None and current > producer_epoch:
            return _resolved(AppendResult(ErrorCode.INVALID_PRODUCER_EPOCH,
                                          message=f"marker epoch {producer_epoch} is older than {current}"))
        if self.transactions.stale_coordinator(producer_id, coordinator_epoch):
            return _resolved(AppendResult(ErrorCode.TRANSACTION_COORDINATOR_FENCED,
                                          message=f"coordinator epoch {coordinator_epoch} is older than "
                                                  f"{self.transactions.coordinator_epochs[producer_id]}"))
        marker = (producer_epoch, commit, coordinator_epoch)
        in_flight = self._marker_in_flight.get(producer_id)
        if in_flight is not None and in_flight[0] == marker:
            # Sent again while it is written (its sender's request timed out): one write, both get its outcome.
            result = asyncio.shield(in_flight[1])
        elif self.transactions.repeats_last_marker(producer_id, producer_epoch, commit, coordinator_epoch):
            # Stored already though its writer never heard so (a crash or a failed flush came between): a second
            # one would close nothing and only show consumers an extra control record.
            log.info("%s: the %s marker of producer %d epoch %d is stored already; not written again", self.name,
                     "COMMIT" if commit else "ABORT", producer_id, producer_epoch)
            result = _resolved(AppendResult(ErrorCode.NONE))
        else:
            result = self._append_marker(producer_id, producer_epoch, commit, coordinator_epoch)
            self._marker_in_flight[producer_id] = (marker, result)
            result.add_done_callback(lambda done: self._marker_written(producer_id, done))
        self._markers_handed[producer_id] = self._markers_handed.get(producer_id, 0) + 1
        self.transactions.on_coordinator(producer_id, coordinator_epoch)
        return result

    def _marker_written(self, producer_id: int, result: asyncio.Future) -> None:
        in_flight = self._marker_in_flight.get(producer_id)
        if in_flight is not None and in_flight[1] is result:
            del self._marker_in_flight[producer_id]

    def _append_marker(self, producer_id: int, producer_epoch: int, commit: bool,
                       coordinator_epoch: int) -> asyncio.Future:
        base = self.ledger.written_end_index
        batch = build_control_batch(base_offset=base, producer_id=producer_id, producer_epoch=producer_epoch,
                                    commit=commit, coordinator_epoch=coordinator_epoch,
                                    timestamp_ms=int(time.time() * 1000))
        header, view = split_batches(batch)[0]
        metadata = MessageMetadata(producer_id=producer_id, producer_epoch=producer_epoch, is_control=True,
                                   is_transactional=True,
                                   marker_type=MarkerType.TXN_COMMIT if commit else MarkerType.TXN_ABORT)
        # Closed once the marker is durable: a marker whose write fails leaves the transaction open until the
        # coordinator writes it again (or replays it after a crash).
        def stored(offset: int, position: Position) -> None:
            self.producers.on_marker_persisted(producer_id, producer_epoch)
            self.transactions.on_marker(producer_id, producer_epoch, position, offset, commit, self.high_watermark)

        result = self._append(header, view, metadata, None, on_stored=stored)
        if not result.done():  # handed to the ledger: a newer epoch fences the older one's batches from now on
            self.producers.on_marker_pushed(producer_id, producer_epoch)
        return result

    def markers_handed(self, producer_id: int) -> int:
        """How many markers of this producer were handed to the ledger (a batch checked before one came must not be
        stored after it)."""
        return self._markers_handed.get(producer_id, 0)

    def publish_replicated(self, source_cluster: str, topic_id: uuid.UUID, ledger_id: int, entry_id: int,
                           source: MessageMetadata, header: BatchHeader, view: memoryview) -> asyncio.Future:
        """Append an entry a replicator of `source_cluster` sent, unless it is stored already: it is judged by its
        source position under the replicator's name for the source topic's id (Pulsar's dedup V2), so a resend
        after a reconnect, a rewind or a restart of either side is stored once. Its producer's own identity is kept
        apart (producer ids and names are cluster-local). Its records' application-chosen sequence ids are judged as
        a producer's here are: a producer that failed over and wrote some of them here before they were replicated
        has them dropped from the entry (leaving holes in its offsets), and is deduplicated by them here afterwards.
        An entry of a Kafka idempotent producer whose id is shared by the clusters (a producer that may move between
        them keeping its id) is also judged as that producer's batch here (Pulsar's dedup V1, by the original
        producer's identity): found among its latest batches here (it failed over and wrote it here first), its
        records are dropped (an empty batch records the source position); otherwise it becomes the producer's
        batch here, so its resends here are duplicates. Anything else Kafka's rules would refuse (an older epoch, a
        sequence already passed) is stored as it is: replicated records are never lost to a guess.
        Resolves to an AppendResult (`duplicate` when it was stored before)."""
        if self.dedup.awaiting_recovery:  # judged against part of the state, a resend would be stored again
            self.dedup.retry_recovery()
            return _resolved(AppendResult(ErrorCode.REQUEST_TIMED_OUT,
                                          message="the partition's deduplication state is being recovered"))
        name, key = replicator_name(source_cluster, topic_id), source_position_key(ledger_id, entry_id)
        status = self.dedup.judge(name, key)
        if status is DupStatus.DUP:
            return _resolved(AppendResult(duplicate=True))
        if status is DupStatus.UNKNOWN:
            return _resolved(AppendResult(ErrorCode.REQUEST_TIMED_OUT,
                                          message="an earlier send of this entry is still being written"))
        metadata = MessageMetadata(
            producer_name=name, sequence_id=key, highest_sequence_id=key, replicated_from=source_cluster,
            replicate_to=source.replicate_to, original_producer_name=source.producer_name,
            original_sequence_id=source.sequence_id, original_highest_sequence_id=source.highest_sequence_id,
            source_ledger_id=ledger_id, source_entry_id=entry_id)
        if source.HasField("marker_type"):
            metadata.marker_type = source.marker_type
        if header.is_transactional:  # only committed transactions are replicated: plain data here
            buffer = bytearray(view)
            clear_transactional(buffer, 0)
            header, view = split_batches(buffer)[0]
        named = on_stored = acknowledged = None
        if source.HasField("acknowledged_offset"):  # the source's offset: answered here with this cluster's own
            acknowledged = self._acknowledged_here(source)
            _acknowledge(metadata, acknowledged, (source.acknowledged_sequence.name,
                                                  source.acknowledged_sequence.sequence_id)
                         if source.HasField("acknowledged_sequence") else None)
        if source.named_sequences and self.dedup.is_enabled:  # judged by them in the source: here too
            step = self._judge_replicated_records(header, view)
            if isinstance(step, Answer):
                return _resolved(AppendResult(step.error, message=step.message))
            header, view, named = step.header, step.view, step.decision
            for core_name, sequence_id in named.highest.items():
                metadata.named_sequences.add(name=core_name, sequence_id=sequence_id)
            if step.acknowledged is not None:  # all of them here already
                _acknowledge(metadata, step.acknowledged, step.repeated)
            run = step.run  # remembered as a producer's are: a producer that fails over here is answered its offsets
            on_stored = None if run is None else lambda base, _position: self.sequences.runs.stored(run, base)
        if named is None and self._judged_as_its_producer(source, header):
            return self._publish_as_producer(header, view, metadata, name, key, acknowledged)
        self.dedup.push(name, key)
        if not source.HasField("marker_type"):
            return self._append(header, view, metadata, None, named, on_stored, replicated=(name, key))
        result = self._append(header, view, metadata, None, named, replicated=(name, key), span=0)
        batch = bytes(view)
        result.add_done_callback(lambda done: self._on_marker_stored(metadata, batch, done.result()))
        return result

    def _judged_as_its_producer(self, source: MessageMetadata, header: BatchHeader) -> bool:
        return (self.dedup.is_enabled and header.producer_id >= 0 and not source.is_transactional
                and not source.HasField("marker_type") and self.shared_producer_ids.shared(header.producer_id))

    def _acknowledged_here(self, source: MessageMetadata) -> int:
        """Where this cluster stored the first record a replicated empty batch repeats (the source answered with its
        own offset of it, which means nothing here): -1 when not known, as the source answers then too."""
        if not source.HasField("acknowledged_sequence"):
            return -1
        repeated = source.acknowledged_sequence
        return self.sequences.runs.offset_of(repeated.name, repeated.sequence_id)

    def _publish_as_producer(self, header: BatchHeader, view: memoryview, metadata: MessageMetadata,
                             name: str, key: int, acknowledged: int | None = None) -> asyncio.Future:
        """Dedup V1: a replicated batch judged as its producer's batch here, its source position kept as a name of
        the entry (replayed with it); `acknowledged`: its producer's retries of it are answered with this offset
        (an empty batch standing for records stored before)."""
        source_position = named_sequences.RecordsDecision(highest={name: key})
        decision = self.producers.check(header.producer_id, header.producer_epoch, header.base_sequence,
                                        header.last_offset_delta)
        if isinstance(decision, Accept):
            kafka = _kafka_metadata(header, decision)
            metadata.producer_name, metadata.producer_id, metadata.producer_epoch = \
                kafka.producer_name, kafka.producer_id, kafka.producer_epoch
            metadata.sequence_id, metadata.highest_sequence_id = kafka.sequence_id, kafka.highest_sequence_id
            metadata.named_sequences.add(name=name, sequence_id=key)
            return self._append(header, view, metadata, decision, source_position, acknowledged=acknowledged)
        if isinstance(decision, (WaitFor, DecideAgain)):  # the producer's own write of it may be in flight here
            return _resolved(AppendResult(ErrorCode.REQUEST_TIMED_OUT,
                                          message="a write of the same producer is in flight here, retry"))
        metadata.producer_name, metadata.sequence_id, metadata.highest_sequence_id = "", 0, 0
        metadata.named_sequences.add(name=name, sequence_id=key)
        if isinstance(decision, Duplicate):  # written here by the producer itself: the records go, the offsets stay
            self.dedup_decisions.duplicate += 1
            empty = keep_records(header, b"", [], header.max_timestamp)
            header, view = split_batches(empty)[0]
        return self._append(header, view, metadata, None, source_position)

    def _judge_replicated_records(self, header: BatchHeader, view: memoryview) -> Store | Answer:
        """A replicated batch's records, judged by their sequence-id headers. All of them already here still leave
        an empty batch to store, as an idempotent producer's does: it records the source position."""
        try:
            records = validate_batch(header, view, from_client=False, watch=SequenceHeaderScan)
        except RecordBatchError as exc:
            return Answer(ErrorCode(exc.error_code), str(exc))
        return self.sequences.filter(header, view, records, idempotent=True)

    def _on_marker_stored(self, metadata: MessageMetadata, batch: bytes, result: AppendResult) -> None:
        if result.error == ErrorCode.NONE and self.marker_listener is not None:
            self.marker_listener(self, metadata, batch, result.position)

    def publish_marker(self, marker_type: int, payload: bytes, replicate_to: tuple[str, ...] = ()) -> asyncio.Future:
        """Append a marker (PIP-33): an entry that covers no Kafka offset and is never served to a client, so
        offsets, lag and ListOffsets do not see it. Resolves to an AppendResult with its position once durable."""
        header, view = split_batches(build_marker_batch(marker_type, payload))[0]
        metadata = MessageMetadata(producer_name=MARKER_PRODUCER, sequence_id=0, marker_type=marker_type,
                                   replicate_to=replicate_to)
        return self._append(header, view, metadata, None, span=0)

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
            return _resolved(AppendResult(step.error, step.base_offset, message=step.message))
        metadata = _kafka_metadata(step.header, accept) if accept is not None else MessageMetadata()
        for name, sequence_id in step.decision.highest.items():
            metadata.named_sequences.add(name=name, sequence_id=sequence_id)
        if step.acknowledged is not None:  # kept with the entry: a retry answered from a replay gets it too
            _acknowledge(metadata, step.acknowledged, step.repeated)
        run = step.run
        on_stored = None if run is None else lambda base, _position: self.sequences.runs.stored(run, base)
        return self._append(step.header, step.view, metadata, accept, step.decision, on_stored,
                            acknowledged=step.acknowledged)

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
                            client: Mapping[str, str], guard: int) -> AppendResult:
        try:
            await asyncio.wait_for(decision.future, max(timeout_ms, 1) / 1000)
        except asyncio.TimeoutError:
            return AppendResult(ErrorCode.REQUEST_TIMED_OUT, message="earlier writes of this producer in progress")
        if header.is_transactional and self._markers_handed.get(header.producer_id, 0) != guard:
            # Its transaction ended while it waited (the coordinator checked it before): stored after the marker,
            # it would open a transaction no one ends (the hanging transaction of Kafka's KIP-890).
            return AppendResult(ErrorCode.INVALID_TXN_STATE, message="its transaction ended while it waited")
        return await self.publish_normal(header, view, timeout_ms, records, client)

    def _append_time(self, duplicate: Duplicate) -> int:
        """The original log-append time of a deduplicated batch (-1 for CreateTime topics, as Kafka answers)."""
        return duplicate.log_append_time if self.log_append_time else -1

    def _append(self, header: BatchHeader, view: memoryview, metadata: MessageMetadata, accept: Accept | None,
                named: RecordsDecision | None = None, on_stored: Callable[[int, Position], None] | None = None,
                replicated: tuple[str, int] | None = None, span: int | None = None,
                acknowledged: int | None = None) -> asyncio.Future:
        """Assign offsets to one batch and hand it to the ledger; `named`: the application-chosen sequence ids it
        stores; `on_stored(base offset, position)` runs once it is durable, in log order, before the result is set;
        `replicated`: the replicator name and source position key it is judged by; `span`: the offsets it covers
        (0 for a marker; by default its records'); `acknowledged`: the base offset to answer instead of its own (an
        empty batch standing for records stored before), which its producer's retries get too."""
        base = self.ledger.written_end_index
        span = header.last_offset_delta + 1 if span is None else span
        last = base + header.last_offset_delta
        answered, answered_last = (base, last) if acknowledged is None else \
            acknowledged_range(acknowledged, header.last_offset_delta)
        batch = bytearray(view) if view.readonly else view  # a produce request's own bytes: patched in place
        assign_offsets(batch, 0, base)
        now = int(time.time() * 1000)
        if self.log_append_time:
            set_log_append_time(batch, 0, now)
        metadata.publish_time = now
        metadata.num_messages = header.records_count
        append_time = now if self.log_append_time else -1
        size = len(batch)
        try:
            # A write that fails comes back through the ledger's failure path, after the writes before it.
            # _on_written runs as soon as the entry is durable (it reads pending, named and result, set below)
            self.ledger.add_entry(
                base, span, metadata.SerializeToString(), batch,
                then=lambda f: self._on_written(f, base, base + span, answered, size, append_time, pending, named,
                                                on_stored, replicated, result))
        except LedgerClosedError as exc:  # the partition is going away (topic deleted, broker stopping)
            return _resolved(AppendResult(ErrorCode.NOT_LEADER_OR_FOLLOWER, message=str(exc)))
        except ManagedLedgerError as exc:
            return _resolved(AppendResult(ErrorCode.KAFKA_STORAGE_ERROR, message=str(exc)))
        # After add_entry, so a write refused above leaves no dedup state behind; nothing runs in between.
        self._writes_in_flight += 1
        if header.is_transactional and not header.is_control:  # opens early: the LSO may only err low
            self.transactions.on_data(header.producer_id, base)
            self._marker_in_flight.pop(header.producer_id, None)  # a marker after this batch is a new one
        pending = self.producers.on_pushed(accept, answered, answered_last, now) if accept is not None else None
        if named is not None:
            named_sequences.commit(self.dedup, named)
        result = asyncio.get_running_loop().create_future()
        return result

    def _on_written(self, written: asyncio.Future, base: int, end: int, answered: int, size: int, append_time: int,
                    pending: PendingBatch | None, named: RecordsDecision | None,
                    on_stored: Callable[[int, Position], None] | None, replicated: tuple[str, int] | None,
                    result: asyncio.Future) -> None:
        self._writes_in_flight -= 1
        exc = written.exception()
        if exc is None:
            self.bytes_in += size
            if on_stored is not None:
                on_stored(base, written.result())
            self.transactions.on_stored(written.result())
            self.transaction_snapshots.on_stored(written.result(), end)
            if named is not None:  # first: the entry's count (on_persisted) may snapshot, with them
                self.dedup.record_persisted_names(named.highest.items())
            if replicated is not None:
                name, key = replicated
                self.dedup.record_persisted(name, key, key, written.result(), idle=True)
            else:
                self.producers.on_persisted(pending, written.result())
            outcome = AppendResult(ErrorCode.NONE, answered, append_time, position=written.result())
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
        """Durable entries, markers included, from the one holding `offset`, up to max_bytes (at least one entry if
        any)."""
        return self.ledger.read_from_index(offset, max_bytes)

    def read_records(self, offset: int, max_bytes: int, whole_first: bool = True) -> list[Entry]:
        """What a consumer reads: durable record batches from the one holding `offset`, up to max_bytes of them, the
        first whatever its size when whole_first (KIP-74: only a response's first batch may exceed the limits).
        Markers (PIP-33: span 0) are left out and their bytes not counted, so a run of them never shrinks a fetch."""
        entries = self.ledger.read_from_index(offset, max_bytes)
        records = data_entries(entries)
        if len(records) == len(entries):  # no marker (most reads): the ledger already kept to max_bytes
            return records if whole_first else fitting(records, max_bytes)
        return self._records_past_markers(entries, max_bytes, whole_first)

    def _records_past_markers(self, entries: list[Entry], max_bytes: int, whole_first: bool) -> list[Entry]:
        """A read that met markers, whose bytes the ledger counted: read on past them until max_bytes of batches or
        the last durable entry, at least MARKER_READ_AHEAD bytes a read so that a run of markers takes few."""
        out: list[Entry] = []
        room = max_bytes
        while entries:
            for entry in entries:
                if not entry.span:
                    continue
                if len(entry.data) > room and (out or not whole_first):
                    return out
                out.append(entry)
                room -= len(entry.data)
                if room <= 0:
                    return out
            entries = self.ledger.read_after(entries[-1].position, 1 << 30, max(room, MARKER_READ_AHEAD))
        return out

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

    async def enforce_retention(self, now_ms: int, retention_ms: int, retention_bytes: int,
                                replication_quota_bytes: int = -1) -> int:
        """Delete the ledgers retention allows; returns how many. When the dedup cursor's records hold back a
        ledger that is due (a quiet topic: no new snapshot moves them), snapshot again at the last entry so the
        next pass can delete it. Pulsar's time-based snapshot does not move a cursor already at the last entry.
        A replicator whose backlog is over replication_quota_bytes (-1: no limit) holds nothing back; what
        retention then deletes of its backlog is logged."""
        holding, evicted = self._replicator_floors(replication_quota_bytes)
        floor = self.retention_floor(holding)
        result = await self.ledger.trim(now_ms, retention_ms, retention_bytes, floor)
        self.transactions.forget_before(self.log_start_offset)
        self._store_idle_indexes()
        # A snapshot frees nothing while a replicator holds back as much (a remote down for days).
        if result.held_back and floor not in holding:
            if self.dedup.snapshot_now():
                log.info("%s: dedup snapshot taken so retention can delete the ledgers behind it", self.name)
            if self.transaction_snapshots.snapshot_now():
                log.info("%s: transaction snapshot taken so retention can delete the ledgers behind it", self.name)
        for cursor, (position, entries) in evicted.items():
            if lost := entries - self.backlog_after(position)[0]:
                log.warning("%s: retention deleted %d entries %s had not replicated yet (its backlog is over "
                            "replicationBacklogQuotaLimitBytes): that cluster will not get them", self.name, lost,
                            cursor.removeprefix(REPLICATOR_CURSOR_PREFIX))
        return result.deleted

    def _store_idle_indexes(self) -> None:
        """Once nothing is in flight, every ledger before the current one is complete: store the aborted indexes
        still in memory of those a roll closed while the partition was idle (trim rolls idle ledgers)."""
        if self._writes_in_flight == 0 and self.transactions.indexes.in_memory():
            self.transactions.indexes.store_closed(self.ledger.internal_stats().current_ledger_id)

    def retention_floor(self, replicators: Sequence[Position] = ()) -> Position | None:
        """Retention never deletes entries the dedup cursor would have to replay, from its older kept snapshot on
        (the one recovery falls back to if the newest record is damaged), nor those the transaction snapshot's
        would (they rebuild the open transactions and the aborted indexes not stored yet), nor the batches of an
        open transaction (a restart reads them to know the transaction is open, and read_committed consumers have
        yet to get them), nor entries after `replicators` (the replicators' cursors: what they have not sent yet)."""
        wanted = self.dedup.is_enabled or self.dedup.awaiting_recovery  # a failed recovery's retry replays too
        cursor = self.ledger.cursors.get(DEDUP_CURSOR_NAME) if wanted else None
        floors = [Position(*cursor.recovery_floor)] if cursor is not None else []
        if self.may_hold_transactions:
            floors.append(Position(*self.ledger.cursors[TRANSACTIONS_CURSOR].recovery_floor))
        floors += replicators
        oldest_open = self.transactions.oldest_open_offset()
        if oldest_open is not None and (position := self.ledger.position_of_index(oldest_open)) is not None:
            floors.append(Position(position.ledger_id, position.entry_id - 1))  # keep from its entry on
        return min(floors, default=None)

    def _replicator_floors(self, quota_bytes: int) -> tuple[list[Position], dict[str, tuple[Position, int]]]:
        """The positions of the replicator cursors that hold retention back, and the cursors over the quota with
        their position and backlog in entries. A replicator moves its cursor only past entries the remote stored,
        so a restart that brings the cursor back to an older record needs none of the entries in between."""
        holding, evicted = [], {}
        for name, cursor in self.ledger.cursors.items():
            if name.startswith(REPLICATOR_CURSOR_PREFIX):
                position = Position(*cursor.mark_delete_position)
                entries, size = self.backlog_after(position)
                if 0 <= quota_bytes < size:
                    evicted[name] = (position, entries)
                else:
                    holding.append(position)
        return holding, evicted

    def backlog_after(self, position: Position) -> tuple[int, int]:
        """Entries after position and their bytes (the bytes of position's own ledger prorated by entries)."""
        entries = size = 0
        for ledger in self.ledger.internal_stats().ledgers:
            if ledger.ledger_id > position.ledger_id:
                entries += ledger.entries
                size += ledger.size
            elif ledger.ledger_id == position.ledger_id and ledger.entries:
                after = max(0, ledger.entries - position.entry_id - 1)
                entries += after
                size += ledger.size * after // ledger.entries
        return entries, size

    async def close(self) -> None:
        # A partition loaded at start-up is among the objects `kop standalone` froze out of the collector's reach
        # (kop/cli.py): they go back to it, so the cycles this partition leaves are freed (deleted, moved, stopped).
        gc.unfreeze()
        self._wake_waiters()
        await self.transaction_snapshots.close()
        await self.transactions.close()
        await self.dedup.close()
        await self.ledger.close()


def data_entries(entries: list[Entry]) -> list[Entry]:
    """The entries that hold records: markers (PIP-33: span 0, covering no offset) are never served. One pass that
    builds a new list: checking first whether any entry must go costs as much in CPython (BENCHMARKS.md, the fetch
    path)."""
    return [e for e in entries if e.span]


def fitting(entries: list[Entry], limit: int) -> list[Entry]:
    """The leading entries whose batches fit in limit bytes together."""
    size = 0
    for i, entry in enumerate(entries):
        size += len(entry.data)
        if size > limit:
            return entries[:i]
    return entries
