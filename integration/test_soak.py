"""The nemesis soak for two minutes (`make soak` runs it for ten, with the Java client too): idempotent producers of
three client libraries and a consumer group with a member of each through a seeded schedule of cuts, kill -9, pauses,
a full disk, deduplication turned off and on, failing cursor-log flushes and restarts onto a full disk, with a
transactional producer through the same faults; and the checker's verdict on histories it must reject."""
import os

import pytest

from integration.idem_raw import StoredRecord
from integration.idem_stream import Report
from integration.soak.checker import judge_members
from integration.soak.consumers import CommitMark, GroupMember
from integration.soak.run import run_soak
from integration.soak.storage_faults import OffWindow, excuse_dedup_off_copies

SEED = int(os.environ.get("SOAK_SEED", 20260))
CLIENTS = ["confluent", "kafka-python", "aiokafka"]  # the Java client starts a JVM per 400 records: make soak only


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_minutes_of_random_faults_lose_duplicate_and_reorder_nothing(tmp_path):
    result = run_soak(str(tmp_path), 120, SEED, clients=CLIENTS)
    print("\n" + result.report())
    kinds = {step.kind for step in result.steps}
    # Controls: the schedule's faults happened and were felt, and every client took part in the group.
    assert len(kinds) >= 3, f"the seed planned too few kinds of fault: {kinds}"
    if "cut" in kinds:
        assert result.cuts > 0, "no response was cut"
    if "disk_full" in kinds:
        assert result.enospc > 0, "the disk never filled up"
    if kinds & {"kill", "pause"}:
        assert result.rebalances > 0, "the group never rebalanced"
    if "cursor_fail" in kinds:
        assert result.injected_failures > 0, "no cursor-log flush failed"
    if "dedup_flip" in kinds:
        assert result.storage.flips > 0 and result.storage.off_windows, "deduplication was never turned off"
    if "full_disk_restart" in kinds:
        assert result.storage.full_disk_refusals + result.storage.full_disk_starts > 0, "no start met a full disk"
    assert sorted(m.client for m in result.members) == sorted(CLIENTS)
    for member in result.members:
        assert member.consumed > 0 and member.generations > 0, member.summary()
    txn = result.transactions  # transactions both committed and aborted, the aborted ones' records stored
    assert txn.committed > 0 and txn.aborted > 0 and txn.aborted_stored > 0, txn.summary()
    assert result.ok, result.report()


class Recorded(GroupMember):
    """A member's history written by hand, for the checker."""

    def __init__(self, client: str, commits: list[CommitMark], owned: set[tuple[str, int]]) -> None:
        super().__init__("unused:9092", "g", ["t"], client, lifetime=0)
        self.client = client
        self.commits = commits
        self.final_owned = owned

    def consume(self) -> None:
        raise AssertionError("never started")


def test_the_checker_names_shared_backwards_and_stuck_partitions_per_consuming_client():
    a = Recorded("a", [CommitMark(3, {("t", 0): 10}, 1.0), CommitMark(4, {("t", 0): 5}, 3.0)], {("t", 0)})
    b = Recorded("b", [CommitMark(3, {("t", 0): 12, ("t", 1): 7}, 2.0), CommitMark(-1, {("t", 1): 9}, 2.5)], set())
    c = Recorded("c", [CommitMark(5, {("t", 1): 20}, 4.0)], {("t", 1)})
    latest = {("t", 0): 12, ("t", 1): 20}
    ends = {("t", 0): 15, ("t", 1): 20}
    verdicts = {v.client: v for v in judge_members([a, b, c], latest, ends, backwards=[("t", 0, 12, 5)])}
    assert verdicts["a"].shared == [(("t", 0), 3, "b")] and verdicts["b"].shared == [(("t", 0), 3, "a")]
    assert verdicts["a"].backwards == [(("t", 0), 12, 5)] and verdicts["b"].backwards == []
    assert verdicts["a"].stuck == {("t", 0): 3} and verdicts["c"].stuck == {}
    assert verdicts["b"].generations == 1  # the generation -1 commit tells nothing
    assert not verdicts["a"].ok and not verdicts["b"].ok and verdicts["c"].ok


def test_only_copies_stored_while_deduplication_was_off_are_excused():
    def rec(partition: int, offset: int, value: bytes) -> StoredRecord:
        return StoredRecord(partition, offset, None, value, 1, 0)

    windows = [OffWindow("t", 0, 10, 20)]
    stored = [rec(0, 5, b"a"), rec(0, 12, b"a"),  # retried while off: excused
              rec(0, 6, b"b"), rec(0, 25, b"b"),  # stored again after it was on: a duplicate
              rec(1, 11, b"c"), rec(1, 12, b"c"),  # another partition, never off: a duplicate
              rec(0, 13, b"d"), rec(0, 14, b"d")]  # both while off, the second one acknowledged: it is kept
    reports = [Report(b"d", 0, 14, None)]
    kept, excused = excuse_dedup_off_copies("t", stored, reports, windows)
    assert excused == 2
    assert sorted((r.partition, r.offset) for r in kept) == [(0, 5), (0, 6), (0, 14), (0, 25), (1, 11), (1, 12)]
    assert excuse_dedup_off_copies("other", stored, reports, windows) == (stored, 0)
