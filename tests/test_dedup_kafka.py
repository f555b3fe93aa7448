"""Kafka's idempotent-producer rules on top of PIP-6: every row of the answer table
(docs/architecture.md#the-kafka-rules-the-answer-table)."""

from __future__ import annotations

import asyncio
import base64
from dataclasses import dataclass

import pytest

from dedup import kafka_snapshot
from dedup.interfaces import DEDUP_CURSOR_NAME, Position
from dedup.kafka_producers import (
    Accept,
    DecideAgain,
    Decision,
    Duplicate,
    KafkaProducers,
    PendingBatch,
    Reject,
    WaitFor,
    WriteFailed,
)
from dedup.memory import InMemoryCursor, InMemoryDedupLedger
from dedup.message_deduplication import DedupConfig, MessageDeduplication, Status
from dedup.sequences import MAX_SEQUENCE, unwrap
from proto.kop_pb2 import KafkaProducerState, MarkerType, MessageMetadata
from protocol.errors import ErrorCode

PID = 1000



@dataclass
class Write:
    pending: PendingBatch | None
    metadata: MessageMetadata
    first_offset: int
    last_offset: int


class Partition:
    """The produce path as kop/partition.py drives it: decide, assign offsets, write, report."""

    def __init__(self, ledger: InMemoryDedupLedger | None = None, **config) -> None:
        self.ledger = ledger or InMemoryDedupLedger()
        self.dedup = MessageDeduplication(self.ledger, DedupConfig(**config))
        self.producers = KafkaProducers(self.dedup)
        self.in_flight: list[Write] = []
        self.next_offset = self._durable_end()

    def _durable_end(self) -> int:
        return self.ledger.entries[-1].last_offset + 1 if self.ledger.entries else 0

    async def start(self, enabled: bool = True) -> Partition:
        await self.dedup.check_status(enabled)
        return self

    def send(self, pid: int, epoch: int, base: int, count: int = 1) -> Decision:
        decision = self.producers.check(pid, epoch, base, count - 1)
        if isinstance(decision, Accept):
            first, last = self.next_offset, self.next_offset + count - 1
            self.next_offset = last + 1
            timestamp = 10_000 + first
            pending = self.producers.on_pushed(decision, first, last, timestamp)
            metadata = MessageMetadata(
                producer_name=decision.producer_name, sequence_id=decision.sequence_id,
                highest_sequence_id=decision.highest_sequence_id, producer_id=pid, producer_epoch=epoch,
                publish_time=timestamp)
            self.in_flight.append(Write(pending, metadata, first, last))
        return decision

    def marker(self, pid: int, epoch: int) -> Position:
        """A transaction marker written and durable, as PartitionLog.publish_control drives it."""
        self.producers.on_marker_pushed(pid, epoch)
        offset = self.next_offset
        self.next_offset += 1
        position = self.ledger.append(MessageMetadata(producer_id=pid, producer_epoch=epoch, is_control=True,
                                                      marker_type=MarkerType.TXN_ABORT), offset, offset)
        self.producers.on_marker_persisted(pid, epoch)
        self.producers.on_persisted(None, position)
        return position

    def persist_next(self) -> Position:
        write = self.in_flight.pop(0)
        position = self.ledger.append(write.metadata, write.first_offset, write.last_offset)
        self.producers.on_persisted(write.pending, position)
        return position

    def persist_all(self) -> None:
        while self.in_flight:
            self.persist_next()

    def fail_writes(self, error_code: int = ErrorCode.NOT_LEADER_OR_FOLLOWER) -> None:
        self.in_flight.clear()
        self.next_offset = self._durable_end()
        self.producers.on_write_failed(error_code)

    def stored(self, pid: int) -> list[tuple[int, int]]:
        """(first, last) sequence ids of the producer's durable entries, in log order."""
        return [(e.metadata.sequence_id, e.metadata.highest_sequence_id) for e in self.ledger.entries
                if e.metadata.producer_id == pid]


async def started(**config) -> Partition:
    return await Partition(**config).start()


def accepted(partition: Partition, pid: int, epoch: int, base: int, count: int = 1) -> Accept:
    decision = partition.send(pid, epoch, base, count)
    assert isinstance(decision, Accept), decision
    return decision


def rejected(decision, error_code: int) -> bool:
    return isinstance(decision, Reject) and decision.error_code == error_code


# -- sequences -----------------------------------------------------------------------------------------------------


def test_unwrap_picks_the_value_closest_to_the_last_one_and_never_negative():
    assert unwrap(7, None) == 7
    assert unwrap(0, MAX_SEQUENCE) == MAX_SEQUENCE + 1
    assert unwrap(MAX_SEQUENCE, MAX_SEQUENCE + 1) == MAX_SEQUENCE
    assert unwrap(5, 3 * 2**31 + 2) == 3 * 2**31 + 5
    assert unwrap(MAX_SEQUENCE - 2, 5) == MAX_SEQUENCE - 2  # far ahead, not "behind zero"
    with pytest.raises(ValueError):
        unwrap(2**31, 0)


# -- rule 1: bypass ------------------------------------------------------------------------------------------------


