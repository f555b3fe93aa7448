"""PIP-6 core: Pulsar's MessageDuplicationTest scenarios and the behaviours kop keeps from Pulsar, as statements."""

from __future__ import annotations

import asyncio

from dedup.interfaces import DEDUP_CURSOR_NAME, Position
from dedup.memory import InMemoryCursor, InMemoryDedupLedger
from dedup.message_deduplication import DedupConfig, DupStatus, MessageDeduplication, Status
from proto.kop_pb2 import MessageMetadata

NOT_DUP, DUP, UNKNOWN = DupStatus.NOT_DUP, DupStatus.DUP, DupStatus.UNKNOWN



class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def enabled(ledger: InMemoryDedupLedger | None = None, clock: Clock | None = None, system_topic: bool = False,
                  **config) -> MessageDeduplication:
    dedup = MessageDeduplication(ledger or InMemoryDedupLedger(), DedupConfig(**config), clock=clock or Clock(),
                                 system_topic=system_topic)
    await dedup.check_status(True)
    return dedup


def metadata(name: str, seq: int, highest: int | None = None, **fields) -> MessageMetadata:
    return MessageMetadata(producer_name=name, sequence_id=seq,
                           highest_sequence_id=seq if highest is None else highest, **fields)


def write(dedup: MessageDeduplication, ledger: InMemoryDedupLedger, name: str, seq: int,
          highest: int | None = None) -> Position:
    """Publish one entry the way the produce path does: check, store, record."""
    highest = seq if highest is None else highest
    assert dedup.is_duplicate(name, seq, highest) is NOT_DUP
    position = ledger.append(metadata(name, seq, highest), 0, 0)
    dedup.record_persisted(name, seq, highest, position)
    return position


def cursor(ledger: InMemoryDedupLedger) -> InMemoryCursor:
    return ledger.cursors[DEDUP_CURSOR_NAME]


# -- isDuplicate ---------------------------------------------------------------------------------------------------


async def test_higher_ids_are_accepted_with_gaps_and_lower_ones_are_rejected():
    dedup = await enabled()
    assert dedup.is_duplicate("p1", 0, 0) is NOT_DUP
    assert dedup.is_duplicate("p1", 1, 1) is NOT_DUP
    assert dedup.is_duplicate("p1", 5, 5) is NOT_DUP  # a gap is fine
    assert dedup.pushed == {"p1": 5}
    assert dedup.is_duplicate("p1", 4, 4) is UNKNOWN  # 2, 3, 5 then 4: 4 is dropped
    assert dedup.is_duplicate("p1", 0, 0) is UNKNOWN  # persisted is empty, so not known to be stored
    assert dedup.pushed == {"p1": 5}  # rejections change nothing


async def test_id_at_or_below_persisted_is_dup_and_between_persisted_and_pushed_is_unknown():
    dedup = await enabled()
    for seq in range(6):
        dedup.is_duplicate("p1", seq, seq)
    dedup.record_persisted("p1", 3, 3, (0, 0))
    assert dedup.is_duplicate("p1", 3, 3) is DUP
    assert dedup.is_duplicate("p1", 0, 0) is DUP
    assert dedup.is_duplicate("p1", 4, 4) is UNKNOWN
    assert dedup.is_duplicate("p1", 6, 6) is NOT_DUP
    assert dedup.is_duplicate("p2", 0, 0) is NOT_DUP  # producers are independent


async def test_batch_is_judged_by_its_lowest_id_and_advances_pushed_to_its_highest():
    dedup = await enabled()
    assert dedup.is_duplicate("p1", 0, 0) is NOT_DUP
    dedup.record_persisted("p1", 0, 0, (0, 0))
    assert dedup.is_duplicate("p1", 1, 5) is NOT_DUP
    assert dedup.pushed["p1"] == 5
    assert dedup.is_duplicate("p1", 4, 8) is UNKNOWN  # partial overlap: rejected whole
    assert dedup.is_duplicate("p1", 6, 8) is NOT_DUP
    assert dedup.pushed["p1"] == 8
    assert dedup.is_duplicate("p1", 9, 7) is NOT_DUP  # highest below the id counts as the id
    assert dedup.pushed["p1"] == 9


