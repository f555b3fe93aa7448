"""The nemesis soak for two minutes (`make soak` runs it for ten, with the Java client too): idempotent producers of
three client libraries and a two-member consumer group through a seeded schedule of cuts, kill -9, pauses, a full disk and policy flips."""
import os

import pytest

from integration.soak.run import run_soak

SEED = int(os.environ.get("SOAK_SEED", 20260))
CLIENTS = ["confluent", "kafka-python", "aiokafka"]  # the Java client starts a JVM per 400 records: make soak only


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_minutes_of_random_faults_lose_duplicate_and_reorder_nothing(tmp_path):
    result = run_soak(str(tmp_path), 120, SEED, clients=CLIENTS)
    print("\n" + result.report())
    kinds = {step.kind for step in result.steps}
    # Controls: the schedule's faults happened and were felt.
    assert len(kinds) >= 3, f"the seed planned too few kinds of fault: {kinds}"
    if "cut" in kinds:
        assert result.cuts > 0, "no response was cut"
    if "disk_full" in kinds:
        assert result.enospc > 0, "the disk never filled up"
    if kinds & {"kill", "pause"}:
        assert result.rebalances > 0, "the group never rebalanced"
    assert result.ok, result.report()