async def test_rule1_batches_without_producer_id_never_reach_check_but_count_for_snapshots():
    partition = await started(entries_interval=2)
    with pytest.raises(ValueError):
        partition.producers.check(-1, -1, -1, 0)
    accepted(partition, PID, 0, 0)
    partition.persist_next()
    position = partition.ledger.append(MessageMetadata(is_control=True), 1, 1)  # a control batch
    partition.producers.on_persisted(None, position)
    await partition.dedup.flush_snapshot()
    assert partition.ledger.cursors[DEDUP_CURSOR_NAME].mark_delete_position == position


# -- rules 2, 3, 4: duplicates -------------------------------------------------------------------------------------


async def test_rule2_retry_of_each_of_the_last_five_persisted_batches_gets_its_original_offsets():
    partition = await started()
    for i in range(7):
        accepted(partition, PID, 0, 2 * i, count=2)
    partition.persist_all()
    for i in range(2, 7):
        assert partition.send(PID, 0, 2 * i, count=2) == Duplicate(2 * i, 2 * i + 1, 10_000 + 2 * i)
    assert len(partition.ledger.entries) == 7  # nothing written twice


async def test_rule3_retry_of_a_pending_batch_waits_for_it_and_gets_its_result():
    partition = await started()
    accepted(partition, PID, 0, 0, count=3)
    retry = partition.send(PID, 0, 0, count=3)
    assert isinstance(retry, WaitFor) and not retry.future.done()
    partition.persist_next()
    assert await retry.future == Duplicate(0, 2, 10_000)
    assert len(partition.ledger.entries) == 1


async def test_rule3_retry_of_a_pending_batch_whose_write_fails_gets_the_same_retriable_error():
    partition = await started()
    accepted(partition, PID, 0, 0)
    retry = partition.send(PID, 0, 0)
    impatient = partition.send(PID, 0, 0)
    impatient.future.cancel()  # one waiter's timeout does not disturb another
    partition.fail_writes(ErrorCode.NOT_LEADER_OR_FOLLOWER)
    with pytest.raises(WriteFailed) as failed:
        await retry.future
    assert failed.value.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER
    accepted(partition, PID, 0, 0)  # the client's next retry is written


async def test_rule4_stored_batch_older_than_the_window_is_duplicate_sequence_number():
    partition = await started()
    for i in range(6):
        accepted(partition, PID, 0, i)
    partition.persist_all()
    assert rejected(partition.send(PID, 0, 0), ErrorCode.DUPLICATE_SEQUENCE_NUMBER)
    assert isinstance(partition.send(PID, 0, 1), Duplicate)


async def test_unknown_that_is_no_exact_retry_is_decided_again_once_the_writes_in_flight_end():
    partition = await started()
    accepted(partition, PID, 0, 0, count=5)
    accepted(partition, PID, 0, 5, count=5)
    again = partition.send(PID, 0, 5, count=3)  # overlaps a pending batch without matching it
    assert isinstance(again, DecideAgain) and not again.future.done()
    partition.persist_next()
    assert not again.future.done()  # one more write in flight
    partition.persist_next()
    assert again.future.done()
    assert rejected(partition.send(PID, 0, 5, count=3), ErrorCode.DUPLICATE_SEQUENCE_NUMBER)


async def test_unknown_decided_again_after_a_failed_write_is_accepted():
    partition = await started()
    accepted(partition, PID, 0, 0)
    accepted(partition, PID, 0, 1, count=2)
    again = partition.send(PID, 0, 1)
    assert isinstance(again, DecideAgain)
    partition.fail_writes()
    assert again.future.done()
    accepted(partition, PID, 0, 0)
    assert isinstance(partition.send(PID, 0, 1), Accept)


# -- rules 5, 6, 7: epochs and unknown producers -------------------------------------------------------------------


async def test_rule5_older_epoch_is_invalid_producer_epoch_even_for_its_own_duplicate():
    partition = await started()
    accepted(partition, PID, 3, 0)
    partition.persist_all()
    accepted(partition, PID, 4, 0)
    assert rejected(partition.send(PID, 3, 1), ErrorCode.INVALID_PRODUCER_EPOCH)
    partition.persist_all()
    assert rejected(partition.send(PID, 3, 0), ErrorCode.INVALID_PRODUCER_EPOCH)
    assert rejected(partition.send(PID, 2, 0), ErrorCode.INVALID_PRODUCER_EPOCH)


async def test_rule6_new_epoch_must_start_at_zero_and_clears_the_cache():
    partition = await started()
    accepted(partition, PID, 0, 0, count=3)
    partition.persist_all()
    assert rejected(partition.send(PID, 1, 3), ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER)
    assert partition.producers.epoch(PID) == 0
    accepted(partition, PID, 1, 0)
    partition.persist_all()
    assert rejected(partition.send(PID, 0, 0, count=3), ErrorCode.INVALID_PRODUCER_EPOCH)
    assert isinstance(partition.send(PID, 1, 0), Duplicate)
    accepted(partition, PID, 1, 1)


async def test_epoch_bump_drops_the_old_name_from_the_pip6_maps():
    partition = await started()
    for epoch in range(4):
        accepted(partition, PID, epoch, 0)
        partition.persist_all()
    name = partition.producers.producer_name(PID, 3)
    assert name == f"KOP-PID-{PID}-3"
    assert dict(partition.dedup.persisted) == {name: 0}
    assert dict(partition.dedup.pushed) == {name: 0}


