"""The produce-path step for a batch whose records carry application-chosen sequence ids (`kop.producer.name`,
`kop.sequence.id`): read the headers, judge the records (dedup/named_sequences), and say what to store. A batch of
one name with rising ids, all new (a producer's stream), is judged once; any other record by record.

* No record is a duplicate: the batch as the client wrote it.
* Some are: the batch without them, as Kafka's log cleaner rewrites one. The records kept keep the offsets the
  producer was told; the dropped ones leave holes, which every consumer skips.
* All are: an empty batch when the producer is idempotent (its sequence numbers must still count, or its next batch
  would be out of order, as Kafka's cleaner keeps empty batches for producer state); nothing when it is not. Either
  way no record is added, so consumers see the same, and the answer is the same: NONE with the batch's original base
  offset, the offset its first record was stored at the first time, when that is known (`StoredRuns`: that record
  was stored by one of the last batches of its name since the partition was loaded), else -1 (Kafka's answer for a
  duplicate whose offset it no longer knows). A batch repeating records of several earlier batches is answered by
  its first record's, as Kafka answers any batch by its first record's offset. The empty batch records that answer
  (`MessageMetadata.acknowledged_offset`), so the Kafka producer state answers a retry of it with it too, also
  after a restart.
* A name with a higher id still being written (PIP-6 Unknown): the batch is answered REQUEST_TIMED_OUT, to come again
  once that write has landed or failed.
"""
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dedup import MessageDeduplication
from dedup.named_sequences import RecordsDecision, judge_records, judge_run
from protocol.compression import RecordBatchError
from protocol.errors import ErrorCode
from protocol.records import BatchHeader, WalkedRecords, keep_records, record_spans, split_batches
from protocol.sequence_headers import SequencedRecords, SequenceHeaderScan, run_producer_name, sequenced_records

log = logging.getLogger(__name__)

MAX_WARNED_NAMES = 10_000  # names logged once for drops that reordering may have caused
RUNS_PER_NAME = 5  # stored batches remembered per name: a producer's requests in flight, as Kafka keeps 5
MAX_RUN_NAMES = 10_000  # names whose batches are remembered (the ones written last)


@dataclass(slots=True)  # not frozen, nor Store: built per batch, and a frozen dataclass costs ~3.5x to build
class Run:
    """A batch of one name stored whole: ids `first`..`last` (all of them when `consecutive`, each record the next
    offset), the first at offset delta `delta` of the batch."""

    name: str
    first: int
    last: int
    delta: int
    consecutive: bool

    def offset_of(self, base: int, sequence_id: int) -> int | None:
        """Where `sequence_id` was stored by this run, stored at `base`, if this run tells."""
        if sequence_id == self.first or (self.consecutive and self.first <= sequence_id <= self.last):
            return base + self.delta + sequence_id - self.first
        return None


class StoredRuns:
    """The last batches stored per name (durable ones only; whole, or rewritten without their duplicates), to answer
    a batch that is all duplicates with the offset its first record was stored at. Kept in memory, bounded, lost on
    reload: what it does not know is answered -1."""

    def __init__(self) -> None:
        self._runs: dict[str, list[tuple[Run, int]]] = {}

    def stored(self, run: Run, base: int) -> None:
        runs = self._runs.pop(run.name, [])  # to the end: the names written last stay
        runs.append((run, base))
        del runs[:-RUNS_PER_NAME]
        self._runs[run.name] = runs
        if len(self._runs) > MAX_RUN_NAMES:
            del self._runs[next(iter(self._runs))]

    def offset_of(self, name: str, sequence_id: int) -> int:
        for run, base in reversed(self._runs.get(name, ())):  # the latest first: a failed write's resend wins
            offset = run.offset_of(base, sequence_id)
            if offset is not None:
                return offset
        return -1


@dataclass(slots=True)
class Store:
    """Write this batch (possibly rewritten) and record `decision`'s names with it; `run`: the records it stores are
    one name's run (for `StoredRuns` once durable); `acknowledged`: it is the empty batch of an idempotent
    producer's batch of only duplicates, answered with this offset (the original base offset, or -1) instead of its
    own; `repeated`: then the (application producer name, sequence id) of the first record it repeats, which a
    cluster it is replicated to looks up to answer with its own offset of that record."""

    header: BatchHeader
    view: memoryview
    decision: RecordsDecision
    run: Run | None = None
    acknowledged: int | None = None
    repeated: tuple[str, int] | None = None


@dataclass(frozen=True, slots=True)
class Answer:
    """Write nothing; answer this. `owed`: the client must resend the batch (a retriable error)."""

    error: ErrorCode
    message: str | None = None
    owed: bool = False
    base_offset: int = -1


