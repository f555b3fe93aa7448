"""The nemesis soak for about two minutes each (`make soak` runs it for ten, with the Java client too): idempotent
producers of three client libraries and a consumer group with a member of each through a seeded schedule of cuts,
kill -9, pauses, a full disk, deduplication turned off and on, failing cursor-log flushes, torn appends and restarts
onto a full disk, with a transactional producer through the same faults; the same clients and checker against two
clusters that replicate both ways (the replicators' link cut, either cluster killed or paused, the group failing
over) and against three brokers on PostgreSQL (owners and coordinators killed or paused, PostgreSQL crash-restarted);
and the checker's verdict on histories it must reject."""
import os

import pytest

from integration.idem_raw import StoredRecord
from integration.idem_stream import Report
from integration.soak.checker import judge_members
from integration.soak.cluster import Unavailable, run_cluster_soak
from integration.soak.consumers import CommitMark, GroupMember
from integration.soak.geo import positions_ahead, run_geo_soak
from integration.soak.run import run_soak
from integration.soak.storage_faults import OffWindow, excuse_dedup_off_copies

SEED = int(os.environ.get("SOAK_SEED", 20260))
CLIENTS = ["confluent", "kafka-python", "aiokafka"]  # the Java client starts a JVM per 400 records: make soak only
TOPOLOGY_SECONDS = 75  # of faults, for the geo and cluster runs: with their catch-up and failover, about 2 minutes


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_minutes_of_random_faults_lose_duplicate_and_reorder_nothing(tmp_path):
    result = run_soak(str(tmp_path), 120, SEED, clients=CLIENTS)
    print("\n" + result.report())
    kinds = {step.kind for step in result.steps}
    # Controls: the schedule's faults happened and were felt, and every client took part in the group.
    assert len(kinds) >= 3, f"the seed planned too few kinds of fault: {kinds}"
    controls = result.controls
    if "cut" in kinds:
        assert controls["cuts"] > 0, "no response was cut"
    if "disk_full" in kinds:
        assert controls["enospc"] > 0, "the disk never filled up"
    if kinds & {"kill", "pause"}:
        assert controls["rebalances"] > 0, "the group never rebalanced"
    if "cursor_fail" in kinds:
        assert controls["injected_failures"] > 0, "no cursor-log flush failed"
    if "torn_write" in kinds:
        assert controls["torn_writes"] > 0, "no append was torn"
    if "dedup_flip" in kinds:
        assert result.storage.flips > 0 and result.storage.off_windows, "deduplication was never turned off"
    if "full_disk_restart" in kinds:
        assert result.storage.full_disk_refusals + result.storage.full_disk_starts > 0, "no start met a full disk"
    assert sorted(m.client for m in result.members) == sorted(CLIENTS)
    for member in result.members:
        assert member.consumed > 0 and member.generations > 0, member.summary()
    [txn] = result.transactions  # transactions both committed and aborted, the aborted ones' records stored
    assert txn.committed > 0 and txn.aborted > 0 and txn.aborted_stored > 0, txn.summary()
    assert result.ok, result.report()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_clusters_replicating_both_ways_through_random_faults_replicate_once_and_fail_over_without_loss(tmp_path):
    result = run_geo_soak(str(tmp_path), TOPOLOGY_SECONDS, SEED, clients=CLIENTS, two_way=True)
    print("\n" + result.report())
    kinds = {step.kind for step in result.steps}
    controls = result.controls
    assert len(kinds) >= 3, f"the seed planned too few kinds of fault: {kinds}"
    for kind in kinds & {"kill_a", "kill_b", "pause_a", "pause_b"}:
        assert controls[f"struck_{kind}"] > 0, kind
    if "link_down" in kinds:
        assert controls["link_connections_severed"] > 0, "no replication link was cut"
    if "link_lossy" in kinds:
        assert controls["link_answers_lost"] > 0, "no replication answer was lost"
    if "cut" in kinds:
        assert controls["client_cuts"] > 0, "no response was cut"
    if kinds & {"kill_b", "link_down"}:
        assert controls["replicators_recovered"] > 0, "no replicator ever lost its remote"
    assert controls["groups_moved_by_updates"] > 0, "the group's position never reached b"
    replicas = [c for c in result.checks if hasattr(c, "present")]
    assert len(replicas) == 2 * len(CLIENTS) and all(r.present > 0 for r in replicas), result.report()
    [failover] = [c for c in result.checks if hasattr(c, "reached")]
    assert failover.produced_after > 0, failover.summary()
    a, b = result.transactions  # committed and aborted in a; b holds the committed ones only
    assert a.committed > 0 and a.aborted > 0 and a.aborted_stored > 0 and b.replica, a.summary()
    assert result.ok, result.report()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_three_brokers_on_postgresql_through_random_faults_lose_duplicate_and_reorder_nothing(tmp_path):
    try:
        result = run_cluster_soak(str(tmp_path), TOPOLOGY_SECONDS, SEED, clients=CLIENTS)
    except Unavailable as exc:
        pytest.skip(str(exc))
    print("\n" + result.report())
    kinds = {step.kind for step in result.steps}
    controls = result.controls
    assert len(kinds) >= 3, f"the seed planned too few kinds of fault: {kinds}"
    for kind in kinds - {"cut"}:
        assert controls[f"struck_{kind}"] > 0, kind
    if "cut" in kinds:
        assert controls["cuts"] > 0, "no response was cut"
    if kinds & {"pause_owner", "pause_coordinator"}:
        assert controls["leases_ran_out"] > 0, "no paused broker lost its lease"
    if "pg_restart" in kinds:
        assert controls["pg_recoveries"] > 0 and controls["lease_renewals_failed"] > 0, "PostgreSQL never went down"
    if kinds & {"kill_owner", "kill_group_coordinator", "kill_txn_coordinator"}:
        assert controls["coordinators_moved"] > 0 and controls["rebalances"] > 0, "nothing moved off a killed broker"
    for member in result.members:
        assert member.consumed > 0 and member.generations > 0, member.summary()
    [txn] = result.transactions
    assert txn.committed > 0 and txn.aborted > 0 and txn.aborted_stored > 0, txn.summary()
    assert result.ok, result.report()