async def test_each_accepted_batch_is_named_by_its_own_epoch():
    # The name is reused from one batch of an epoch to the next rather than formatted per batch: a bump, the rollback
    # after a failed bump, a bump in flight and a restart must still name every batch (and its PIP-6 entry) by its
    # own epoch.
    partition = await started()
    names = [accepted(partition, PID, 0, 0).producer_name, accepted(partition, PID, 0, 1).producer_name]
    partition.persist_all()
    names.append(accepted(partition, PID, 1, 0).producer_name)
    partition.fail_writes()  # the bump failed: the producer is back at epoch 0
    names.append(accepted(partition, PID, 0, 2).producer_name)
    names.append(accepted(partition, PID, 1, 0).producer_name)  # bumped again with epoch 0 still in flight
    partition.persist_all()
    restarted = await Partition(partition.ledger).start()
    names.append(accepted(restarted, PID, 1, 1).producer_name)
    assert names == [f"KOP-PID-{PID}-{epoch}" for epoch in (0, 0, 1, 0, 1, 1)]
    assert [e.metadata.producer_name for e in partition.ledger.entries] == names[:2] + names[3:5]
    restarted.persist_all()
    assert dict(restarted.dedup.persisted) == {f"KOP-PID-{PID}-1": 1}


async def test_rule7_unknown_producer_starts_at_any_sequence():
    partition = await started()
    accepted(partition, PID, 5, 12345)
    accepted(partition, PID + 1, 0, MAX_SEQUENCE)
    assert not rejected(partition.send(PID + 2, 0, 0), 59)


# -- rules 8, 9: continuity ----------------------------------------------------------------------------------------


async def test_rule8_next_sequence_is_accepted_while_earlier_writes_are_in_flight():
    partition = await started()
    for i in range(5):  # five requests in flight, as Java and librdkafka pipeline them
        decision = accepted(partition, PID, 0, 2 * i, count=2)
        assert (decision.sequence_id, decision.highest_sequence_id) == (2 * i, 2 * i + 1)
    assert partition.dedup.last_sequence_id(partition.producers.producer_name(PID, 0)) == 9
    partition.persist_all()
    assert partition.stored(PID) == [(0, 1), (2, 3), (4, 5), (6, 7), (8, 9)]


async def test_rule9_gap_partial_overlap_and_rewind_are_out_of_order():
    partition = await started()
    for i in range(7):
        accepted(partition, PID, 0, 3 * i, count=3)  # batches 0-2, 3-5, ..., 18-20
    partition.persist_all()
    assert rejected(partition.send(PID, 0, 22), ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER)  # gap
    assert rejected(partition.send(PID, 0, 19, count=4), ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER)  # overlaps the end
    # stored, but not a cached batch
    assert rejected(partition.send(PID, 0, 16, count=3), ErrorCode.DUPLICATE_SEQUENCE_NUMBER)
    accepted(partition, PID, 0, 21)
    assert rejected(partition.send(PID, 0, 23), ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER)  # skips 22, with 21 in flight
    accepted(partition, PID, 0, 22)


# -- rule 10: failed writes ----------------------------------------------------------------------------------------


async def test_rule10_failed_write_fails_every_pending_batch_and_retries_are_accepted_in_order():
    partition = await started()
    accepted(partition, PID, 0, 0)
    partition.persist_all()
    for seq in (1, 2, 3):
        accepted(partition, PID, 0, seq)
    partition.fail_writes()
    # A follower that arrives before the retry is early, not out of order: the retriable error again.
    assert rejected(partition.send(PID, 0, 2), ErrorCode.NOT_LEADER_OR_FOLLOWER)
    assert rejected(partition.send(PID, 0, 4), ErrorCode.NOT_LEADER_OR_FOLLOWER)  # the next batch the client would send
    assert rejected(partition.send(PID, 0, 9), ErrorCode.NOT_LEADER_OR_FOLLOWER)  # sent before the client saw the failure
    assert isinstance(partition.send(PID, 0, 0), Duplicate)
    accepted(partition, PID, 0, 1)
    assert rejected(partition.send(PID, 0, 3), ErrorCode.NOT_LEADER_OR_FOLLOWER)  # 2 is still to be resent
    for seq in (2, 3):
        accepted(partition, PID, 0, seq)
    # resent in full: the usual rules again
    assert rejected(partition.send(PID, 0, 5), ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER)
    partition.persist_all()
    assert partition.stored(PID) == [(0, 0), (1, 1), (2, 2), (3, 3)]


async def test_rule10_a_write_failing_again_while_resending_keeps_the_whole_failed_range():
    partition = await started()
    for seq in (0, 1, 2, 3):
        accepted(partition, PID, 0, seq)
    partition.fail_writes()
    accepted(partition, PID, 0, 0)
    partition.fail_writes()  # the resend fails too: 1..3 are still owed
    assert rejected(partition.send(PID, 0, 3), ErrorCode.NOT_LEADER_OR_FOLLOWER)
    for seq in (0, 1, 2, 3):
        accepted(partition, PID, 0, seq)
    partition.persist_all()
    assert partition.stored(PID) == [(0, 0), (1, 1), (2, 2), (3, 3)]


async def test_failed_first_write_of_a_new_epoch_goes_back_to_the_persisted_epoch():
    partition = await started()
    accepted(partition, PID, 0, 0)
    partition.persist_all()
    accepted(partition, PID, 1, 0)
    partition.fail_writes()
    assert partition.producers.epoch(PID) == 0
    assert isinstance(partition.send(PID, 0, 0), Duplicate)
    accepted(partition, PID, 1, 0)


