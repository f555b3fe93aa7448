"""Kafka's idempotent-producer rules for one partition, on top of the PIP-6 core.

The answer table is in docs/architecture.md#the-kafka-rules-the-answer-table (rules 1-12). Per producer id this
keeps the current epoch, the last five persisted batches of that epoch (Kafka's window, so a retry gets its original
offset) and the batches still being written. The PIP-6 core holds the sequence ids, under the name
`"{prefix}-{producerId}-{epoch}"`, unwrapped to int64 (`dedup.sequences`).

The caller, one partition at a time and with no `await` between a decision and what it does with it:

    decision = producers.check(pid, epoch, base_sequence, last_offset_delta)
    Accept      -> assign offsets; write the entry (metadata: decision's name/sequence ids, pid, epoch,
                   publish_time); pending = producers.on_pushed(decision, base, last, publish_time); then
                   producers.on_persisted(pending, position) or, on a failed write, producers.on_write_failed(code)
                   once every write before the failed one has reported (the storage's failure path, in log order)
    Duplicate   -> answer NONE with the original base offset (no write)
    WaitFor     -> await its future: a Duplicate to answer, or WriteFailed(code) to answer; REQUEST_TIMED_OUT if the
                   request's timeout passes first
    DecideAgain -> await its future (the producer's writes in flight finished), then call check() again
    Reject      -> answer its error code (REQUEST_TIMED_OUT while the dedup state is being recovered: the retry comes
                   after the recovery, or after a retry of it, and is judged then; until the client has resent it, the
                   batches pipelined behind it get the same answer, so none overtakes it)

Entries without a producer id (and control batches) bypass `check` but still report `on_persisted(None, position)`
so the snapshot counter sees every entry.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from dedup import kafka_snapshot
from dedup.interfaces import Position, ReplayEntry
from dedup.message_deduplication import DupStatus, MessageDeduplication
from dedup.sequences import MAX_SEQUENCE, SEQUENCE_MODULUS, to_wire, unwrap
from proto.kop_pb2 import MessageMetadata
from protocol.errors import ErrorCode

log = logging.getLogger(__name__)

DEFAULT_NAME_PREFIX = "KOP-PID"
RECENT_BATCHES = 5  # Kafka's NUM_BATCHES_TO_RETAIN, and every client's in-flight cap



# -- decisions ---------------------------------------------------------------------------------------------------


class Accept(NamedTuple):  # a NamedTuple, not a frozen dataclass: built for every batch, 3x cheaper to build
    """Write the batch; store these ids in its MessageMetadata."""

    producer_id: int
    producer_epoch: int
    producer_name: str
    sequence_id: int
    highest_sequence_id: int


@dataclass(frozen=True, slots=True)
class Duplicate:
    """Already stored: answer NONE with the original offsets (no write)."""

    base_offset: int
    last_offset: int
    log_append_time: int


@dataclass(frozen=True, slots=True)
class WaitFor:
    """A retry of a batch still being written: its future gives the original's Duplicate, or raises WriteFailed."""

    future: asyncio.Future[Duplicate]


@dataclass(frozen=True, slots=True)
class DecideAgain:
    """Not decidable while the producer has writes in flight (PIP-6 Unknown); the future completes when they end."""

    future: asyncio.Future[None]


@dataclass(frozen=True, slots=True)
class Reject:
    error_code: int
    message: str


Decision = Accept | Duplicate | WaitFor | DecideAgain | Reject


class WriteFailed(Exception):
    """The write a WaitFor was waiting on failed; answer the same retriable error."""

    def __init__(self, error_code: int) -> None:
        super().__init__(f"the original write failed with error {error_code}")
        self.error_code = error_code


# -- state -------------------------------------------------------------------------------------------------------


class BatchMetadata(NamedTuple):  # built for every batch, like Accept
    epoch: int
    first_seq: int  # int64, unwrapped
    last_seq: int
    base_offset: int  # what the batch and its retries are answered: where it is stored, but for an empty batch
    last_offset: int  # standing for records stored before (`acknowledged_range`)
    timestamp: int  # the entry's publish time (log-append time)

    def same_batch(self, epoch: int, first_seq: int, last_seq: int) -> bool:
        return (self.epoch, self.first_seq, self.last_seq) == (epoch, first_seq, last_seq)