async def test_failed_write_resets_pushed_to_persisted_so_the_retry_is_accepted():
    dedup = await enabled()
    for seq in range(7):
        dedup.is_duplicate("p1", seq, seq)
        dedup.record_persisted("p1", seq, seq, (0, seq))
    assert dedup.is_duplicate("p1", 7, 7) is NOT_DUP  # this write will fail
    assert dedup.is_duplicate("p1", 7, 7) is UNKNOWN  # its re-send while in flight
    dedup.reset_pushed_to_persisted()
    assert dedup.pushed["p1"] == 6
    assert dedup.is_duplicate("p1", 6, 6) is DUP
    assert dedup.is_duplicate("p1", 7, 7) is NOT_DUP
    assert dedup.is_duplicate("p1", 8, 8) is NOT_DUP


async def test_last_sequence_id_is_pushed_or_minus_one():
    dedup = await enabled()
    assert dedup.last_sequence_id("p1") == -1
    dedup.is_duplicate("p1", 9, 9)
    assert dedup.last_sequence_id("p1") == 9  # pushed, so a write in flight counts


async def test_status_not_enabled_means_never_duplicate_and_nothing_recorded():
    dedup = MessageDeduplication(InMemoryDedupLedger())
    assert dedup.status is Status.INITIALIZED
    assert dedup.is_duplicate("p1", 1, 1) is NOT_DUP
    assert dedup.is_duplicate("p1", 1, 1) is NOT_DUP
    dedup.record_persisted("p1", 1, 1, (0, 0))
    assert dedup.persisted == {} and dedup.pushed == {}


async def test_system_topic_is_never_deduplicated_whatever_the_policy():
    ledger = InMemoryDedupLedger()
    dedup = await enabled(ledger, system_topic=True)
    assert dedup.status is Status.DISABLED
    assert DEDUP_CURSOR_NAME not in ledger.cursors
    assert dedup.is_duplicate("p1", 1, 1) is NOT_DUP
    assert dedup.is_duplicate("p1", 1, 1) is NOT_DUP


# -- status transitions --------------------------------------------------------------------------------------------


async def test_initialized_and_disabled_policy_removes_a_leftover_cursor():
    ledger = InMemoryDedupLedger()
    await ledger.open_cursor(DEDUP_CURSOR_NAME)
    dedup = MessageDeduplication(ledger)
    assert await dedup.check_status(False) is Status.DISABLED
    assert DEDUP_CURSOR_NAME not in ledger.cursors


async def test_runtime_disable_deletes_the_cursor_and_clears_the_maps():
    ledger = InMemoryDedupLedger()
    dedup = await enabled(ledger)
    write(dedup, ledger, "p1", 4)
    assert await dedup.check_status(False) is Status.DISABLED
    assert DEDUP_CURSOR_NAME not in ledger.cursors
    assert dedup.pushed == {} and dedup.persisted == {}
    assert dedup.last_sequence_id("p1") == -1


async def test_runtime_enable_starts_at_the_end_of_the_log_so_history_is_not_deduplicated():
    ledger = InMemoryDedupLedger()
    ledger.append(metadata("p1", 4), 0, 0)
    dedup = await enabled(ledger)
    assert cursor(ledger).mark_delete_position == ledger.last_position
    assert dedup.last_sequence_id("p1") == -1
    assert dedup.is_duplicate("p1", 4, 4) is NOT_DUP