async def test_failed_first_write_of_a_producer_forgets_it():
    partition = await started()
    accepted(partition, PID, 0, 7)
    accepted(partition, PID, 0, 8)
    partition.fail_writes()
    assert partition.producers.epoch(PID) is None
    # Nothing is stored for it, yet its pipelined follower must not be stored ahead of the first batch.
    assert rejected(partition.send(PID, 0, 8), ErrorCode.NOT_LEADER_OR_FOLLOWER)
    accepted(partition, PID, 0, 7)
    accepted(partition, PID, 0, 8)


async def test_writes_before_a_failed_one_land_first_and_the_retries_then_follow_the_rules():
    """The storage reports in log order: writes already on their way to disk land, then the failed one and those
    after it fail. The client was acknowledged 0 and 1; their retries are duplicates, 2 is accepted again."""
    partition = await started()
    for seq in (0, 1, 2, 3):
        accepted(partition, PID, 0, seq)
    partition.persist_next()
    partition.persist_next()
    partition.fail_writes()
    assert dict(partition.dedup.pushed) == dict(partition.dedup.persisted) == {f"KOP-PID-{PID}-0": 1}
    assert rejected(partition.send(PID, 0, 3), ErrorCode.NOT_LEADER_OR_FOLLOWER)  # 2 is owed first
    assert isinstance(partition.send(PID, 0, 1), Duplicate)
    accepted(partition, PID, 0, 2)
    accepted(partition, PID, 0, 3)
    partition.persist_all()
    assert partition.stored(PID) == [(0, 0), (1, 1), (2, 2), (3, 3)]


async def test_writes_reported_durable_after_a_later_one_failed_still_count():
    """Against the contract (the storage reports in log order), the writes before a failed one are reported after
    the failure: they are stored, so they count as stored, and only the rest is owed."""
    partition = await started()
    for seq in (0, 1, 2):
        accepted(partition, PID, 0, seq)
    landing = partition.in_flight[:2]
    partition.fail_writes()
    for write in landing:
        partition.producers.on_persisted(write.pending, partition.ledger.append(write.metadata, write.first_offset,
                                                                                write.last_offset))
    partition.next_offset = partition.ledger.entries[-1].last_offset + 1
    assert dict(partition.dedup.pushed) == dict(partition.dedup.persisted) == {f"KOP-PID-{PID}-0": 1}
    assert partition.send(PID, 0, 1) == Duplicate(1, 1, 10_001)
    assert rejected(partition.send(PID, 0, 3), ErrorCode.NOT_LEADER_OR_FOLLOWER)  # 2 is still owed
    accepted(partition, PID, 0, 2)
    partition.persist_all()
    assert partition.stored(PID) == [(0, 0), (1, 1), (2, 2)]


async def test_a_purged_producer_is_no_longer_owed_its_failed_writes():
    partition = await started()
    accepted(partition, PID, 0, 0)
    partition.persist_all()
    accepted(partition, PID, 0, 1)
    partition.fail_writes()
    name = partition.producers.producer_name(PID, 0)
    assert partition.dedup.purge_inactive(60, now=partition.dedup.inactive[name] + 61) == [name]
    accepted(partition, PID, 0, 5)  # starts afresh: not "resend 1 first" for ever


@pytest.mark.parametrize("bump_before_the_first_lands", [True, False])
async def test_purge_spares_a_producer_with_an_epoch_bump_in_flight(bump_before_the_first_lands):
    """Its persisted epoch's name goes when the bump lands; a purge meanwhile would forget the producer while it
    writes. Once the bump has failed it is idle again, from then on."""
    partition = await started()
    accepted(partition, PID, 0, 0)
    if bump_before_the_first_lands:
        accepted(partition, PID, 1, 0)
        partition.persist_next()
    else:
        partition.persist_next()
        accepted(partition, PID, 1, 0)
    assert partition.dedup.purge_inactive(60, now=10.0**9) == []
    partition.fail_writes()
    name = partition.producers.producer_name(PID, 0)
    since = partition.dedup.inactive[name]
    assert partition.dedup.purge_inactive(60, now=since + 59) == []  # (since + 60 - 60 may round above since)
    assert partition.dedup.purge_inactive(60, now=since + 61) == [name]


# -- dedup state being recovered -----------------------------------------------------------------------------------


class FailingReplayLedger(InMemoryDedupLedger):
    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    async def replay_after(self, position):
        if self.failures:
            self.failures -= 1
            raise OSError("read error during replay")
        async for entry in super().replay_after(position):
            yield entry


async def restarted_with_failed_recovery(partition: Partition) -> Partition:
    """The partition's entries made durable and reopened with a lost cursor whose full replay fails once."""
    partition.persist_all()
    ledger = FailingReplayLedger(failures=1)
    ledger.entries = partition.ledger.entries
    ledger.cursors[DEDUP_CURSOR_NAME] = InMemoryCursor(ledger, (-1, -1))
    restarted = await Partition(ledger, recovery_retry_seconds=0).start()
    assert restarted.dedup.status is Status.FAILED
    return restarted


