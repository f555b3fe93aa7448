"""The cleaner's work on one partition, run off the event loop: read the closed ledgers of the cleanable range, find
the latest record of each key, and write each ledger that holds records to remove again. For the file engine (in the
cleaner's own process) a rewrite is whole new files beside the original (`{id}.log.compacting`, `{id}.idx.compacting`),
which the broker installs (kop/ledger/file_ledger.py) by renaming them over the original on its event loop; for the
PostgreSQL engine (in a thread: its entries are in the broker's memory) it is the new bytes of each entry that
changed, which the engine stores in one fenced transaction (kop/ledger/postgres/ledger.py). Nothing here touches what
readers see, so a crash at any point leaves either the original or the complete rewrite, never a half-written ledger.

What a rewrite keeps, as Kafka's log cleaner does:
* every entry, with its first offset, span and metadata: offsets never change, and the records removed leave holes;
* every batch's base offset, lastOffsetDelta, producer id, epoch and base sequence, so PIP-6 recovery and the Kafka
  producer state rebuild from it exactly as before. A batch whose records all go is kept as an empty batch (kop keeps
  every one; Kafka drops those its producer state no longer needs);
* the batch's max timestamp, so the ledger's time index stays true;
* a record whose key has a later version in the range is removed; a tombstone (null value) that is its key's latest
  is removed once its ledger closed more than delete.retention.ms ago; a record without a key stays;
* a transaction's records count once its marker (COMMIT or ABORT, the producer's next control batch) is in the range:
  a committed transaction's are compacted like any others, an aborted one's all go (its batches stay, empty, with
  their transactional flag). A transaction whose marker is not in the range yet (still open, or decided in a ledger
  not cleanable yet) stays whole and supersedes nothing: it may still abort. Markers stay (kop keeps them: the
  transaction index and the last stable offset are rebuilt from them).
"""
import os
import threading
import time
from dataclasses import dataclass, field

from kop.compaction.throttle import Throttle
from kop.ledger.framed_file import read_record
from kop.ledger.ledger_file import INDEX_RECORD, RawEntry, decode_entry, encode_entry
from kop.ledger.rewrites import COMPACTING_SUFFIX, LedgerSnapshot, RewrittenLedger
from protocol.compression import NONE
from protocol.records import BatchHeader, Record, build_batch, control_marker, iter_records, split_batches



@dataclass(frozen=True)
class CompactionJob:
    name: str
    token: str  # unique to this job, in its files' names
    ledgers: tuple[LedgerSnapshot, ...]  # the cleanable range, oldest first
    tombstone_horizon_ms: int  # tombstones in ledgers closed before this go
    max_entry_bytes: int
    fsync: bool
    io_bytes_per_second: float = float("inf")  # reads and writes together
    stop: threading.Event | None = None  # in a thread (entries in memory): set when the broker shuts down


@dataclass
class CompactionResult:
    rewritten: list[RewrittenLedger] = field(default_factory=list)
    keys: int = 0
    records_read: int = 0
    records_removed: int = 0
    tombstones_removed: int = 0
    aborted_removed: int = 0  # records of aborted transactions
    bytes_before: int = 0  # of the ledgers rewritten
    bytes_after: int = 0


class LedgerChanged(Exception):
    """A ledger could not be read as snapshotted (deleted by retention meanwhile): this pass is dropped."""


class CleanerStopped(Exception):
    """The broker is shutting down: a pass in a thread of its process ends rather than hold the exit up."""


YIELD_EVERY_S = 0.002  # in a thread: how long the pass holds the interpreter lock before it lets the event loop in
YIELD_S = 0.0002