class PendingBatch:
    """A batch accepted and not yet durable; the handle the caller passes back to `on_persisted`."""

    __slots__ = ("producer_id", "producer_name", "batch", "tracked", "waiters")

    def __init__(self, producer_id: int, producer_name: str, batch: BatchMetadata, tracked: bool = True) -> None:
        self.producer_id = producer_id
        self.producer_name = producer_name
        self.batch = batch
        self.tracked = tracked  # False: accepted while dedup was not enabled; only its identity is kept
        # The retries waiting for its outcome. Rare, so None until the first: the list would cost every batch.
        self.waiters: list[asyncio.Future[Duplicate]] | None = None

    def waiter(self) -> asyncio.Future[Duplicate]:
        # One future per waiter: a waiter that times out cancels only its own.
        future: asyncio.Future[Duplicate] = asyncio.get_running_loop().create_future()
        future.add_done_callback(_mark_exception_retrieved)
        if self.waiters is None:
            self.waiters = []
        self.waiters.append(future)
        return future

    def succeed(self) -> None:
        b = self.batch
        for future in self.waiters or ():
            if not future.done():
                future.set_result(Duplicate(b.base_offset, b.last_offset, b.timestamp))

    def fail(self, error_code: int) -> None:
        for future in self.waiters or ():
            if not future.done():
                future.set_exception(WriteFailed(error_code))


def acknowledged_range(base_offset: int, last_offset_delta: int) -> tuple[int, int]:
    """The (base, last) offsets a batch answered at `base_offset` instead of where it is stored is remembered with:
    an empty batch standing for records stored before (-1: where is not known)."""
    return (base_offset, base_offset + last_offset_delta) if base_offset >= 0 else (-1, -1)


def _mark_exception_retrieved(future: asyncio.Future[object]) -> None:
    # A waiter whose request went away must not log "exception was never retrieved".
    if not future.cancelled():
        future.exception()


@dataclass(slots=True)
class _Producer:
    epoch: int  # the newest epoch accepted (pushed); decisions use this one
    persisted_epoch: int | None = None  # the epoch of `persisted`; None until a batch is durable
    persisted: deque[BatchMetadata] = field(default_factory=lambda: deque(maxlen=RECENT_BATCHES))
    pending: deque[PendingBatch] = field(default_factory=deque)
    idle_waiters: list[asyncio.Future[None]] = field(default_factory=list)
    # (epoch, its producer name), kept by on_pushed: the next batch of that epoch reuses the string (and its hash)
    # instead of formatting a new one. Keyed by the epoch, so it can be stale but never wrong.
    named: tuple[int | None, str] = (None, "")

    def cached(self, epoch: int, first_seq: int, last_seq: int) -> BatchMetadata | PendingBatch | None:
        for pending in self.pending:
            if pending.batch.same_batch(epoch, first_seq, last_seq):
                return pending
        for batch in self.persisted:
            if batch.same_batch(epoch, first_seq, last_seq):
                return batch
        return None

    def wait_idle(self) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.idle_waiters.append(future)
        return future

    def notify_idle(self) -> None:
        for future in self.idle_waiters:
            if not future.done():
                future.set_result(None)
        self.idle_waiters.clear()


@dataclass(frozen=True, slots=True)
class ProducerSnapshot:
    """A producer's durable state, as a snapshot keeps it (for stats and for tests)."""

    epoch: int
    batches: tuple[BatchMetadata, ...]


@dataclass(frozen=True, slots=True)
class _OwedResend:
    """Sequences of a producer that were answered a retriable error and not stored: its writes that failed when the
    partition was fenced, or its batches that came while the dedup state was being recovered and could not be
    judged. Until the producer has resent them, any later batch of its epoch was pipelined behind them (already in
    flight, or sent before the client saw the error): it is early, not out of order, and gets the same retriable
    error, so the client resends it after them. Taking it would lose them: the resend would then be at or below the
    stored sequence, a duplicate to every rule. OUT_OF_ORDER_SEQUENCE_NUMBER would make librdkafka bump its epoch and
    is fatal for aiokafka.

    Sequences are int64 values; those answered while recovering are wire values (nothing was known to unwrap them
    against), so comparisons go through `_near`."""

    epoch: int
    first_seq: int
    last_seq: int
    error_code: int
    since: float  # when it was last owed (dedup's clock): the inactivity purge expires it


