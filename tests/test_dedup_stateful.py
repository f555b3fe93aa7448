"""Dedup core + Kafka rules against a tiny reference model, under random sends, writes, failures, crashes, purges
of idle producers, runtime disable and enable, and a snapshot cap of one producer or many.

The model keeps every batch ever accepted, in three lists (reported persisted / durable but not yet reported / not
yet durable), and decides from that full history with the answer table; the system under test keeps only two maps
and five batches per producer, unwraps int32 sequences, snapshots into a cursor and recovers from it. A crash keeps
only what the in-memory ledger holds (durable entries and the cursor) and recovers a fresh instance from it.

What the model forgets, it forgets by rule, not by asking the code: a purge forgets a producer with nothing in flight
whose last write is older than the timeout; a runtime enable forgets all history (the cursor starts at the end); a
crash forgets a producer whose name the stored snapshot left out (the cap) for its batches before the snapshot's
position, which is all a replay cannot bring back. Forgotten producers start afresh (any sequence), so the stored log
is checked for gaps and duplicates only within one "era" of a producer.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from dedup.interfaces import BEFORE_FIRST, DEDUP_CURSOR_NAME
from dedup.kafka_producers import (
    DUPLICATE_SEQUENCE_NUMBER,
    INVALID_PRODUCER_EPOCH,
    OUT_OF_ORDER_SEQUENCE_NUMBER,
    REQUEST_TIMED_OUT,
    Accept,
    BatchMetadata,
    DecideAgain,
    Duplicate,
    KafkaProducers,
    PendingBatch,
    ProducerSnapshot,
    Reject,
    WaitFor,
    WriteFailed,
)
from dedup.memory import InMemoryCursor, InMemoryDedupLedger
from dedup.message_deduplication import DedupConfig, MessageDeduplication, Status
from dedup.sequences import MAX_SEQUENCE, SEQUENCE_MODULUS
from proto.kop_pb2 import MessageMetadata

PIDS = (1, 2)
NOT_LEADER_OR_FOLLOWER = 6
INACTIVITY_TIMEOUT = 500.0


def name(pid: int, epoch: int) -> str:
    return f"KOP-PID-{pid}-{epoch}"


# -- the reference model -------------------------------------------------------------------------------------------


@dataclass(eq=False)
class Batch:
    pid: int
    epoch: int
    first: int  # the sequence as the client means it (int64, never wrapped)
    last: int
    base_offset: int
    last_offset: int
    timestamp: int
    checked: bool = True  # accepted while dedup was enabled, so by the rules
    era: int = 0  # of its producer: a purge, a runtime disable or enable, or a state lost to the cap starts a new one
    position: tuple[int, int] | None = None  # once durable

    def metadata(self) -> BatchMetadata:
        return BatchMetadata(self.epoch, self.first, self.last, self.base_offset, self.last_offset, self.timestamp)


class Model:
    def __init__(self) -> None:
        self.completed: list[Batch] = []  # durable, persist reported
        self.written: list[Batch] = []  # durable, persist not yet reported
        self.pending: list[Batch] = []  # accepted, not durable
        self.failed: dict[int, tuple[int, int, int]] = {}  # pid -> (epoch, first, last) of writes that failed
        self.forgotten: set[int] = set()  # ids of completed batches that no longer decide anything
        self.enabled = True

    def of(self, pid: int) -> list[Batch]:
        return [b for b in self.done() + self.written + self.pending if b.pid == pid]

    def done(self, pid: int | None = None) -> list[Batch]:
        """Completed batches that still count, in log order."""
        return [b for b in self.completed if id(b) not in self.forgotten and pid in (None, b.pid)]

    def forget(self, batches: list[Batch]) -> None:
        self.forgotten.update(id(b) for b in batches)

    def in_flight(self, pid: int) -> list[Batch]:
        return [b for b in self.written + self.pending if b.pid == pid]

    def decide(self, pid: int, epoch: int, wire: int, count: int) -> tuple:
        if not self.enabled:  # dedup off: PIP-6 says NotDup, Kafka's rules are not applied either
            return ("accept", wire, wire + count - 1)
        mine = self.of(pid)
        if mine and epoch < mine[-1].epoch:
            return ("reject", INVALID_PRODUCER_EPOCH)
        if pid in self.failed and self.failed[pid][0] == epoch:
            # Sent behind writes that failed, before they were resent: retriable, so it comes again after them.
            _, failed_first, _ = self.failed[pid]
            same = [b for b in mine if b.epoch == epoch]
            expected = same[-1].last + 1 if same else failed_first
            first = min((wire + lap * SEQUENCE_MODULUS for lap in range(4)),
                        key=lambda v: (abs(v - (expected - 1)), v))
            if first > expected:
                return ("reject", NOT_LEADER_OR_FOLLOWER)
        if not mine:
            return ("accept", wire, wire + count - 1)
        current = mine[-1].epoch
        if epoch > current:
            return ("accept", 0, count - 1) if wire == 0 else ("reject", OUT_OF_ORDER_SEQUENCE_NUMBER)
        same = [b for b in mine if b.epoch == epoch]
        pushed = same[-1].last
        # The wire sequence means the non-negative value closest to the last one: search the nearby laps.
        first = min((wire + lap * SEQUENCE_MODULUS for lap in range(4)), key=lambda v: (abs(v - pushed), v))
        last = first + count - 1
        done = [b for b in self.done(pid) if b.epoch == epoch]
        for b in done[-5:]:
            if (b.first, b.last) == (first, last):
                return ("duplicate", b)
        for b in same:
            if b not in done and (b.first, b.last) == (first, last):
                return ("wait", b)
        if first == pushed + 1:
            return ("accept", first, last)
        if first > pushed + 1:
            return ("reject", OUT_OF_ORDER_SEQUENCE_NUMBER)
        persisted = done[-1].last if done else None
        if persisted is not None and first <= persisted:
            return ("reject", DUPLICATE_SEQUENCE_NUMBER if last <= persisted else OUT_OF_ORDER_SEQUENCE_NUMBER)
        return ("again",)

    @staticmethod
    def state(batches: list[Batch]) -> tuple[dict[str, int], dict[int, ProducerSnapshot]]:
        """What the durable `batches` mean: last sequence per current name, and the last five batches."""
        sequences, producers = {}, {}
        for pid in PIDS:
            mine = [b for b in batches if b.pid == pid]
            if not mine:
                continue
            epoch = mine[-1].epoch
            of_epoch = [b for b in mine if b.epoch == epoch]
            sequences[name(pid, epoch)] = of_epoch[-1].last
            producers[pid] = ProducerSnapshot(epoch, tuple(b.metadata() for b in of_epoch[-5:]))
        return sequences, producers


# -- storage doubles -----------------------------------------------------------------------------------------------


class FlakyCursor(InMemoryCursor):
    """Slow enough that a snapshot is often still in flight a step later; can be told to fail its next write."""

    fail_next = False

    async def mark_delete(self, position, properties):
        for _ in range(3):
            await asyncio.sleep(0)
        if self.fail_next:
            self.fail_next = False
            raise OSError("cursor write failed")
        await super().mark_delete(position, properties)


class FlakyLedger(InMemoryDedupLedger):
    """Its dedup cursor, also one created by a runtime enable, can be told to fail its next write."""

    async def open_cursor(self, name: str) -> InMemoryCursor:
        if name not in self.cursors:
            self.cursors[name] = FlakyCursor(self, self.last_position)
        return self.cursors[name]


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


async def _call(fn, *args):
    return fn(*args)


@dataclass
class Write:
    batch: Batch
    pending: PendingBatch | None
    metadata: MessageMetadata


# -- the machine ---------------------------------------------------------------------------------------------------


class DedupMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.clock = Clock()
        self.ledger = FlakyLedger()
        self.ledger.cursors[DEDUP_CURSOR_NAME] = FlakyCursor(self.ledger, BEFORE_FIRST)
        self.model = Model()
        self.sent: dict[int, list[Batch]] = {pid: [] for pid in PIDS}  # what clients may retry, dropped ones too
        self.unwritten: list[Write] = []
        self.unreported: list[tuple[Write, tuple[int, int]]] = []
        self.waiters: list[tuple[asyncio.Future, Batch | None, int]] = []
        self.dropped: set[int] = set()  # ids of batches whose write failed
        self.era = {pid: 0 for pid in PIDS}
        self.batch_at: dict[tuple[int, int], Batch] = {}
        self.next_offset = 0

    @initialize(cap=st.sampled_from([1, 100]))
    def configure(self, cap: int) -> None:
        """The snapshot cap (brokerDeduplicationMaxNumberOfProducers): 1 leaves a producer out of every snapshot."""
        self.config = DedupConfig(entries_interval=3, snapshot_interval_seconds=100, max_producers=cap)
        self.start()

    def start(self) -> None:
        self.dedup = MessageDeduplication(self.ledger, self.config, clock=self.clock)
        self.producers = KafkaProducers(self.dedup)
        assert self.run(self.dedup.check_status(True)) is Status.ENABLED

    @property
    def cursor(self) -> FlakyCursor | None:
        return self.ledger.cursors.get(DEDUP_CURSOR_NAME)

    def new_era(self, pids=PIDS) -> None:
        for pid in pids:
            self.era[pid] += 1

    def run(self, coroutine):
        return self.loop.run_until_complete(coroutine)

    def call(self, fn, *args):
        return self.run(_call(fn, *args))  # inside the loop, as the broker calls it

    def teardown(self) -> None:
        for task in asyncio.all_tasks(self.loop):
            task.cancel()
        self.run(asyncio.sleep(0))
        self.loop.close()

    # -- clients -------------------------------------------------------------------------------------------------

    # Hypothesis picks rules uniformly, so sending is split into several rules to make it most of the steps.

    @rule(pid=st.sampled_from(PIDS), count=st.integers(1, 3))
    def send_next(self, pid: int, count: int) -> None:
        current = self.current(pid)
        if current is None:
            self.produce(pid, 0, 0, count)
        else:
            self.produce(pid, current[0], current[1] + 1, count)

    @rule(pid=st.sampled_from(PIDS), data=st.data())
    def retry(self, pid: int, data: st.DataObject) -> None:
        """A client resends one of its recent batches, accepted or not, written or failed."""
        history = self.sent[pid][-7:]
        if history:
            batch = data.draw(st.sampled_from(history), label="retried")
            self.produce(pid, batch.epoch, batch.first, batch.last - batch.first + 1)

    @rule(pid=st.sampled_from(PIDS), first=st.sampled_from([0, 0, 1]), count=st.integers(1, 3))
    def bump_epoch(self, pid: int, first: int, count: int) -> None:
        current = self.current(pid)
        self.produce(pid, 0 if current is None else current[0] + 1, first, count)

    @rule(pid=st.sampled_from(PIDS), count=st.integers(1, 3), data=st.data())
    def send_odd(self, pid: int, count: int, data: st.DataObject) -> None:
        """A gap, a rewind, an older epoch, or any sequence at any small epoch (near the wrap too)."""
        kind = data.draw(st.sampled_from(["gap", "rewind", "old_epoch", "anything"]), label="kind")
        current = self.current(pid)
        if current is None or kind == "anything" or (kind == "old_epoch" and current[0] == 0):
            epoch = data.draw(st.integers(0, 2), label="epoch")
            first = data.draw(st.sampled_from([0, 1, 100, MAX_SEQUENCE - 3, MAX_SEQUENCE]), label="first")
        else:
            epoch, pushed = current
            if kind == "gap":
                first = pushed + 1 + data.draw(st.integers(1, 3), label="gap")
            elif kind == "rewind":
                first = max(0, pushed - data.draw(st.integers(0, 6), label="rewind"))
            else:
                epoch, first = epoch - 1, pushed + 1
        self.produce(pid, epoch, first, count)

    def current(self, pid: int) -> tuple[int, int] | None:
        """The producer's epoch and last sequence as the client knows them (whatever the broker forgot)."""
        mine = [b for b in self.model.completed + self.model.written + self.model.pending if b.pid == pid]
        if not mine:
            return None
        return mine[-1].epoch, mine[-1].last

    def produce(self, pid: int, epoch: int, first: int, count: int) -> None:
        wire = first % SEQUENCE_MODULUS
        decision = self.call(self.producers.check, pid, epoch, wire, count - 1)
        expected = self.model.decide(pid, epoch, wire, count)
        event(f"{type(decision).__name__} {getattr(decision, 'error_code', '')}".strip())
        match decision:
            case Accept(sequence_id=seq, highest_sequence_id=highest):
                assert expected == ("accept", seq, highest), (decision, expected)
                self.accept(decision, pid, epoch, count)
            case Duplicate():
                assert expected[0] == "duplicate", (decision, expected)
                b = expected[1]
                assert decision == Duplicate(b.base_offset, b.last_offset, b.timestamp)
            case WaitFor(future=future):
                assert expected[0] == "wait", (decision, expected)
                self.waiters.append((future, expected[1], pid))
            case DecideAgain(future=future):
                assert expected == ("again",), (decision, expected)
                self.waiters.append((future, None, pid))
            case Reject(error_code=code):
                assert expected == ("reject", code), (decision, expected)

    def accept(self, decision: Accept, pid: int, epoch: int, count: int) -> None:
        base, last = self.next_offset, self.next_offset + count - 1
        self.next_offset = last + 1
        timestamp = 1_000_000 + base
        pending = self.call(self.producers.on_pushed, decision, base, last, timestamp)
        batch = Batch(pid, epoch, decision.sequence_id, decision.highest_sequence_id, base, last, timestamp,
                      checked=self.model.enabled, era=self.era[pid])
        metadata = MessageMetadata(
            producer_name=decision.producer_name, sequence_id=decision.sequence_id,
            highest_sequence_id=decision.highest_sequence_id, producer_id=pid, producer_epoch=epoch,
            publish_time=timestamp)
        self.unwritten.append(Write(batch, pending, metadata))
        self.model.pending.append(batch)
        self.sent[pid].append(batch)
        failed = self.model.failed.get(pid)
        if failed is not None and (failed[0] != epoch or batch.last >= failed[2]):
            del self.model.failed[pid]
        assert pending.tracked is self.model.enabled

    # -- storage -------------------------------------------------------------------------------------------------

    @precondition(lambda self: self.unwritten)
    @rule()
    def write_durable(self) -> None:
        write = self.unwritten.pop(0)
        position = self.ledger.append(write.metadata, write.batch.base_offset, write.batch.last_offset)
        write.batch.position = position
        self.batch_at[position] = write.batch
        self.unreported.append((write, position))
        self.model.written.append(self.model.pending.pop(0))

    @precondition(lambda self: self.unreported)
    @rule()
    def report_persisted(self) -> None:
        write, position = self.unreported.pop(0)
        self.call(self.producers.on_persisted, write.pending, position)
        self.model.completed.append(self.model.written.pop(0))

    @precondition(lambda self: self.unwritten)
    @rule()
    def write_fails(self) -> None:
        while self.unreported:  # the writes before the failed one did succeed
            self.report_persisted()
        for pid in PIDS:
            dropped = [w.batch for w in self.unwritten if w.batch.pid == pid]
            if dropped and self.model.enabled:
                epoch = dropped[-1].epoch
                first = min(b.first for b in dropped if b.epoch == epoch)
                last = max(b.last for b in dropped if b.epoch == epoch)
                earlier = self.model.failed.get(pid)
                if earlier is not None and earlier[0] == epoch:
                    first, last = min(first, earlier[1]), max(last, earlier[2])
                self.model.failed[pid] = (epoch, first, last)
        for write in self.unwritten:
            self.dropped.add(id(write.batch))
        self.unwritten.clear()
        self.model.pending.clear()
        self.call(self.producers.on_write_failed, NOT_LEADER_OR_FOLLOWER)
        self.ledger.roll()
        self.next_offset = self.durable_end()

    def durable_end(self) -> int:
        return self.ledger.entries[-1].last_offset + 1 if self.ledger.entries else 0

    @rule(what=st.sampled_from(["loop runs", "time passes", "next snapshot fails", "plain batch"]))
    def meanwhile(self, what: str) -> None:
        """Things around the produce path, in one rule so they do not crowd out the sends."""
        if what == "loop runs":  # snapshots in flight land
            self.run(asyncio.sleep(0))
            self.run(asyncio.sleep(0))
        elif what == "time passes":
            self.clock.now += 150
            self.call(self.dedup.snapshot_if_due)
        elif what == "next snapshot fails":
            if self.cursor is not None:
                self.cursor.fail_next = True
        elif not self.unwritten and not self.unreported:
            # A batch without a producer id, written and reported at once; it counts towards snapshots.
            base = self.next_offset
            self.next_offset += 1
            position = self.ledger.append(MessageMetadata(publish_time=base), base, base)
            self.call(self.producers.on_persisted, None, position)

    @rule()
    def crash_and_recover(self) -> None:
        before = dict(self.dedup.persisted), self.producers.persisted_state(), not self.unreported
        for task in asyncio.all_tasks(self.loop):  # the process dies: whatever was in flight never lands
            task.cancel()
        self.run(asyncio.sleep(0))
        self.unwritten.clear()
        self.unreported.clear()
        self.waiters.clear()
        self.model.completed += self.model.written
        self.model.written, self.model.pending = [], []
        self.model.failed.clear()
        lost = self.forget_what_recovery_cannot_bring_back()
        self.ledger.roll()
        self.next_offset = self.durable_end()
        self.start()
        sequences, producers = Model.state(self.model.done())
        assert dict(self.dedup.persisted) == sequences
        assert dict(self.dedup.pushed) == sequences
        assert self.producers.persisted_state() == producers
        if before[2] and not lost:  # nothing durable was left unreported: recovery gives back exactly what was
            assert (dict(self.dedup.persisted), self.producers.persisted_state()) == before[:2]

    def forget_what_recovery_cannot_bring_back(self) -> bool:
        """Recovery = the stored snapshot + a replay of the entries after its position. A producer whose name the
        snapshot left out (the cap) keeps only what the replay brings back. Returns whether one lost anything."""
        if not self.model.enabled:  # the restart enables dedup afresh: the cursor starts at the end of the log
            self.model.forget(self.model.completed)
            self.model.enabled = True
            self.new_era()
            return True
        cursor = self.cursor
        position, names = cursor.mark_delete_position, {k for k in cursor.properties if not k.startswith("__")}
        assert len(names) <= self.config.max_producers
        lost = False
        for pid in PIDS:
            before = [b for b in self.model.done(pid) if b.position <= position]
            if before and name(pid, before[-1].epoch) not in names:
                self.model.forget(before)
                self.new_era([pid])
                lost = True
        return lost

    # -- purge, runtime disable and enable -----------------------------------------------------------------------

    @precondition(lambda self: self.cursor is None or not self.cursor.fail_next)
    @rule()
    def purge_idle_producers(self) -> None:
        """Long enough after every write so far: a producer with nothing in flight is dropped, and the snapshot is
        rewritten without it (it is let land, so a crash after this finds it)."""
        self.clock.now += 2 * INACTIVITY_TIMEOUT
        purged = self.call(self.dedup.purge_inactive, INACTIVITY_TIMEOUT)
        self.run(self.dedup.flush_snapshot())
        idle = [pid for pid in PIDS if self.model.done(pid) and not self.model.in_flight(pid)]
        if not self.model.enabled:
            idle = []
        assert sorted(purged) == sorted(name(pid, self.model.done(pid)[-1].epoch) for pid in idle)
        for pid in idle:
            self.model.forget(self.model.done(pid))
            self.model.failed.pop(pid, None)
        self.new_era(idle)

    @precondition(lambda self: self.model.enabled)
    @rule()
    def disable_at_run_time(self) -> None:
        assert self.run(self.dedup.check_status(False)) is Status.DISABLED
        for future, batch, _ in self.waiters:  # nothing can be decided any more: retry
            if batch is None:
                assert future.done()
            else:
                assert future.exception().error_code == REQUEST_TIMED_OUT
        self.waiters.clear()
        self.model.enabled = False
        self.model.failed.clear()
        self.new_era()

    @precondition(lambda self: not self.model.enabled)
    @rule()
    def enable_at_run_time(self) -> None:
        """The cursor starts at the end of the log: nothing before it is deduplicated. (kop's replay covers the
        writes in flight; here they land first, while dedup is still off.)"""
        while self.unwritten:
            self.write_durable()
        while self.unreported:
            self.report_persisted()
        assert self.run(self.dedup.check_status(True)) is Status.ENABLED
        self.model.forget(self.model.completed)
        self.model.enabled = True
        self.new_era()

    # -- invariants ----------------------------------------------------------------------------------------------

    @invariant()
    def persisted_state_matches_the_model(self) -> None:
        sequences, producers = Model.state(self.model.done()) if self.model.enabled else ({}, {})
        assert dict(self.dedup.persisted) == sequences
        assert self.producers.persisted_state() == producers

    @invariant()
    def pushed_state_matches_the_model(self) -> None:
        """Pushed: the persisted epoch's name plus the names of writes in flight, each at its newest sequence."""
        if not self.model.enabled:
            assert dict(self.dedup.pushed) == {} and all(self.producers.epoch(pid) is None for pid in PIDS)
            return
        pushed = {}
        for pid in PIDS:
            mine = self.model.of(pid)
            assert self.producers.epoch(pid) == (mine[-1].epoch if mine else None)
            done = self.model.done(pid)
            epochs = {b.epoch for b in self.model.in_flight(pid)} | ({done[-1].epoch} if done else set())
            for epoch in epochs:
                pushed[name(pid, epoch)] = [b for b in mine if b.epoch == epoch][-1].last
        assert dict(self.dedup.pushed) == pushed

    @invariant()
    def no_duplicate_or_gap_is_ever_stored(self) -> None:
        """Within one era of a producer, and for the batches the rules accepted (not those taken with dedup off)."""
        last_seen: dict[int, tuple[int, int, int]] = {}
        for entry in self.ledger.entries:
            m = entry.metadata
            if m.producer_id < 0:
                continue
            batch = self.batch_at[entry.position]
            seen = last_seen.get(m.producer_id)
            if batch.checked and seen is not None and seen[2] == batch.era:
                epoch, last, _ = seen
                assert m.producer_epoch >= epoch
                expected_first = last + 1 if m.producer_epoch == epoch else 0
                assert m.sequence_id == expected_first, (m, last_seen)
            last_seen[m.producer_id] = (m.producer_epoch, m.highest_sequence_id, batch.era)

    @invariant()
    def waiters_learn_the_outcome(self) -> None:
        still_waiting = []
        for future, batch, pid in self.waiters:
            if batch is None:  # DecideAgain: done once the producer has nothing in flight
                if not self.model.in_flight(pid):
                    assert future.done()
                else:
                    still_waiting.append((future, batch, pid))
            elif batch in self.model.done():
                assert future.result() == Duplicate(batch.base_offset, batch.last_offset, batch.timestamp)
            elif id(batch) in self.dropped:
                assert isinstance(future.exception(), WriteFailed)
                assert future.exception().error_code == NOT_LEADER_OR_FOLLOWER
            else:
                assert not future.done()
                still_waiting.append((future, batch, pid))
        self.waiters = still_waiting


DedupMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
TestDedupStateful = DedupMachine.TestCase