async def test_while_recovery_failed_a_stored_batch_is_retried_not_stored_again():
    partition = await started(entries_interval=100)
    for seq in (0, 5):
        accepted(partition, PID, 0, seq, count=5)
    restarted = await restarted_with_failed_recovery(partition)
    assert rejected(restarted.send(PID, 0, 5, count=5), ErrorCode.REQUEST_TIMED_OUT)  # retriable: comes again
    assert rejected(restarted.send(PID, 0, 10), ErrorCode.REQUEST_TIMED_OUT)
    assert restarted.dedup.retry_recovery()
    assert rejected(restarted.send(PID, 0, 5, count=5), ErrorCode.REQUEST_TIMED_OUT)  # still recovering
    assert await restarted.dedup.check_status(True) is Status.ENABLED
    assert restarted.send(PID, 0, 5, count=5) == Duplicate(5, 9, 10_005)
    accepted(restarted, PID, 0, 10)


async def test_a_batch_accepted_before_a_runtime_enable_that_lands_after_it_is_recorded_with_its_sequence():
    """Pulsar records from the publish context once enabled: a snapshot covering the entry holds its sequence, so a
    retry after a crash is a duplicate, not stored again."""
    partition = await Partition(entries_interval=1).start(enabled=False)
    accepted(partition, PID, 0, 0, count=3)  # untracked: dedup is off
    assert await partition.dedup.check_status(True) is Status.ENABLED  # the cursor starts at the end: before it
    partition.persist_all()  # lands now
    await partition.dedup.flush_snapshot()
    cursor = partition.ledger.cursors[DEDUP_CURSOR_NAME]
    assert cursor.mark_delete_position == partition.ledger.last_position
    assert cursor.properties[f"KOP-PID-{PID}-0"] == 2
    assert partition.send(PID, 0, 0, count=3) == Duplicate(0, 2, 10_000)
    restarted = await Partition(partition.ledger).start()  # a crash: the snapshot is all there is
    assert restarted.send(PID, 0, 0, count=3) == Duplicate(0, 2, 10_000)
    accepted(restarted, PID, 0, 3)