class SlowLedger(InMemoryDedupLedger):
    """Counts opens and replays; each replay yields to the loop so callers can overlap; can fail opens."""

    def __init__(self, failing_opens: int = 0) -> None:
        super().__init__()
        self.opens = self.replays = 0
        self.failing_opens = failing_opens

    async def open_cursor(self, name):
        self.opens += 1
        await asyncio.sleep(0)
        if self.failing_opens:
            self.failing_opens -= 1
            raise OSError("cursor ledger unavailable")
        return await super().open_cursor(name)

    async def replay_after(self, position):
        self.replays += 1
        async for entry in super().replay_after(position):
            await asyncio.sleep(0)
            yield entry


async def test_concurrent_enables_share_one_recovery():
    ledger = SlowLedger()
    await ledger.open_cursor(DEDUP_CURSOR_NAME)  # an existing cursor at the start, with entries after it
    for seq in range(5):
        ledger.append(metadata("p1", seq), seq, seq)
    ledger.opens = 0
    dedup = MessageDeduplication(ledger)
    first = asyncio.ensure_future(dedup.check_status(True))
    await asyncio.sleep(0)
    assert dedup.status is Status.RECOVERING  # before any storage call completed
    assert dedup.is_duplicate("p1", 0, 0) is NOT_DUP  # not enabled yet: Pulsar answers NotDup
    statuses = await asyncio.gather(first, dedup.check_status(True), dedup.check_status(True))
    assert statuses == [Status.ENABLED] * 3
    assert (ledger.opens, ledger.replays) == (1, 1)
    assert dedup.persisted == {"p1": 4}


async def test_disable_requested_during_recovery_runs_after_it():
    ledger = SlowLedger()
    dedup = MessageDeduplication(ledger)
    enabling = asyncio.ensure_future(dedup.check_status(True))
    await asyncio.sleep(0)
    assert await dedup.check_status(False) is Status.DISABLED
    assert await enabling is Status.ENABLED  # what its own transition reached
    assert dedup.status is Status.DISABLED
    assert DEDUP_CURSOR_NAME not in ledger.cursors


class SlowDeleteLedger(InMemoryDedupLedger):
    async def delete_cursor(self, name):
        await asyncio.sleep(0)
        await super().delete_cursor(name)


async def test_enable_requested_during_removal_runs_after_it():
    ledger = SlowDeleteLedger()
    dedup = await enabled(ledger)
    write(dedup, ledger, "p1", 3)
    disabling = asyncio.ensure_future(dedup.check_status(False))
    await asyncio.sleep(0)
    assert dedup.status is Status.REMOVING
    assert await dedup.check_status(True) is Status.ENABLED
    assert await disabling is Status.DISABLED
    assert dedup.status is Status.ENABLED
    assert cursor(ledger).mark_delete_position == ledger.last_position  # a new cursor, at the end
    assert dedup.last_sequence_id("p1") == -1


async def test_failed_recovery_is_retried_from_clean_state_by_the_next_check():
    ledger = SlowLedger(failing_opens=1)
    ledger.append(metadata("p1", 3), 0, 0)
    dedup = MessageDeduplication(ledger)
    assert await dedup.check_status(True) is Status.FAILED
    assert dedup.is_duplicate("p1", 0, 0) is NOT_DUP  # Failed is not enabled
    assert await dedup.check_status(True) is Status.ENABLED
    assert dedup.pushed == {} and dedup.persisted == {}  # nothing left over from the failed attempt
    assert dedup.is_duplicate("p1", 0, 0) is NOT_DUP