class SequenceFilter:
    """One partition's filter, with its counts of dropped duplicates (for stats)."""

    def __init__(self, dedup: MessageDeduplication, log_name: str) -> None:
        self._dedup = dedup
        self._log_name = log_name
        self.dropped = 0  # records dropped as duplicates
        # ... of them from producers that are not idempotent: with more than one request in flight, such a producer
        # can reorder records when it retries, and a record sent after a higher id of its name counts as a
        # duplicate. Each name is logged once.
        self.dropped_without_idempotence = 0
        self._warned: set[str] = set()
        self.runs = StoredRuns()
        self._run_name: tuple[bytes | None, str] = (None, "")  # the last run's name, raw and checked

    def filter(self, header: BatchHeader, view: memoryview, records: WalkedRecords,
               idempotent: bool, client: Mapping[str, str] | None = None) -> Store | Answer:
        """`records`: as validation walked them, watching for the sequence-id headers (which it found); `client`:
        the log fields naming the sender."""
        scan = records.headers
        assert isinstance(scan, SequenceHeaderScan)
        if scan.run_read is not None:
            whole = self._whole_run(header, view, *scan.run_read)
            if whole is not None:
                return whole
        try:
            sequenced = sequenced_records(scan)
        except RecordBatchError as exc:
            return Answer(ErrorCode(exc.error_code), str(exc))
        if scan.run_read is not None:  # a run not all new (judged as a run just now): record by record
            decision = judge_records(self._dedup, _per_record(sequenced, header.records_count))
        else:
            decision = self.judge(sequenced, header.records_count)
        if decision.unknown is not None:
            return Answer(ErrorCode.REQUEST_TIMED_OUT, f"a write of producer name {decision.unknown!r} with a higher "
                                                       f"kop.sequence.id is still in progress, retry", owed=True)
        if not decision.dropped:
            return Store(header, view, decision, _run(sequenced))
        self._count(decision, sequenced, idempotent, client)
        original = repeated = None
        if not decision.keep:  # so every record has the headers: the first tells where the batch was stored
            repeated = sequenced.names[0], sequenced.ids[0]
            original = self.runs.offset_of(*repeated)
            if not idempotent:
                return Answer(ErrorCode.NONE, base_offset=original)
        spans = record_spans(header, records.data, records.start)
        kept = [spans[i] for i in decision.keep]  # (start, end, timestamp delta)
        max_timestamp = max((header.base_timestamp + r[2] for r in kept), default=header.max_timestamp)
        rewritten = keep_records(header, records.data, [(r[0], r[1]) for r in kept], max_timestamp)
        [(new_header, new_view)] = split_batches(rewritten)
        return Store(new_header, new_view, decision, _run(sequenced, decision.keep), original, repeated)

    def _whole_run(self, header: BatchHeader, view: memoryview, raw_name: bytes, first: int,
                   last: int) -> Store | Answer | None:
        """A batch the walk read as a run (a producer's usual batch: one name, each record the next id), all new:
        stored as sent, decided with one look at the state and nothing built per record; INVALID_RECORD for a bad
        name. None when the run is not all new: `filter` judges it record by record."""
        last_raw, name = self._run_name
        if raw_name != last_raw:  # a partition mostly hears the same few names: the last one's checks are kept
            try:
                name = run_producer_name(raw_name)
            except RecordBatchError as exc:
                return Answer(ErrorCode(exc.error_code), str(exc))
            self._run_name = raw_name, name
        decision = judge_run(self._dedup, name, range(first, last + 1), header.records_count, True)
        if decision is None:
            return None
        return Store(header, view, decision, Run(name, first, last, 0, True))

    def judge(self, sequenced: SequencedRecords, count: int) -> RecordsDecision:
        """The decision for a batch of `count` records: at once when its records with the headers carry one name
        and are all new, else record by record."""
        if sequenced.name is not None:
            decision = judge_run(self._dedup, sequenced.name, sequenced.ids, count, sequenced.rising)
            if decision is not None:
                return decision
        return judge_records(self._dedup, _per_record(sequenced, count))

    def _count(self, decision: RecordsDecision, sequenced: SequencedRecords, idempotent: bool,
               client: Mapping[str, str] | None) -> None:
        self.dropped += len(decision.dropped)
        if idempotent:
            return
        self.dropped_without_idempotence += len(decision.dropped)
        at = dict(zip(sequenced.indexes, zip(sequenced.names, sequenced.ids)))
        for index in decision.dropped:
            name, sequence_id = at[index]
            if name in self._warned or len(self._warned) >= MAX_WARNED_NAMES:
                continue
            self._warned.add(name)
            log.warning("%s: kop.sequence.id %d of producer name %r is not above the highest stored: dropped as a "
                        "duplicate. A producer without idempotence that retries with more than one request in "
                        "flight can reorder records and lose them this way; enable idempotence (logged once per "
                        "name)", self._log_name, sequence_id, name, extra=client)


def _per_record(sequenced: SequencedRecords, count: int) -> list[tuple[str | None, int | None]]:
    """(name, id) of each of the batch's `count` records; (None, None) for one without the headers."""
    records: list[tuple[str | None, int | None]] = [(None, None)] * count
    for index, name, sequence_id in zip(sequenced.indexes, sequenced.names, sequenced.ids):
        records[index] = (name, sequence_id)
    return records


def _run(sequenced: SequencedRecords, kept: Sequence[int] | None = None) -> Run | None:
    """The run the records a batch stores are (all of them, or those `kept`), if those with the headers carry one
    name. The records kept keep their offset deltas, so a rewritten batch's run is told like a whole one's."""
    if sequenced.name is None:
        return None
    ids, indexes = sequenced.ids, sequenced.indexes
    if kept is not None:
        keep = set(kept)
        pairs = [(index, sequence_id) for index, sequence_id in zip(indexes, ids) if index in keep]
        if not pairs:
            return None
        indexes, ids = [index for index, _ in pairs], [sequence_id for _, sequence_id in pairs]
    first, last = ids[0], ids[-1]
    consecutive = last - first == len(ids) - 1 == indexes[-1] - indexes[0]
    return Run(sequenced.name, first, last, indexes[0], consecutive)