_NOT_DUP = DupStatus.NOT_DUP  # an enum member lookup costs more than a dict lookup, on every batch

def _near(sequence: int, reference: int) -> int:
    """`sequence` as the int64 value closest to `reference` (a wire value and an unwrapped one compare right)."""
    return unwrap(to_wire(sequence), reference)


# -- the rules ---------------------------------------------------------------------------------------------------


class KafkaProducers:
    """Kafka producer state of one partition; attaches itself to `dedup` so it is snapshotted and recovered too."""

    def __init__(self, dedup: MessageDeduplication, name_prefix: str = DEFAULT_NAME_PREFIX) -> None:
        self._dedup = dedup
        self._prefix = name_prefix
        self._producers: dict[int, _Producer] = {}
        self._owed: dict[int, _OwedResend] = {}
        # Batches being written that the state does not follow (accepted while dedup was not enabled, or in
        # flight when it was reset), in log order: should dedup be wanted by the time one fails, its producer owes
        # the resend like any failed write.
        self._untracked: deque[PendingBatch] = deque()
        self._pushed_sequence_id = dedup.pushed_sequence_id  # a bound dict.get, read for every batch
        dedup.attach(self)

    def producer_name(self, producer_id: int, producer_epoch: int) -> str:
        return f"{self._prefix}-{producer_id}-{producer_epoch}"

    def epoch(self, producer_id: int) -> int | None:
        producer = self._producers.get(producer_id)
        return None if producer is None else producer.epoch

    def persisted_state(self) -> dict[int, ProducerSnapshot]:
        return {
            pid: ProducerSnapshot(p.persisted_epoch, tuple(p.persisted))
            for pid, p in self._producers.items()
            if p.persisted_epoch is not None
        }

    # -- decide ----------------------------------------------------------------------------------------------------

    def check(self, producer_id: int, producer_epoch: int, base_sequence: int, last_offset_delta: int,
              gaps_allowed: bool = False) -> Decision:
        """Decide one idempotent batch (producer_id >= 0, not a control batch), in the answer table's order (docs/architecture.md).
        `gaps_allowed`: a producer known here also from another cluster's replicated batches may be ahead of them
        (what it wrote there has not arrived yet): a batch after a gap, or a new epoch's first batch past sequence 0,
        starts it again here instead of OUT_OF_ORDER_SEQUENCE_NUMBER, as for a producer unknown here.

        Call it on the event loop: WaitFor and DecideAgain carry futures. Changes nothing; `on_pushed` does.
        """
        if producer_id < 0:
            raise ValueError("batches without a producer id bypass deduplication")
        if not 0 <= base_sequence <= MAX_SEQUENCE or last_offset_delta < 0:
            raise ValueError(f"bad sequence range: base {base_sequence}, last offset delta {last_offset_delta}")
        if not self._dedup.is_enabled:
            if self._dedup.awaiting_recovery:  # wanted, but the state to judge it by is not rebuilt yet
                self._owe(producer_id, producer_epoch, base_sequence, base_sequence + last_offset_delta,
                          ErrorCode.REQUEST_TIMED_OUT)
                return Reject(ErrorCode.REQUEST_TIMED_OUT,
                              "the partition's deduplication state is being recovered, retry")
            return Accept(producer_id, producer_epoch, self.producer_name(producer_id, producer_epoch), base_sequence,
                          base_sequence + last_offset_delta)

        producer = self._producers.get(producer_id)
        if producer is not None and producer.named[0] == producer_epoch:
            name = producer.named[1]
        else:
            name = self.producer_name(producer_id, producer_epoch)
        if producer is not None and producer_epoch < producer.epoch:
            return Reject(ErrorCode.INVALID_PRODUCER_EPOCH,
                          f"producer {producer_id}: epoch {producer_epoch} is older than the current epoch "
                          f"{producer.epoch}")
        if self._owed:
            early = self._ahead_of_owed_resend(producer_id, producer_epoch, base_sequence, name)
            if early is not None:
                return early
        if producer is not None and producer_epoch > producer.epoch:
            if gaps_allowed:
                return Accept(producer_id, producer_epoch, name, base_sequence, base_sequence + last_offset_delta)
            if base_sequence != 0:
                return Reject(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                              f"producer {producer_id}: new epoch {producer_epoch} must start at sequence 0, got "
                              f"{base_sequence}")
            return Accept(producer_id, producer_epoch, name, 0, last_offset_delta)

        last_pushed = self._pushed_sequence_id(name)
        if last_pushed is None:  # nothing known for this producer: any sequence starts it (Kafka >= 2.5, never 59)
            return Accept(producer_id, producer_epoch, name, base_sequence, base_sequence + last_offset_delta)
        if base_sequence == (last_pushed + 1) % SEQUENCE_MODULUS:
            # The next batch, the common case. Never a retry: every cached batch ends at or below pushed.
            return Accept(producer_id, producer_epoch, name, last_pushed + 1, last_pushed + 1 + last_offset_delta)

        first = unwrap(base_sequence, last_pushed)
        last = first + last_offset_delta
        cached = producer.cached(producer_epoch, first, last) if producer is not None else None
        if isinstance(cached, BatchMetadata):
            return Duplicate(cached.base_offset, cached.last_offset, cached.timestamp)
        if isinstance(cached, PendingBatch):
            return WaitFor(cached.waiter())
        if first > last_pushed + 1:
            if gaps_allowed:
                return Accept(producer_id, producer_epoch, name, first, last)
            return Reject(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                          f"producer {producer_id}: out of order sequence, expected {to_wire(last_pushed + 1)}, got "
                          f"{base_sequence}")
        last_persisted = self._dedup.persisted_sequence_id(name)
        if last_persisted is not None and first <= last_persisted:
            if last <= last_persisted:  # stored, but older than the cached window: success with no offset
                return Reject(ErrorCode.DUPLICATE_SEQUENCE_NUMBER,
                              f"producer {producer_id}: sequence {base_sequence} is already stored")
            return Reject(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                          f"producer {producer_id}: batch {base_sequence}..{to_wire(last)} overlaps stored sequences")
        if producer is None or not producer.pending:
            return Reject(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                          f"producer {producer_id}: sequence {base_sequence} was already used")
        # PIP-6 Unknown and not an exact retry: decide once the writes in flight have landed or failed.
        return DecideAgain(producer.wait_idle())

    def _ahead_of_owed_resend(self, producer_id: int, producer_epoch: int, base_sequence: int,
                              name: str) -> Reject | None:
        owed = self._owed.get(producer_id)
        if owed is None or owed.epoch != producer_epoch:
            return None
        last_pushed = self._pushed_sequence_id(name)
        if last_pushed is None:
            expected = owed.first_seq
        elif _near(owed.last_seq, last_pushed) <= last_pushed:  # stored after all (replayed, or reported late)
            del self._owed[producer_id]
            return None
        else:
            expected = last_pushed + 1
        if unwrap(base_sequence, expected - 1) > expected:
            return Reject(owed.error_code, f"producer {producer_id}: sequence {base_sequence} follows batches that "
                                           f"were not stored; resend from {to_wire(expected)} first")
        return None

    # -- follow the write ------------------------------------------------------------------------------------------

    def on_pushed(self, accept: Accept, base_offset: int, last_offset: int, timestamp: int) -> PendingBatch:
        """Record an accepted batch as being written (right after `check`, offsets assigned). With dedup not
        enabled the handle is untracked: it only carries the batch's identity to `on_persisted`."""
        producer_id, epoch, name, first, last = accept
        if not self._dedup.is_enabled:
            untracked = PendingBatch(producer_id, name, BatchMetadata(epoch, first, last, base_offset, last_offset,
                                                                      timestamp), tracked=False)
            self._untracked.append(untracked)
            return untracked
        status = self._dedup.is_duplicate(name, first, last)
        if status is not _NOT_DUP:
            raise RuntimeError(f"{accept} was overtaken by another write before on_pushed ({status.value})")
        producer = self._producers.get(producer_id)
        if producer is None:
            producer = self._producers[producer_id] = _Producer(epoch=epoch)
        producer.epoch = epoch
        if producer.named[0] != epoch:
            producer.named = (epoch, name)
        if producer.persisted_epoch != epoch and producer.persisted_epoch is not None:
            # An epoch bump in flight: the persisted epoch's name goes once the bump lands, not by a purge meanwhile.
            self._dedup.producer_added(self.producer_name(producer_id, producer.persisted_epoch))
        if self._owed:
            owed = self._owed.get(producer_id)
            if owed is not None and (owed.epoch != epoch or last >= _near(owed.last_seq, last)):
                del self._owed[producer_id]  # resent up to where the error left it: the usual rules again
        pending = PendingBatch(producer_id, name, BatchMetadata(epoch, first, last, base_offset, last_offset, timestamp))
        producer.pending.append(pending)
        return pending

    def on_persisted(self, pending: PendingBatch | None, position: Position) -> None:
        """The entry at `position` is durable (call in log order). `pending=None`: an entry dedup does not track."""
        if pending is None:
            self._dedup.record_persisted(None, 0, 0, position)
            return
        if not pending.tracked:
            if self._untracked:
                if self._untracked[0] is pending:
                    self._untracked.popleft()
                elif pending in self._untracked:  # not the oldest: one reported out of order
                    self._untracked.remove(pending)
            self._persisted_untracked(pending, position)
            return
        batch = pending.batch
        producer = self._producers.get(pending.producer_id)
        if producer is not None and producer.pending and producer.pending[0] is pending:  # writes land in order
            producer.pending.popleft()
            persisted = producer.persisted
            if batch.epoch == producer.persisted_epoch and (not persisted or persisted[-1].last_seq < batch.last_seq):
                persisted.append(batch)  # the next batch of the epoch, the common case of _apply_persisted
            else:
                self._apply_persisted(pending.producer_id, producer, batch)
            if pending.waiters is not None:
                pending.succeed()
            if not producer.pending and producer.idle_waiters:
                producer.notify_idle()
        else:  # failed or reset meanwhile; the entry is durable all the same
            log.warning("persisted batch %s of producer %d was no longer pending", batch, pending.producer_id)
            self._persisted_untracked(pending, position)
            return
        # After the batch state, so a snapshot this triggers contains it.
        self._dedup.record_persisted(pending.producer_name, batch.first_seq, batch.last_seq, position,
                                     not producer.pending)

    def _persisted_untracked(self, pending: PendingBatch, position: Position) -> None:
        """A batch the state does not expect landed: accepted while dedup was not enabled, or failed or reset
        meanwhile (reported durable after a later write's failure, against the contract). It is stored all the same,
        so, if dedup is enabled by now, it counts as a replay would count it: a snapshot at or after `position`
        holds its sequence, a retry of it is a duplicate, and it is no longer owed as a failed write."""
        if not self._dedup.is_enabled:
            return
        batch, producer_id = pending.batch, pending.producer_id
        producer = self._producers.get(producer_id)
        if producer is not None and batch.epoch < producer.epoch:  # superseded meanwhile: only counted
            self._dedup.record_persisted(None, 0, 0, position)
            return
        if producer is None:
            producer = self._producers[producer_id] = _Producer(epoch=batch.epoch)
        producer.epoch = batch.epoch
        self._apply_persisted(producer_id, producer, batch)
        self._dedup.record_untracked(pending.producer_name, batch.first_seq, batch.last_seq, position,
                                     not producer.pending)

    def on_write_failed(self, error_code: int) -> None:
        """A write failed and the partition is fenced: fail every write in flight with `error_code` (retriable),
        and go back to what is persisted so the client's retries are accepted again. Report the writes that did
        succeed (`on_persisted`) first."""
        if self._untracked:  # accepted before dedup was enabled (or while it was off)
            if self._dedup.is_enabled or self._dedup.awaiting_recovery:
                for pending in self._untracked:
                    b = pending.batch
                    self._owe(pending.producer_id, b.epoch, b.first_seq, b.last_seq, error_code)
            self._untracked.clear()
        for producer_id, producer in list(self._producers.items()):
            if not producer.pending:
                continue
            epoch = producer.pending[-1].batch.epoch
            batches = [p.batch for p in producer.pending if p.batch.epoch == epoch]
            self._owe(producer_id, epoch, batches[0].first_seq, batches[-1].last_seq, error_code)
            for pending in producer.pending:
                pending.fail(error_code)
            producer.pending.clear()
            producer.notify_idle()
            if producer.persisted_epoch is None:
                del self._producers[producer_id]
            else:
                producer.epoch = producer.persisted_epoch
                self._dedup.producer_removed(self.producer_name(producer_id, producer.persisted_epoch))
        self._dedup.reset_pushed_to_persisted()

    def refuse(self, accept: Accept, error_code: int) -> None:
        """A batch `check` accepted is answered the retriable `error_code` after all, and not written (instead of
        `on_pushed`): its producer owes the resend, so the batches pipelined behind it do not overtake it."""
        producer_id, epoch, _name, first, last = accept
        self._owe(producer_id, epoch, first, last, error_code)

    def owe(self, producer_id: int, epoch: int, first: int, last: int, error_code: int) -> None:
        """The producer was answered `error_code` for wire sequences first..last before this state could judge
        them (another layer refused them: the partition was not open here yet): it owes their resend."""
        self._owe(producer_id, epoch, first, last, error_code)

    def _owe(self, producer_id: int, epoch: int, first: int, last: int, error_code: int) -> None:
        """The producer was answered `error_code` for sequences first..last, which are not stored."""
        earlier = self._owed.pop(producer_id, None)
        if earlier is not None and earlier.epoch == epoch:  # owed again while resending: cover both
            first, last = min(first, _near(earlier.first_seq, first)), max(last, _near(earlier.last_seq, last))
        # One record per producer id, kept until its producer resends or is purged for inactivity (`expire`):
        # never dropped to bound memory, as a dropped record would let the batches behind the owed one through.
        self._owed[producer_id] = _OwedResend(epoch, first, last, error_code, self._dedup.now())

    # -- transaction markers ---------------------------------------------------------------------------------------

    def on_marker_pushed(self, producer_id: int, epoch: int) -> None:
        """A COMMIT or ABORT marker of `epoch` is handed to the log (its epoch checked: not older than the
        producer's). A newer epoch than the producer's fences the older one from now on, as Kafka's
        appendEndTxnMarker does: a coordinator that aborted a timed-out transaction under a bumped epoch leaves its
        old producer no way to write here."""
        if not self._dedup.is_enabled:
            return
        producer = self._producers.get(producer_id)
        if producer is None:
            self._producers[producer_id] = _Producer(epoch=epoch)
        elif epoch > producer.epoch:
            producer.epoch = epoch

    def on_marker_persisted(self, producer_id: int, epoch: int) -> None:
        """The marker is durable: a newer epoch becomes the producer's persisted one, with no batch yet (its first
        must be sequence 0), kept by snapshots and rebuilt by replay (`replay_marker`)."""
        if self._dedup.is_enabled:
            self._apply_marker(producer_id, epoch)

    def replay_marker(self, metadata: MessageMetadata) -> None:
        """A transaction marker written here, replayed: what `on_marker_persisted` did when it was stored."""
        if metadata.producer_id >= 0:
            self._apply_marker(metadata.producer_id, metadata.producer_epoch)

    def _apply_marker(self, producer_id: int, epoch: int) -> None:
        producer = self._producers.get(producer_id)
        if producer is None:
            producer = self._producers[producer_id] = _Producer(epoch=epoch)
        elif producer.persisted_epoch is not None and epoch <= producer.persisted_epoch:
            return  # its own epoch's marker: the producer's state is as it was
        producer.epoch = max(producer.epoch, epoch)
        if producer.persisted_epoch is not None:  # the older epoch is gone for good, as after a batch's bump
            self._dedup.forget(self.producer_name(producer_id, producer.persisted_epoch))
        producer.persisted.clear()
        producer.persisted_epoch = epoch
        self._dedup.record_epoch_started(self.producer_name(producer_id, epoch))

    def _apply_persisted(self, producer_id: int, producer: _Producer, batch: BatchMetadata) -> None:
        if producer.persisted_epoch is None or batch.epoch > producer.persisted_epoch:
            if producer.persisted_epoch is not None:  # an epoch bump is durable: the old name is gone for good
                self._dedup.forget(self.producer_name(producer_id, producer.persisted_epoch))
            producer.persisted.clear()
            producer.persisted_epoch = batch.epoch
        elif batch.epoch < producer.persisted_epoch:
            return
        if producer.persisted and producer.persisted[-1].last_seq >= batch.last_seq:
            return  # replayed over a snapshot that already had it
        producer.persisted.append(batch)

    # -- DedupExtension: snapshot and recovery ---------------------------------------------------------------------

    def owns_property(self, key: str) -> bool:
        return key.startswith(kafka_snapshot.LEGACY_KEY_PREFIX)

    def reset(self, recovering: bool) -> None:
        in_flight = []
        for producer in self._producers.values():
            for pending in producer.pending:
                pending.fail(ErrorCode.REQUEST_TIMED_OUT)
                pending.tracked = False  # still being written, now as a write the state does not follow
                in_flight.append(pending)
            producer.notify_idle()
        self._producers.clear()
        if in_flight:  # in log order, which offsets follow (but for an empty batch answered with an earlier offset,
            # which on_persisted finds all the same)
            self._untracked.extend(sorted(in_flight, key=lambda p: p.batch.base_offset))
        if not recovering:  # disabled: nothing is judged any more
            self._owed.clear()

    def capture(self) -> Callable[[Collection[str]], dict[str, str]]:
        """The recent batches of every producer, for the names the snapshot keeps (the cap leaves the others out,
        with their sequences). The epoch of a producer is the epoch of its batches."""
        state = [(producer_id, producer.persisted_epoch, tuple(producer.persisted))
                 for producer_id, producer in self._producers.items() if producer.persisted_epoch is not None]

        def pack(names: Collection[str]) -> dict[str, str]:
            return kafka_snapshot.pack(producer for producer in state
                                       if self.producer_name(producer[0], producer[1]) in names)

        return pack

    def restore(self, properties: Mapping[str, int], strings: Mapping[str, str]) -> None:
        for producer_id, epoch, batches in kafka_snapshot.unpack(strings, properties):
            producer = self._producers[producer_id] = _Producer(epoch=epoch, persisted_epoch=epoch)
            producer.persisted.extend(BatchMetadata._make(b) for b in batches if b[0] == epoch)

    def replay(self, entry: ReplayEntry) -> None:
        metadata = entry.metadata
        producer_id, epoch = metadata.producer_id, metadata.producer_epoch
        if producer_id < 0:
            return
        producer = self._producers.get(producer_id)
        if producer is None:
            producer = self._producers[producer_id] = _Producer(epoch=epoch)
        elif epoch < producer.epoch:  # older than a snapshot taken after it (a purge re-snapshot)
            self._dedup.forget(metadata.producer_name)
            return
        producer.epoch = epoch
        first, last = metadata.sequence_id, metadata.highest_sequence_id
        if producer.persisted and producer.persisted_epoch == epoch:
            reference = producer.persisted[-1].last_seq  # an entry from a dedup-off era holds wire sequences
            first = _near(first, reference)
            last = _near(last, first)
        base_offset, last_offset = entry.first_offset, entry.last_offset
        if metadata.HasField("acknowledged_offset"):  # answered with the offset of the records it stands for
            base_offset, last_offset = acknowledged_range(metadata.acknowledged_offset, last_offset - base_offset)
        batch = BatchMetadata(epoch, first, last, base_offset, last_offset, metadata.publish_time)
        self._apply_persisted(producer_id, producer, batch)

    def replayed_highest(self, metadata: MessageMetadata, known: int) -> int:
        if not metadata.producer_name.startswith(self._prefix + "-"):
            return max(metadata.sequence_id, metadata.highest_sequence_id)
        return _near(metadata.highest_sequence_id, known)  # unwrapped values are their own nearest

    def forget(self, names: Collection[str]) -> None:
        for producer_id, producer in list(self._producers.items()):
            if producer.persisted_epoch is None or producer.pending:
                continue
            if self.producer_name(producer_id, producer.persisted_epoch) in names:
                del self._producers[producer_id]
                self._owed.pop(producer_id, None)  # a purged producer starts afresh

    def expire(self, before: float) -> None:
        for producer_id in [pid for pid, owed in self._owed.items() if owed.since < before]:
            del self._owed[producer_id]  # never came back to resend (a producer unknown here has no name to purge)