def _entries(ledger: LedgerSnapshot, job: CompactionJob, throttle: Throttle):
    if ledger.entries is not None:  # an engine holding its entries in memory: a thread of the broker's process
        held_since = time.perf_counter()
        for entry in ledger.entries:
            if job.stop is not None and job.stop.is_set():
                raise CleanerStopped(job.name)
            if time.perf_counter() - held_since >= YIELD_EVERY_S:
                # A real sleep, not sleep(0): the event loop thread waiting for the lock gets it now rather than
                # after the interpreter's switch interval, so its ticks are not held up by the pass.
                time.sleep(YIELD_S)
                held_since = time.perf_counter()
            throttle.spend(len(entry.data))
            yield entry
        return
    max_entry_bytes = job.max_entry_bytes
    fd = os.open(ledger.log_path, os.O_RDONLY)
    try:
        for entry_id, pos in enumerate(ledger.positions):
            payload = read_record(fd, pos, ledger.size, max_entry_bytes)
            if payload is None:
                raise LedgerChanged(f"{ledger.log_path}: entry {entry_id} unreadable")
            throttle.spend(len(payload))
            yield decode_entry(entry_id, payload)
    finally:
        os.close(fd)


@dataclass
class RangeView:
    """What the first pass learns of the range: each key's latest offset among the records that count (those outside
    transactions, and those of transactions committed in the range), and the transactions decided in the range (the
    base offset of each of their data batches: True committed, False aborted)."""
    latest: dict[bytes, int] = field(default_factory=dict)
    decided: dict[int, bool] = field(default_factory=dict)
    read: int = 0

    def count(self, records: list[tuple[bytes, int]]) -> None:
        for key, offset in records:
            if self.latest.get(key, -1) < offset:
                self.latest[key] = offset

    def status(self, header: BatchHeader) -> bool | None:
        """True: its records are compacted; False: they all go (an aborted transaction's); None: it stays whole (a
        marker, or a transaction not decided in the range)."""
        if header.is_control:
            return None
        if header.is_transactional:
            return self.decided.get(header.base_offset)
        return True


def read_range(job: CompactionJob, throttle: Throttle) -> RangeView:
    view = RangeView()
    pending: dict[int, tuple[list[int], list[tuple[bytes, int]]]] = {}  # producer id -> its open transaction's
    for ledger in job.ledgers:                                          # batches and keyed records
        for entry in _entries(ledger, job, throttle):
            (header, _), = split_batches(entry.data)
            if header.is_control:
                batches, records = pending.pop(header.producer_id, ([], []))
                commit = control_marker(next(iter_records(entry.data))).commit
                view.decided.update((base, commit) for base in batches)
                if commit:
                    view.count(records)
                continue
            keyed = []
            for record in iter_records(entry.data):
                view.read += 1
                if record.key is not None:
                    keyed.append((record.key, record.offset))
            if header.is_transactional:
                batches, records = pending.setdefault(header.producer_id, ([], []))
                batches.append(header.base_offset)
                records.extend(keyed)
            else:
                view.count(keyed)
    return view  # what is still pending: transactions not decided in the range, which count for nothing


def _removable(record: Record, latest: dict[bytes, int], drop_tombstones: bool) -> bool:
    if record.key is None:
        return False
    return latest[record.key] > record.offset or (record.value is None and drop_tombstones)


def _kept(entry: RawEntry, view: RangeView,
          drop_tombstones: bool) -> tuple[BatchHeader, list[Record], list[Record]]:
    """The batch's header, its records, and those it keeps."""
    (header, _), = split_batches(entry.data)
    status = view.status(header)
    records = list(iter_records(entry.data)) if status is not None else []
    if status is None:
        return header, records, records
    if status is False:
        return header, records, []
    return header, records, [r for r in records if not _removable(r, view.latest, drop_tombstones)]


def _needs_rewrite(ledger: LedgerSnapshot, job: CompactionJob, view: RangeView, throttle: Throttle) -> bool:
    drop_tombstones = ledger.closed_ms < job.tombstone_horizon_ms
    for entry in _entries(ledger, job, throttle):
        _, records, kept = _kept(entry, view, drop_tombstones)
        if len(kept) < len(records):
            return True
    return False