class HeldReplayLedger(InMemoryDedupLedger):
    """Its replay waits for `release`: the test acts while the dedup state is being recovered."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()

    async def replay_after(self, position):
        await self.release.wait()
        async for entry in super().replay_after(position):
            yield entry


async def recovering(partition: Partition) -> asyncio.Future:
    """Enable dedup on a partition whose ledger holds its replay; returns the enable, still in flight."""
    enabling = asyncio.ensure_future(partition.dedup.check_status(True))
    await asyncio.sleep(0)
    assert partition.dedup.status is Status.RECOVERING
    return enabling


async def test_a_batch_answered_while_recovering_is_not_overtaken_by_its_pipelined_follower():
    """Enabled at run time, dedup knows nothing of the producer: were its follower taken first (rule 7), the resend
    of the batch answered while recovering would be at or below the stored sequence, a duplicate: lost."""
    ledger = HeldReplayLedger()
    partition = await Partition(ledger).start(enabled=False)
    for seq in range(10):
        accepted(partition, PID, 0, seq)
    partition.persist_all()
    enabling = await recovering(partition)
    assert rejected(partition.send(PID, 0, 10), ErrorCode.REQUEST_TIMED_OUT)
    ledger.release.set()
    assert await enabling is Status.ENABLED
    assert rejected(partition.send(PID, 0, 11), ErrorCode.REQUEST_TIMED_OUT)  # pipelined behind 10: the same answer
    accepted(partition, PID, 0, 10)  # the client resends from 10
    accepted(partition, PID, 0, 11)
    partition.persist_all()
    assert partition.stored(PID)[10:] == [(10, 10), (11, 11)]


async def test_a_known_producers_follower_gets_the_retriable_answer_not_out_of_order():
    partition = await started(entries_interval=100)
    for seq in range(10):
        accepted(partition, PID, 0, seq)
    restarted = await restarted_with_failed_recovery(partition)
    assert rejected(restarted.send(PID, 0, 10), ErrorCode.REQUEST_TIMED_OUT)
    assert restarted.dedup.retry_recovery()  # from clean state: what 10 was answered survives it
    assert await restarted.dedup.check_status(True) is Status.ENABLED
    assert rejected(restarted.send(PID, 0, 11), ErrorCode.REQUEST_TIMED_OUT)  # not 45: the client resends 10 first
    accepted(restarted, PID, 0, 10)
    accepted(restarted, PID, 0, 11)


async def test_after_a_failed_recovery_a_new_producer_resends_its_first_batch_before_its_follower():
    partition = await Partition(FailingReplayLedger(failures=1), recovery_retry_seconds=0).start()
    assert partition.dedup.status is Status.FAILED
    assert rejected(partition.send(PID, 0, 0), ErrorCode.REQUEST_TIMED_OUT)
    assert partition.dedup.retry_recovery()
    assert await partition.dedup.check_status(True) is Status.ENABLED
    assert rejected(partition.send(PID, 0, 1), ErrorCode.REQUEST_TIMED_OUT)
    accepted(partition, PID, 0, 0)
    accepted(partition, PID, 0, 1)
    partition.persist_all()
    assert partition.stored(PID) == [(0, 0), (1, 1)]


async def test_a_write_accepted_before_the_enable_that_fails_while_recovering_is_owed_too():
    ledger = HeldReplayLedger()
    partition = await Partition(ledger).start(enabled=False)
    accepted(partition, PID, 0, 0)
    partition.persist_all()
    accepted(partition, PID, 0, 1)  # dedup is off: untracked, still being written
    enabling = await recovering(partition)
    partition.fail_writes()  # the client hears ErrorCode.NOT_LEADER_OR_FOLLOWER for 1 and will resend it
    ledger.release.set()
    assert await enabling is Status.ENABLED
    assert rejected(partition.send(PID, 0, 2), ErrorCode.NOT_LEADER_OR_FOLLOWER)  # sent before it heard: comes again
    accepted(partition, PID, 0, 1)
    accepted(partition, PID, 0, 2)


async def test_a_resend_owed_by_a_producer_that_never_comes_back_expires_with_the_purge():
    partition = await started()
    accepted(partition, PID, 0, 0)  # its first write
    partition.fail_writes()  # unknown producer, nothing stored: no name for the purge to find
    assert rejected(partition.send(PID, 0, 1), ErrorCode.NOT_LEADER_OR_FOLLOWER)
    partition.dedup.purge_inactive(60, now=10.0**9)
    accepted(partition, PID, 0, 1)  # long gone: starts afresh, as a purged producer does


# -- replay over an era without dedup ------------------------------------------------------------------------------


async def test_a_full_replay_over_an_era_without_dedup_never_moves_a_producer_backwards():
    partition = await Partition().start(enabled=False)
    for seq in range(10):
        accepted(partition, PID, 0, seq)
    accepted(partition, PID, 0, 5)  # a retry, stored again: dedup was off
    partition.persist_all()
    ledger = partition.ledger
    ledger.cursors[DEDUP_CURSOR_NAME] = InMemoryCursor(ledger, (-1, -1))  # its snapshot lost: replay it all
    restarted = await Partition(ledger).start()
    assert restarted.dedup.pushed[restarted.producers.producer_name(PID, 0)] == 9
    assert isinstance(restarted.send(PID, 0, 6), Duplicate)  # not stored a second time
    accepted(restarted, PID, 0, 10)  # the next one is next, not a gap


# -- the snapshot cap ----------------------------------------------------------------------------------------------


async def test_the_snapshot_cap_keeps_the_most_recently_written_producers_across_restarts():
    """Kafka gives each producer start a new id, so a busy partition passes the cap; the producers left out lose
    their state at a crash, so they must be the ones written longest ago, not the newest."""
    partition = await started(entries_interval=1000, max_producers=2)
    for pid in (1, 2):
        accepted(partition, pid, 0, 0)
        partition.persist_all()
    for seq in range(6):  # producer 3: the newest and busiest
        accepted(partition, 3, 0, seq)
        partition.persist_all()
    assert partition.dedup.snapshot_now()
    await partition.dedup.flush_snapshot()
    names = {k for k in partition.ledger.cursors[DEDUP_CURSOR_NAME].properties if not k.startswith("__")}
    assert names == {"KOP-PID-2-0", "KOP-PID-3-0"}
    restarted = await Partition(partition.ledger, entries_interval=1000, max_producers=2).start()
    assert isinstance(restarted.send(3, 0, 2), Duplicate)  # not stored again after the crash
    accepted(restarted, 1, 0, 1)  # producer 1 was left out: it starts afresh, and is now the newest
    restarted.persist_all()
    assert restarted.dedup.snapshot_now()
    await restarted.dedup.flush_snapshot()
    names = {k for k in restarted.ledger.cursors[DEDUP_CURSOR_NAME].properties if not k.startswith("__")}
    assert names == {"KOP-PID-3-0", "KOP-PID-1-0"}  # the order survived the restart: 2 is the oldest


# -- sequence wrap-around ------------------------------------------------------------------------------------------


async def test_sequences_continue_across_the_int32_wrap():
    partition = await started()
    accepted(partition, PID, 0, MAX_SEQUENCE - 4, count=3)  # ..-4 .. -2
    straddling = accepted(partition, PID, 0, MAX_SEQUENCE - 1, count=3)  # -1, MAX, then 0
    assert (straddling.sequence_id, straddling.highest_sequence_id) == (MAX_SEQUENCE - 1, MAX_SEQUENCE + 1)
    after = accepted(partition, PID, 0, 1, count=2)
    assert (after.sequence_id, after.highest_sequence_id) == (MAX_SEQUENCE + 2, MAX_SEQUENCE + 3)
    partition.persist_all()
    assert isinstance(partition.send(PID, 0, MAX_SEQUENCE - 1, count=3), Duplicate)
    assert isinstance(partition.send(PID, 0, 1, count=2), Duplicate)
    assert rejected(partition.send(PID, 0, 0), ErrorCode.DUPLICATE_SEQUENCE_NUMBER)  # stored, inside a batch
    assert rejected(partition.send(PID, 0, 5), ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER)
    accepted(partition, PID, 0, 3)


async def test_wrapped_sequences_survive_a_restart():
    partition = await started()
    accepted(partition, PID, 0, MAX_SEQUENCE, count=2)
    partition.persist_all()
    restarted = await Partition(partition.ledger).start()
    assert isinstance(restarted.send(PID, 0, MAX_SEQUENCE, count=2), Duplicate)
    accepted(restarted, PID, 0, 1)


# -- snapshot and recovery -----------------------------------------------------------------------------------------


async def test_snapshot_holds_the_five_recent_batches_and_epoch_and_recovery_restores_them():
    partition = await started(entries_interval=9)
    accepted(partition, PID, 2, 0)
    partition.persist_all()
    accepted(partition, PID, 3, 0)
    for seq in range(1, 7):
        accepted(partition, PID, 3, seq)
    accepted(partition, PID + 1, 0, 40, count=2)
    partition.persist_all()
    await partition.dedup.flush_snapshot()
    cursor = partition.ledger.cursors[DEDUP_CURSOR_NAME]
    properties = cursor.properties
    batches = {pid: batches for pid, _epoch, batches in kafka_snapshot.unpack(cursor.string_properties, properties)}
    assert [len(batches[PID]), len(batches[PID + 1])] == [5, 1]  # PID's five epoch-3 batches
    assert batches[PID][-1] == (3, 6, 6, 7, 7, 10_007)  # epoch, sequences 6..6, offsets 7..7, timestamp
    assert properties[f"KOP-PID-{PID}-3"] == 6
    assert f"KOP-PID-{PID}-2" not in properties
    before = partition.producers.persisted_state()

    restarted = await Partition(partition.ledger).start()
    assert restarted.producers.persisted_state() == before
    for seq in range(2, 7):
        assert restarted.send(PID, 3, seq) == Duplicate(seq + 1, seq + 1, 10_000 + seq + 1)
    assert rejected(restarted.send(PID, 3, 1), ErrorCode.DUPLICATE_SEQUENCE_NUMBER)
    assert rejected(restarted.send(PID, 2, 1), ErrorCode.INVALID_PRODUCER_EPOCH)
    accepted(restarted, PID, 3, 7)


@pytest.mark.parametrize("recovered_from", ["snapshot", "replay"])
async def test_a_marker_of_a_newer_epoch_fences_the_older_epoch_also_after_a_restart(recovered_from):
    """Kafka's appendEndTxnMarker: a COMMIT/ABORT marker whose epoch is newer than the producer's (a coordinator
    that aborted a timed-out transaction under a bumped epoch) makes it the producer's epoch on the partition: the
    old epoch's batches are refused, the new one starts at sequence 0. A restart rebuilds it from the snapshot
    (which keeps the epoch though no batch has it) or by replaying the marker."""
    partition = await started(entries_interval=100)
    accepted(partition, PID, 0, 0, count=2)
    partition.persist_all()
    partition.marker(PID, 0)  # its own epoch's marker changes nothing
    assert isinstance(partition.send(PID, 0, 0, count=2), Duplicate)
    partition.marker(PID, 1)
    if recovered_from == "snapshot":
        assert partition.dedup.snapshot_now()
        await partition.dedup.flush_snapshot()
        assert partition.ledger.cursors[DEDUP_CURSOR_NAME].mark_delete_position == partition.ledger.last_position
    for current in (partition, await Partition(partition.ledger).start()):
        assert current.producers.epoch(PID) == 1
        assert current.producers.persisted_state()[PID].epoch == 1
        assert rejected(current.send(PID, 0, 2), ErrorCode.INVALID_PRODUCER_EPOCH)
        assert rejected(current.send(PID, 1, 5), ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER)
    accepted(current, PID, 1, 0)


async def test_a_marker_in_flight_fences_the_older_epoch_at_once():
    """The epoch is raised when the marker is handed to the log, as Kafka raises it on append: a batch of the old
    epoch that comes while the marker is written must not be stored after it."""
    partition = await started()
    accepted(partition, PID, 0, 0)
    partition.persist_all()
    partition.producers.on_marker_pushed(PID, 1)
    assert rejected(partition.send(PID, 0, 1), ErrorCode.INVALID_PRODUCER_EPOCH)


async def test_a_snapshot_in_the_older_format_with_one_property_per_batch_is_still_restored():
    ledger = InMemoryDedupLedger()
    for seq in range(3):
        ledger.append(MessageMetadata(producer_name=f"KOP-PID-{PID}-0", sequence_id=seq, highest_sequence_id=seq,
                                      producer_id=PID, producer_epoch=0, publish_time=10_000 + seq), seq, seq)
    cursor = ledger.cursors[DEDUP_CURSOR_NAME] = InMemoryCursor(ledger, ledger.last_position)
    cursor.properties = {f"KOP-PID-{PID}-0": 2, **{f"__kafka_batch:{PID}:0:{s}:{s}:{s}:{10_000 + s}": s
                                                    for s in range(3)}}
    restarted = await Partition(ledger).start()
    assert restarted.send(PID, 0, 1) == Duplicate(1, 1, 10_001)
    accepted(restarted, PID, 0, 3)


def test_a_packed_state_without_the_producers_epoch_is_still_read_with_its_batches_epoch():
    """Format 1, written before a marker could raise an epoch with no batch of it, had no epoch field."""
    numbers = [kafka_snapshot.FORMAT_WITHOUT_EPOCH, PID, 2, 3, 0, 0, 0, 0, 10_000, 3, 1, 1, 1, 1, 10_001]
    encoded = base64.b64encode(KafkaProducerState(numbers=numbers).SerializeToString()).decode("ascii")
    assert list(kafka_snapshot.unpack({kafka_snapshot.STATE_KEY: encoded}, {})) == \
        [(PID, 3, [(3, 0, 0, 0, 0, 10_000), (3, 1, 1, 1, 1, 10_001)])]
    assert list(kafka_snapshot.unpack(kafka_snapshot.pack([(PID, 4, [(3, 0, 0, 0, 0, 10_000)])]), {})) == \
        [(PID, 4, [(3, 0, 0, 0, 0, 10_000)])]


async def test_replay_rebuilds_the_batches_written_after_the_snapshot():
    partition = await started(entries_interval=4)
    for seq in range(5):
        accepted(partition, PID, 0, seq)
    accepted(partition, PID, 1, 0)
    partition.persist_all()
    await partition.dedup.flush_snapshot()
    assert partition.ledger.cursors[DEDUP_CURSOR_NAME].mark_delete_position == partition.ledger.entries[3].position
    restarted = await Partition(partition.ledger, entries_interval=100).start()
    assert restarted.producers.persisted_state() == partition.producers.persisted_state()
    assert dict(restarted.dedup.persisted) == {f"KOP-PID-{PID}-1": 0}
    assert isinstance(restarted.send(PID, 1, 0), Duplicate)
    assert rejected(restarted.send(PID, 0, 5), ErrorCode.INVALID_PRODUCER_EPOCH)


async def test_purge_after_an_epoch_bump_resnapshots_at_the_last_entry_so_a_restart_keeps_it_purged():
    """The purge's snapshot is taken at the last recorded entry, with the state of that moment: after a restart the
    purged producer does not come back by replay, and the newest epoch of the other one is kept."""
    partition = await started(entries_interval=100)
    accepted(partition, PID, 0, 0)
    accepted(partition, PID + 1, 0, 0)
    accepted(partition, PID, 1, 0)
    partition.persist_all()
    partition.dedup.producer_added(partition.producers.producer_name(PID, 1))  # still active
    assert partition.dedup.purge_inactive(1, now=10.0**9) == [f"KOP-PID-{PID + 1}-0"]
    await partition.dedup.flush_snapshot()
    assert partition.ledger.cursors[DEDUP_CURSOR_NAME].mark_delete_position == partition.ledger.last_position
    restarted = await Partition(partition.ledger).start()
    assert dict(restarted.dedup.persisted) == {f"KOP-PID-{PID}-1": 0}
    assert restarted.producers.epoch(PID) == 1
    assert isinstance(restarted.send(PID, 1, 0), Duplicate)


async def test_purged_producer_starts_afresh():
    partition = await started()
    accepted(partition, PID, 0, 0)
    partition.persist_all()
    name = partition.producers.producer_name(PID, 0)
    assert partition.dedup.inactive.keys() == {name}  # idle since its last write
    assert partition.dedup.purge_inactive(60, now=partition.dedup.inactive[name] + 61) == [name]
    assert partition.producers.epoch(PID) is None
    accepted(partition, PID, 0, 9)


async def test_dedup_disabled_accepts_everything_and_tracks_nothing():
    partition = await Partition().start(enabled=False)
    accepted(partition, PID, 0, 0)
    partition.persist_all()
    accepted(partition, PID, 0, 0)
    assert not partition.in_flight[0].pending.tracked
    assert partition.producers.epoch(PID) is None


async def test_a_full_replay_over_a_dedup_off_era_that_crossed_the_sequence_wrap_keeps_the_producer_ahead():
    """With dedup off, entries record Kafka's wire sequences (int32, wrapping); the state holds them unwrapped. A
    full replay (a lost cursor) over a producer that crossed the wrap must end after the wrap, not before it: else
    the retries of the last stored batches are accepted and stored again."""
    partition = await Partition().start(enabled=False)
    for seq in (MAX_SEQUENCE - 1, MAX_SEQUENCE, 0, 1):
        accepted(partition, PID, 0, seq)
    partition.persist_all()
    ledger = partition.ledger
    ledger.cursors[DEDUP_CURSOR_NAME] = InMemoryCursor(ledger, (-1, -1))  # the cursor lost: replay everything
    replayed = await Partition(ledger).start()
    name = replayed.producers.producer_name(PID, 0)
    assert replayed.dedup.pushed[name] == MAX_SEQUENCE + 2  # wire 1, after the wrap
    for seq in (0, 1):  # retries of stored batches
        decision = replayed.send(PID, 0, seq)
        assert isinstance(decision, Duplicate) or rejected(decision, ErrorCode.DUPLICATE_SEQUENCE_NUMBER), decision
    accepted(replayed, PID, 0, 2)


async def test_every_batch_owed_while_dedup_recovers_holds_its_followers_however_many_producers_are_owed():
    """Owed-resend records are never dropped to bound memory (they go with a producer's resend or its purge): one
    dropped would let the batch behind the owed one be stored first, and the owed one then count as stored."""
    ledger = HeldReplayLedger()
    partition = await Partition(ledger).start(enabled=False)
    for seq in range(10):
        accepted(partition, PID, 0, seq)
    partition.persist_all()
    enabling = asyncio.ensure_future(partition.dedup.check_status(True))
    await asyncio.sleep(0)
    assert rejected(partition.send(PID, 0, 10), ErrorCode.REQUEST_TIMED_OUT)  # owed
    for other in range(PID + 1, PID + 1 + 12_000):  # many more producers answered while recovering
        assert rejected(partition.send(other, 0, 0), ErrorCode.REQUEST_TIMED_OUT)
    ledger.release.set()
    await enabling
    assert rejected(partition.send(PID, 0, 11), ErrorCode.REQUEST_TIMED_OUT)  # still behind the owed batch
    accepted(partition, PID, 0, 10)
    accepted(partition, PID, 0, 11)
    partition.persist_all()
    assert [seq for seq, _ in partition.stored(PID)][-2:] == [10, 11]