def test_the_failover_checker_names_a_position_in_b_ahead_of_what_the_group_committed_in_a():
    """b's position counts against the first committed offsets a answered no earlier; a record of b's before it
    that a's offset had not passed (or that a never had) is a position ahead, one a failover would have skipped."""
    def rec(offset: int, value: bytes) -> StoredRecord:
        return StoredRecord(0, offset, None, value, 1, 0)

    tp = ("t", 0)
    in_a = {tp: [rec(0, b"a0"), rec(1, b"b0"), rec(2, b"a1"), rec(3, b"a2")]}
    in_b = {tp: [rec(0, b"b0"), rec(1, b"a0"), rec(2, b"a1"), rec(3, b"a2"), rec(4, b"b1")]}
    history_a = [(1.0, {tp: 1}), (3.0, {tp: 3}), (5.0, {tp: 4})]
    fine = [(0.5, {tp: 0}), (2.0, {tp: 3}), (4.5, {tp: 4})]  # b0 is at 1 in a: passed once a committed 3
    assert positions_ahead(fine, history_a, in_a, in_b) == ([], 1)  # at 0.5 a failover would repeat a0
    early = [(0.5, {tp: 2})]  # b0 and a0 in b, but a had committed only a0 when asked next
    assert positions_ahead(early, history_a, in_a, in_b) == ([(tp, 2, 1)], 0)
    never = [(6.0, {tp: 5})]  # b1 never reached a
    assert positions_ahead(never, history_a, in_a, in_b) == ([(tp, 5, 4)], 0)


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
    assert verdicts["a"].trail == {("t", 0): [("a", 3, 10), ("b", 3, 12), ("a", 4, 5)]} and verdicts["b"].trail == {}
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