def _rewrite_entry(entry: RawEntry, view: RangeView, drop_tombstones: bool,
                   result: CompactionResult) -> bytes | memoryview:
    """The entry's batch without its removable records (the batch itself when it keeps them all)."""
    header, records, kept = _kept(entry, view, drop_tombstones)
    if len(kept) == len(records):
        return entry.data
    result.records_removed += len(records) - len(kept)
    if header.is_transactional and not kept and view.decided.get(header.base_offset) is False:
        result.aborted_removed += len(records)
    else:
        result.tombstones_removed += sum(1 for r in records if r.value is None) - \
            sum(1 for r in kept if r.value is None)
    return build_batch(kept, base_offset=header.base_offset, producer_id=header.producer_id,
                       producer_epoch=header.producer_epoch, base_sequence=header.base_sequence,
                       transactional=header.is_transactional,
                       compression=header.compression if kept else NONE, timestamp_type=header.timestamp_type,
                       max_timestamp=header.max_timestamp, last_offset_delta=header.last_offset_delta,
                       partition_leader_epoch=header.partition_leader_epoch)


def _rewrite_ledger(ledger: LedgerSnapshot, job: CompactionJob, view: RangeView,
                    result: CompactionResult, throttle: Throttle) -> RewrittenLedger:
    drop_tombstones = ledger.closed_ms < job.tombstone_horizon_ms
    rewritten = ((entry, _rewrite_entry(entry, view, drop_tombstones, result))
                 for entry in _entries(ledger, job, throttle))
    if ledger.entries is not None:
        return _rewrite_in_memory(ledger, rewritten)
    return _rewrite_files(ledger, job, rewritten, throttle)


def _rewrite_in_memory(ledger: LedgerSnapshot, rewritten) -> RewrittenLedger:
    """The framed bytes of each entry that changed, for the engine to store in place of the old ones."""
    changed, size = [], 0
    for entry, data in rewritten:
        size += len(data)
        if data is not entry.data:
            changed.append((entry.entry_id, encode_entry(entry.first_index, entry.span, entry.metadata, data)))
    return RewrittenLedger(ledger.ledger_id, "", "", (), size, ledger.size, tuple(changed))


def _rewrite_files(ledger: LedgerSnapshot, job: CompactionJob, rewritten, throttle: Throttle) -> RewrittenLedger:
    """Write the ledger again beside itself, entry by entry (memory holds one entry and the index)."""
    suffix = f"{COMPACTING_SUFFIX}-{job.token}"
    log_path, idx_path = ledger.log_path + suffix, ledger.idx_path + suffix
    index, positions = [], []
    size = 0
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for entry, data in rewritten:
            record = encode_entry(entry.first_index, entry.span, entry.metadata, data)
            os.write(fd, record)
            throttle.spend(len(record))
            index.append(INDEX_RECORD.pack(entry.first_index, size))
            positions.append(size)
            size += len(record)
        if job.fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    fd = os.open(idx_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, b"".join(index))  # not synced: an index is checked against its log on open
    finally:
        os.close(fd)
    return RewrittenLedger(ledger.ledger_id, log_path, idx_path, tuple(positions), size, ledger.size)


def compact(job: CompactionJob) -> CompactionResult:
    """Run in the cleaner process. Raises LedgerChanged when a ledger went away while it was read."""
    result = CompactionResult()
    throttle = Throttle(job.io_bytes_per_second)
    view = read_range(job, throttle)
    result.records_read, result.keys = view.read, len(view.latest)
    for ledger in job.ledgers:
        if not _needs_rewrite(ledger, job, view, throttle):
            continue
        rewritten = _rewrite_ledger(ledger, job, view, result, throttle)
        result.rewritten.append(rewritten)
        result.bytes_before += rewritten.size_before
        result.bytes_after += rewritten.size
    return result
