"""The fetch-session cache and its rules (kop/fetch_sessions.py), on a clock the test moves: epochs, session errors,
updates and forgotten partitions, what an incremental answer must include, and Kafka's eviction order."""
from kop.fetch_sessions import (EVICTION_S, FINAL_EPOCH, INITIAL_EPOCH, MAX_EPOCH, FetchPlan, FetchSessionCache,
                                Groups, Wanted, next_epoch, outdated, plan_fetch)
from protocol.errors import ErrorCode


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def wanted(*partitions: int, topic: str = "t", offset: int = 0) -> Groups:
    return [(topic, [Wanted(topic, p, offset, 1 << 20) for p in partitions])]


def made(cache: FetchSessionCache, plan: FetchPlan) -> int:
    """The session a full fetch's answer makes (as the Fetch handler makes it), or 0."""
    assert plan.kind == "full"
    return cache.create(plan.uses_topic_ids, {(topic, w.partition): w for topic, ws in plan.groups for w in ws})


def new_session(cache: FetchSessionCache, size: int, topic: str = "t") -> int:
    return made(cache, plan_fetch(cache, 0, INITIAL_EPOCH, False, wanted(*range(size), topic=topic), []))


def test_epochs_count_up_and_wrap_to_one_and_final_stays_final():
    assert next_epoch(INITIAL_EPOCH) == 1
    assert next_epoch(41) == 42
    assert next_epoch(MAX_EPOCH) == 1
    assert next_epoch(FINAL_EPOCH) == FINAL_EPOCH


def test_a_full_fetch_with_epoch_0_makes_a_session_and_epoch_minus_1_makes_none():
    cache = FetchSessionCache(10)
    assert plan_fetch(cache, 0, FINAL_EPOCH, False, wanted(0), []).kind == "sessionless"
    plan = plan_fetch(cache, 0, INITIAL_EPOCH, False, wanted(0, 1), [])
    session_id = made(cache, plan)
    assert session_id > 0 and len(cache) == 1 and cache.partitions == 2
    assert cache.get(session_id).epoch == 1


def test_a_full_fetch_naming_a_session_closes_it():
    cache = FetchSessionCache(10)
    first = new_session(cache, 3)
    second = made(cache, plan_fetch(cache, first, INITIAL_EPOCH, False, wanted(0), []))
    assert cache.get(first) is None and cache.get(second) is not None and second != first
    plan_fetch(cache, second, FINAL_EPOCH, False, wanted(0), [])
    assert len(cache) == 0 and cache.partitions == 0


def test_session_errors_unknown_id_wrong_epoch_and_topic_id_mode():
    cache = FetchSessionCache(10)
    session_id = new_session(cache, 2)
    assert plan_fetch(cache, session_id + 1, 1, False, [], []).error == ErrorCode.FETCH_SESSION_ID_NOT_FOUND
    assert plan_fetch(cache, session_id, 2, False, [], []).error == ErrorCode.INVALID_FETCH_SESSION_EPOCH
    assert plan_fetch(cache, session_id, 1, True, [], []).error == ErrorCode.FETCH_SESSION_TOPIC_ID_ERROR
    # None of the errors touched the session: the right epoch still works.
    plan = plan_fetch(cache, session_id, 1, False, [], [])
    assert plan.kind == "incremental" and [w.partition for _, ws in plan.groups for w in ws] == [0, 1]
    assert cache.get(session_id).epoch == 2 and cache.stats.errors == 3


def test_an_incremental_fetch_updates_adds_and_forgets_partitions():
    cache = FetchSessionCache(10)
    session_id = new_session(cache, 3)
    named = [("t", [Wanted("t", 1, 50, 100)]), ("u", [Wanted("u", 0, 7, 100)])]
    plan = plan_fetch(cache, session_id, 1, False, named, [("t", 2)])
    assert [(topic, w.partition, w.fetch_offset, w.partition_max_bytes) for topic, ws in plan.groups for w in ws] == [
        ("t", 0, 0, 1 << 20), ("t", 1, 50, 100), ("u", 0, 7, 100)]
    assert cache.partitions == 3