class FailingReplayLedger(InMemoryDedupLedger):
    """The replay fails part-way (a read error) the first `failures` times."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures
        self.cursors[DEDUP_CURSOR_NAME] = InMemoryCursor(self, (-1, -1))  # a snapshot from before: replay it all

    async def replay_after(self, position):
        async for entry in super().replay_after(position):
            yield entry
            if self.failures:
                self.failures -= 1
                raise OSError("read error during replay")


async def test_while_recovery_failed_and_the_policy_wants_dedup_it_is_awaiting_recovery_and_retried_later():
    ledger, clock = FailingReplayLedger(failures=2), Clock()
    for seq in range(3):
        ledger.append(metadata("p1", seq), 0, 0)
    dedup = MessageDeduplication(ledger, DedupConfig(recovery_retry_seconds=5), clock=clock)
    assert await dedup.check_status(True) is Status.FAILED
    assert dedup.awaiting_recovery and not dedup.is_enabled
    assert not dedup.retry_recovery()  # too soon after the failure
    clock.now += 5
    assert dedup.retry_recovery()
    assert dedup.status is Status.RECOVERING and dedup.awaiting_recovery  # at once, before anything is awaited
    assert not dedup.retry_recovery()  # one at a time
    assert await dedup.check_status(True) is Status.FAILED  # shares the retry in flight, which fails again
    clock.now += 5
    assert dedup.retry_recovery()
    assert await dedup.check_status(True) is Status.ENABLED
    assert dedup.persisted == {"p1": 2} and not dedup.awaiting_recovery  # from clean state, the whole replay
    assert not dedup.retry_recovery()


async def test_a_failed_recovery_is_not_awaiting_recovery_once_the_policy_no_longer_wants_dedup():
    ledger = FailingReplayLedger(failures=1)
    ledger.append(metadata("p1", 0), 0, 0)
    dedup = MessageDeduplication(ledger, DedupConfig(recovery_retry_seconds=0))
    assert await dedup.check_status(True) is Status.FAILED
    await dedup.check_status(False)
    assert not dedup.awaiting_recovery and not dedup.retry_recovery()


# -- snapshots -----------------------------------------------------------------------------------------------------


async def test_snapshot_every_entries_interval_persisted_entries_counting_nameless_ones():
    ledger = InMemoryDedupLedger()
    dedup = await enabled(ledger, entries_interval=3)
    write(dedup, ledger, "p1", 0)
    write(dedup, ledger, "p2", 7)
    position = ledger.append(MessageMetadata(), 0, 0)  # e.g. a batch without a producer id
    dedup.record_persisted(None, 0, 0, position)
    await dedup.flush_snapshot()
    assert cursor(ledger).mark_delete_position == position
    assert cursor(ledger).properties == {"p1": 0, "p2": 7}
    write(dedup, ledger, "p1", 1)
    write(dedup, ledger, "p1", 2)
    await dedup.flush_snapshot()
    assert cursor(ledger).mark_delete_position == position  # 2 more entries: not yet
    third = write(dedup, ledger, "p1", 3)
    await dedup.flush_snapshot()
    assert cursor(ledger).mark_delete_position == third
    assert cursor(ledger).properties == {"p1": 3, "p2": 7}


async def test_with_more_names_than_the_entries_interval_a_count_snapshot_waits_for_as_many_entries():
    """A snapshot's cost grows with its names: taken every `entries_interval` entries, many names would cost more per
    entry than the entries themselves."""
    ledger = InMemoryDedupLedger()
    dedup = await enabled(ledger, entries_interval=2)
    snapshots_after = []
    for i in range(12):
        write(dedup, ledger, f"p{min(i, 4)}", i)  # five names, then one of them again
        await dedup.flush_snapshot()
        snapshots_after.append(cursor(ledger).mark_deletes)
    # Every 2 entries while the snapshots hold at most 2 names; 4 after the one with 4 names; 5 after one with 5.
    assert snapshots_after == [0, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 3]
    assert cursor(ledger).mark_delete_position == ledger.entries[7].position


async def test_time_snapshot_at_the_last_recorded_position_once_the_interval_passed():
    ledger, clock = InMemoryDedupLedger(), Clock()
    dedup = await enabled(ledger, clock, snapshot_interval_seconds=10)
    start = cursor(ledger).mark_delete_position
    assert not dedup.snapshot_if_due(clock.now + 11)  # nothing new to snapshot
    position = write(dedup, ledger, "p1", 5)
    assert not dedup.snapshot_if_due(clock.now + 9)
    assert cursor(ledger).mark_delete_position == start
    clock.now += 11
    assert dedup.snapshot_if_due()
    await dedup.flush_snapshot()
    assert (cursor(ledger).mark_delete_position, cursor(ledger).properties) == (position, {"p1": 5})
    write(dedup, ledger, "p1", 6)
    assert not dedup.snapshot_if_due(clock.now + 5)  # the interval runs from the last snapshot
    assert dedup.snapshot_if_due(clock.now + 5, interval_seconds=3)  # the policy can shorten it


async def test_time_snapshot_interval_zero_or_negative_disables_it():
    ledger, clock = InMemoryDedupLedger(), Clock()
    dedup = await enabled(ledger, clock, snapshot_interval_seconds=0)
    write(dedup, ledger, "p1", 5)
    assert not dedup.snapshot_if_due(clock.now + 10**6)
    assert not dedup.snapshot_if_due(clock.now + 10**6, interval_seconds=-1)
    assert cursor(ledger).mark_delete_position == (-1, -1)


async def test_snapshot_is_never_ahead_of_recorded_persists():
    """Pulsar's hazard: a time snapshot at the ledger's LAC, taken before that entry's persist is recorded, claims
    an entry its properties lack; the replay after a crash would then skip it."""
    ledger, clock = InMemoryDedupLedger(), Clock()
    dedup = await enabled(ledger, clock, snapshot_interval_seconds=10)
    recorded = write(dedup, ledger, "p1", 1)
    assert dedup.is_duplicate("p1", 2, 2) is NOT_DUP
    ledger.append(metadata("p1", 2), 0, 0)  # durable, its completion not yet reported
    assert dedup.snapshot_if_due(clock.now + 11)
    await dedup.flush_snapshot()
    assert cursor(ledger).mark_delete_position == recorded != ledger.last_position
    assert cursor(ledger).properties == {"p1": 1}
    crashed_then_recovered = await enabled(ledger)
    assert crashed_then_recovered.persisted == {"p1": 2}  # the unreported entry came back by replay


class CountingCursor(InMemoryCursor):
    """Records the most mark-deletes ever in flight at once."""

    in_flight = most_in_flight = 0

    async def mark_delete(self, position, properties, string_properties=None):
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await super().mark_delete(position, properties, string_properties)
        finally:
            self.in_flight -= 1


async def test_only_one_snapshot_in_flight():
    ledger, clock = InMemoryDedupLedger(), Clock()
    ledger.cursors[DEDUP_CURSOR_NAME] = CountingCursor(ledger, ledger.last_position)
    dedup = await enabled(ledger, clock, entries_interval=1, snapshot_interval_seconds=1)
    write(dedup, ledger, "p1", 1)  # starts a snapshot, not yet stored
    second = write(dedup, ledger, "p1", 2)  # due too: it waits for the first
    assert not dedup.snapshot_if_due(clock.now + 5)
    await dedup.flush_snapshot()
    assert cursor(ledger).most_in_flight == 1 and cursor(ledger).mark_deletes == 2
    assert cursor(ledger).mark_delete_position == second


async def test_a_count_snapshot_that_found_another_in_flight_is_taken_once_that_one_is_stored():
    ledger = InMemoryDedupLedger()
    dedup = await enabled(ledger, entries_interval=2)
    write(dedup, ledger, "p1", 0)
    first = write(dedup, ledger, "p1", 1)  # a snapshot starts here
    write(dedup, ledger, "p1", 2)
    third = write(dedup, ledger, "p1", 3)  # two more entries while it is in flight: due again
    assert cursor(ledger).mark_deletes == 0
    await dedup.flush_snapshot()
    assert cursor(ledger).mark_deletes == 2  # the one in flight, then the one that was due
    assert (cursor(ledger).mark_delete_position, cursor(ledger).properties) == (third, {"p1": 3})
    assert first < third


async def test_replay_stays_within_the_entries_interval_when_a_count_snapshot_fails():
    ledger = InMemoryDedupLedger()
    ledger.cursors[DEDUP_CURSOR_NAME] = FailingCursor(ledger, ledger.last_position)
    dedup = await enabled(ledger, entries_interval=3)
    for seq in range(3):
        write(dedup, ledger, "p1", seq)
    await dedup.flush_snapshot()
    assert cursor(ledger).mark_delete_position == (-1, -1)  # the third entry's snapshot failed
    fourth = write(dedup, ledger, "p1", 3)
    await dedup.flush_snapshot()
    assert cursor(ledger).mark_delete_position == fourth  # retried at once, not after 3 more entries


class FailingCursor(InMemoryCursor):
    failures = 1

    async def mark_delete(self, position, properties, string_properties=None):
        if self.failures:
            self.failures -= 1
            raise OSError("bookie down")
        await super().mark_delete(position, properties, string_properties)


async def test_failed_snapshot_is_only_logged_and_the_next_trigger_retries():
    ledger = InMemoryDedupLedger()
    ledger.cursors[DEDUP_CURSOR_NAME] = FailingCursor(ledger, ledger.last_position)
    dedup = await enabled(ledger, entries_interval=1)
    write(dedup, ledger, "p1", 1)
    await dedup.flush_snapshot()
    assert dedup.status is Status.ENABLED
    assert cursor(ledger).mark_delete_position == (-1, -1)
    second = write(dedup, ledger, "p1", 2)
    await dedup.flush_snapshot()
    assert (cursor(ledger).mark_delete_position, cursor(ledger).properties) == (second, {"p1": 2})


async def test_snapshot_keeps_at_most_max_producers_names_those_written_last():
    ledger = InMemoryDedupLedger()
    dedup = await enabled(ledger, entries_interval=6, max_producers=3)
    for i in range(5):
        write(dedup, ledger, f"p{i}", i)
    write(dedup, ledger, "p1", 9)  # written again: among the most recent now
    await dedup.flush_snapshot()
    assert list(cursor(ledger).properties.items()) == [("p3", 3), ("p4", 4), ("p1", 9)]  # oldest write first
    assert len(dedup.persisted) == 5  # the maps themselves are not capped


# -- recovery ------------------------------------------------------------------------------------------------------


async def test_recovery_loads_the_snapshot_into_both_maps_then_replays_the_entries_after_it():
    ledger = InMemoryDedupLedger()
    dedup = await enabled(ledger, entries_interval=3)
    write(dedup, ledger, "p1", 0)
    write(dedup, ledger, "p2", 10, 14)
    write(dedup, ledger, "p1", 1)  # snapshot here
    write(dedup, ledger, "p1", 2, 6)
    write(dedup, ledger, "p3", 0)
    await dedup.flush_snapshot()
    ledger.append(MessageMetadata(producer_name="marker", sequence_id=99, marker_type=12), 0, 0)
    ledger.append(MessageMetadata(producer_name="txn", sequence_id=99, is_control=True), 0, 0)
    ledger.append(MessageMetadata(sequence_id=99), 0, 0)
    ledger.roll()  # a restart rolls the ledger
    recovered = await enabled(ledger, entries_interval=100)
    assert recovered.persisted == {"p1": 6, "p2": 14, "p3": 0}
    assert recovered.pushed == recovered.persisted
    assert recovered.last_recorded_position == ledger.last_position
    assert recovered.is_duplicate("p1", 6, 6) is DUP
    assert recovered.is_duplicate("p2", 15, 15) is NOT_DUP


async def test_long_replay_is_snapshotted_at_once():
    ledger = InMemoryDedupLedger()
    dedup = await enabled(ledger)
    for seq in range(4):
        last = write(dedup, ledger, "p1", seq)
    recovered = await enabled(ledger, entries_interval=4)
    assert cursor(ledger).mark_delete_position == last
    assert cursor(ledger).properties == {"p1": 3}
    assert recovered.status is Status.ENABLED


async def test_entries_replayed_count_towards_the_next_snapshot():
    """Pulsar's testSnapshotCounterAfterUnload: 999 entries, reload, 1 more entry: snapshot."""
    ledger = InMemoryDedupLedger()
    dedup = await enabled(ledger, entries_interval=5)
    for seq in range(4):
        write(dedup, ledger, "p1", seq)
    recovered = await enabled(ledger, entries_interval=5)
    assert cursor(ledger).mark_delete_position == (-1, -1)
    fifth = write(recovered, ledger, "p1", 4)
    await recovered.flush_snapshot()
    assert cursor(ledger).mark_delete_position == fifth


