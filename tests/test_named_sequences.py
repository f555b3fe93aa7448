"""Application-chosen sequence ids on the PIP-6 core: each record judged on its own under its name, in a namespace
of their own, rebuilt by a replay from the entries' metadata."""
import pytest

from dedup.memory import InMemoryDedupLedger
from dedup.message_deduplication import DedupConfig, MessageDeduplication
from dedup.named_sequences import application_name, commit, core_name, judge_records
from proto.kop_pb2 import MessageMetadata, NamedSequence


async def enabled(ledger: InMemoryDedupLedger) -> MessageDeduplication:
    dedup = MessageDeduplication(ledger, DedupConfig(entries_interval=100))
    await dedup.check_status(True)
    return dedup


def store(dedup: MessageDeduplication, ledger: InMemoryDedupLedger, records: list[tuple]) -> list[int]:
    """Judge and store a batch as the produce path does; returns the indexes kept."""
    decision = judge_records(dedup, records)
    assert decision.unknown is None
    commit(dedup, decision)
    position = ledger.append(MessageMetadata(named_sequences=[
        NamedSequence(name=n, sequence_id=s) for n, s in decision.highest.items()]), 0, 0)
    dedup.record_persisted_names(decision.highest.items())
    dedup.record_persisted(None, 0, 0, position)
    return decision.keep


@pytest.fixture
def ledger():
    return InMemoryDedupLedger()


async def test_each_record_is_judged_against_the_stored_ids_and_the_batch_before_it(ledger):
    dedup = await enabled(ledger)
    assert store(dedup, ledger, [("a", 2), ("a", 3), ("b", 5)]) == [0, 1, 2]
    batch = [("a", 3), ("a", 4), ("a", 4), (None, None), ("b", 5), ("b", 9), ("a", 1)]
    decision = judge_records(dedup, batch)
    assert (decision.keep, decision.dropped) == ([1, 3, 5], [0, 2, 4, 6])
    assert decision.highest == {core_name("a"): 4, core_name("b"): 9}


async def test_a_name_with_a_higher_id_in_flight_makes_the_batch_undecidable(ledger):
    dedup = await enabled(ledger)
    commit(dedup, judge_records(dedup, [("a", 10)]))  # pushed, not persisted yet
    decision = judge_records(dedup, [("b", 1), ("a", 7)])
    assert decision.unknown == "a" and decision.keep == []
    assert dedup.pushed_sequence_id(core_name("b")) is None  # nothing pushed for an undecided batch


async def test_application_names_live_apart_from_kafka_producer_names(ledger):
    dedup = await enabled(ledger)
    store(dedup, ledger, [("KOP-PID-1-0", 5)])
    assert dedup.persisted_sequence_id("KOP-PID-1-0") is None
    assert application_name(core_name("KOP-PID-1-0")) == "KOP-PID-1-0" and application_name("KOP-PID-1-0") is None


async def test_a_replay_rebuilds_the_names_from_the_entries_metadata(ledger):
    dedup = await enabled(ledger)
    store(dedup, ledger, [("a", 1), ("b", 8)])
    store(dedup, ledger, [("a", 2), ("a", 1)])
    recovered = await enabled(ledger)  # no snapshot yet: everything is replayed
    assert recovered.persisted_sequence_id(core_name("a")) == 2
    assert recovered.persisted_sequence_id(core_name("b")) == 8
    assert judge_records(recovered, [("a", 2), ("b", 9)]).keep == [1]