def test_forgetting_every_partition_closes_the_session():
    cache = FetchSessionCache(10)
    session_id = new_session(cache, 2)
    plan = plan_fetch(cache, session_id, 1, False, [], [("t", 0), ("t", 1)])
    assert plan.kind == "sessionless" and cache.get(session_id) is None


def test_an_incremental_answer_holds_records_new_watermarks_and_errors_and_an_error_is_told_again_once_gone():
    w = Wanted("t", 0, 5, 100)
    assert w.must_answer(False, 0, 5, 0)  # first answer: watermarks not yet told
    assert not w.must_answer(False, 0, 5, 0)  # nothing new
    assert w.must_answer(True, 0, 5, 0)  # records
    assert w.must_answer(False, 0, 6, 0)  # high watermark moved
    assert w.must_answer(False, 0, 6, 2)  # log start moved (retention)
    assert w.must_answer(False, ErrorCode.OFFSET_OUT_OF_RANGE, 6, 2)
    assert w.must_answer(False, 0, 6, 2)  # the error cleared: told again
    assert not w.must_answer(False, 0, 6, 2)


def test_a_partition_that_returned_records_goes_to_the_end_of_the_order():
    cache = FetchSessionCache(10)
    session_id = new_session(cache, 3)
    session = cache.get(session_id)
    session.served_records(session.partitions[("t", 0)])
    assert [p for _, p in session.partitions] == [1, 2, 0]
    session.update([("u", [Wanted("u", 0, 0, 1)])], [])
    session.served_records(session.partitions[("t", 1)])
    assert [(topic, [w.partition for w in ws]) for topic, ws in session.groups()] == [("t", [2, 0]), ("u", [0]),
                                                                                      ("t", [1])]


def test_the_same_epoch_answered_twice_finds_its_session_moved_on():
    cache = FetchSessionCache(10)
    session_id = new_session(cache, 1)
    first = plan_fetch(cache, session_id, 1, False, [], [])
    assert not outdated(first)
    second = plan_fetch(cache, session_id, 2, False, [], [])  # the next request was served while `first` waited
    assert outdated(first) and not outdated(second)


def test_no_slots_means_no_sessions():
    cache = FetchSessionCache(0)
    assert new_session(cache, 5) == 0 and len(cache) == 0


def test_a_full_cache_evicts_a_session_idle_past_the_eviction_time_first():
    clock = Clock()
    cache = FetchSessionCache(2, clock=clock)
    idle = new_session(cache, 100)
    clock.now += 1
    busy = new_session(cache, 100)
    clock.now += EVICTION_S - 1.5  # `idle` unused for EVICTION_S - 0.5
    assert new_session(cache, 1) == 0  # nothing stale yet, and nothing has lived past the eviction time
    clock.now += 1
    small = new_session(cache, 1)  # `idle` is stale now: evicted, whatever its size
    assert small and cache.get(idle) is None and cache.get(busy) is not None and cache.stats.evicted == 1


def test_a_full_cache_evicts_the_smallest_old_session_for_a_larger_one_only():
    clock = Clock()
    cache = FetchSessionCache(3, clock=clock)
    ids = {size: new_session(cache, size) for size in (10, 20, 30)}
    clock.now += EVICTION_S + 1
    for size, session_id in ids.items():  # used again: none stale, all older than the eviction time
        plan_fetch(cache, session_id, 1, False, [], [])
    assert new_session(cache, 10) == 0  # not larger than the smallest: it stays
    assert new_session(cache, 11) != 0
    assert cache.get(ids[10]) is None and cache.get(ids[20]) and cache.get(ids[30])
    assert cache.partitions == 20 + 30 + 11


def test_a_young_session_is_not_evicted_for_a_larger_one():
    clock = Clock()
    cache = FetchSessionCache(1, clock=clock)
    young = new_session(cache, 1)
    clock.now += EVICTION_S / 2
    assert new_session(cache, 1000) == 0 and cache.get(young) is not None