# -- inactivity purge ----------------------------------------------------------------------------------------------


async def test_inactive_producers_are_purged_and_the_snapshot_rewritten_at_the_same_position():
    ledger, clock = InMemoryDedupLedger(), Clock()
    dedup = await enabled(ledger, clock, entries_interval=2)
    write(dedup, ledger, "p1", 1)
    position = write(dedup, ledger, "p2", 2)
    await dedup.flush_snapshot()
    assert cursor(ledger).properties == {"p1": 1, "p2": 2}
    dedup.producer_removed("p1", clock.now)
    dedup.producer_removed("p2", clock.now)
    dedup.producer_added("p2")  # reconnected: no longer inactive
    assert dedup.purge_inactive(60, now=clock.now + 60) == []  # not older than the timeout yet
    assert dedup.purge_inactive(60, now=clock.now + 61) == ["p1"]
    await dedup.flush_snapshot()
    assert dedup.persisted == {"p2": 2} and dedup.pushed == {"p2": 2}
    assert (cursor(ledger).mark_delete_position, cursor(ledger).properties) == (position, {"p2": 2})
    assert dedup.last_sequence_id("p1") == -1
    assert dedup.is_duplicate("p1", 0, 0) is NOT_DUP  # a returning producer starts afresh


async def test_purge_during_a_snapshot_in_flight_resnapshots_after_it():
    ledger, clock = InMemoryDedupLedger(), Clock()
    dedup = await enabled(ledger, clock, entries_interval=2)
    write(dedup, ledger, "p1", 1)
    dedup.producer_removed("p1", clock.now)
    last = write(dedup, ledger, "p2", 2)  # starts a count snapshot that still holds p1
    assert dedup.purge_inactive(60, now=clock.now + 61) == ["p1"]
    await dedup.flush_snapshot()
    assert (cursor(ledger).mark_delete_position, cursor(ledger).properties) == (last, {"p2": 2})
    assert cursor(ledger).mark_deletes == 2
    recovered = await enabled(ledger, clock)
    assert recovered.persisted == {"p2": 2}  # p1 does not come back after a restart


async def test_purge_keeps_a_producer_with_a_write_in_flight():
    ledger, clock = InMemoryDedupLedger(), Clock()
    dedup = await enabled(ledger, clock)
    write(dedup, ledger, "p1", 1)
    dedup.producer_removed("p1", clock.now)
    dedup.is_duplicate("p1", 2, 2)  # still being written
    assert dedup.purge_inactive(60, now=clock.now + 61) == []
    dedup.record_persisted("p1", 2, 2, ledger.append(metadata("p1", 2), 0, 0))
    assert dedup.purge_inactive(60, now=clock.now + 61) == ["p1"]


async def test_recovered_producers_count_as_inactive_and_disabled_dedup_tracks_none():
    ledger, clock = InMemoryDedupLedger(), Clock()
    dedup = await enabled(ledger, clock)
    write(dedup, ledger, "p1", 1)
    recovered = await enabled(ledger, clock)
    assert recovered.inactive == {"p1": clock.now}
    assert recovered.purge_inactive(60, now=clock.now + 61) == ["p1"]
    await recovered.check_status(False)
    recovered.producer_removed("p2", clock.now)
    assert recovered.inactive == {}
