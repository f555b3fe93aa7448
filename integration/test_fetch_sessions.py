"""Fetch sessions (KIP-227) over raw sockets against a real broker: a full fetch makes a session, incremental fetches
name only what changed and are answered only what changed (records, a moved high watermark, errors), forgotten
partitions leave the session, and each session error (FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH,
FETCH_SESSION_TOPIC_ID_ERROR) is answered as Kafka answers it; the cache's slot limit holds."""
import uuid

import pytest

from integration.broker_process import BrokerProcess
from integration.fetch_requests import receive_session_answer, send_session_fetch, session_fetch
from integration.idem_raw import RawKafka, plain_batch
from integration.test_metrics import sample, scrape
from protocol.api import REQUEST_CLASSES, RESPONSE_CLASSES
from protocol.errors import ErrorCode

V = 12  # topics by name
V_IDS = 16  # topics by id


def produce(raw: RawKafka, topic: str, partition: int, *values: bytes) -> None:
    assert raw.produce(topic, partition, plain_batch(list(values))).error_code == ErrorCode.NONE


def topic_id(raw: RawKafka, topic: str) -> uuid.UUID:
    Metadata = REQUEST_CLASSES[3][12]
    meta = raw.call(Metadata(topics=[Metadata.MetadataRequestTopic(name=topic, topic_id=uuid.UUID(int=0))],
                             allow_auto_topic_creation=False, include_topic_authorized_operations=False),
                    RESPONSE_CLASSES[3], 12)
    return meta.topics[0].topic_id


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One broker for the tests below, each on a topic of its own."""
    broker = BrokerProcess(str(tmp_path_factory.mktemp("fetch-sessions") / "data")).start()
    yield broker
    broker.stop()


@pytest.fixture
def s(request) -> str:
    """The test's topic."""
    return f"s-{request.node.name[5:40]}"


@pytest.fixture
def raw(shared, s):
    with RawKafka(shared.port) as raw:
        assert raw.create_topic(s, 4) == ErrorCode.NONE
        for p in range(4):
            produce(raw, s, p, f"s{p}-0".encode())
        yield raw


def test_incremental_fetches_answer_only_partitions_with_something_new_and_lose_or_repeat_nothing(s, raw):
    full = session_fetch(raw, V, 0, 0, [(s, p, 0) for p in range(4)])
    assert full.error == ErrorCode.NONE and full.session_id > 0
    assert {k: v[2] for k, v in full.partitions.items()} == {(s, p): [f"s{p}-0".encode()] for p in range(4)}
    session = full.session_id
    # The consumer moves past what it read: it names those partitions with their new offsets.
    step = session_fetch(raw, V, session, 1, [(s, p, 1) for p in range(4)])
    assert step.error == ErrorCode.NONE and step.session_id == session and step.partitions == {}
    # Nothing named, nothing new: an empty answer.
    assert session_fetch(raw, V, session, 2).partitions == {}
    # New records on two partitions: only those are answered, from the offsets the session remembers.
    produce(raw, s, 1, b"s1-1", b"s1-2")
    produce(raw, s, 3, b"s3-1")
    step = session_fetch(raw, V, session, 3)
    assert step.partitions == {(s, 1): (0, 3, [b"s1-1", b"s1-2"]), (s, 3): (0, 2, [b"s3-1"])}
    # Not moved past them yet: the session still reads partition 1 from offset 1, and says so again.
    assert session_fetch(raw, V, session, 4, [(s, 3, 2)]).partitions == {(s, 1): (0, 3, [b"s1-1", b"s1-2"])}
    assert session_fetch(raw, V, session, 5, [(s, 1, 3)]).partitions == {}
    # An idle partition's high watermark moving is news too (the consumer's lag), with its records.
    produce(raw, s, 0, b"s0-1")
    assert session_fetch(raw, V, session, 6).partitions == {(s, 0): (0, 2, [b"s0-1"])}


def test_a_long_poll_on_a_session_wakes_for_a_partition_the_request_did_not_name(shared, s, raw):
    session = session_fetch(raw, V, 0, 0, [(s, p, 1) for p in range(4)]).session_id
    correlation_id = send_session_fetch(raw, V, session, 1, max_wait_ms=10_000, min_bytes=1)
    with RawKafka(shared.port) as other:
        produce(other, s, 2, b"late")
    answer = receive_session_answer(raw, correlation_id, V)
    assert answer.partitions == {(s, 2): (0, 2, [b"late"])}


def test_forgotten_partitions_leave_the_session_and_forgetting_all_closes_it(s, raw):
    session = session_fetch(raw, V, 0, 0, [(s, p, 1) for p in range(4)]).session_id
    assert session_fetch(raw, V, session, 1, forgotten=[(s, 0), (s, 1)]).partitions == {}
    produce(raw, s, 0, b"unseen")
    produce(raw, s, 2, b"seen")
    assert set(session_fetch(raw, V, session, 2).partitions) == {(s, 2)}
    closing = session_fetch(raw, V, session, 3, forgotten=[(s, 2), (s, 3)])
    assert closing.error == ErrorCode.NONE and closing.session_id == 0
    assert session_fetch(raw, V, session, 4).error == ErrorCode.FETCH_SESSION_ID_NOT_FOUND


def test_partition_errors_are_answered_every_time_and_the_partition_again_once_the_error_clears(s, raw):
    session = session_fetch(raw, V, 0, 0, [(s, 0, 1), (s, 1, 1), ("nosuch", 0, 0)]).session_id
    for epoch in (1, 2):
        answer = session_fetch(raw, V, session, epoch)
        assert answer.partitions == {("nosuch", 0): (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1, [])}
    # An offset past the end: OFFSET_OUT_OF_RANGE each time, until the consumer moves back.
    assert session_fetch(raw, V, session, 3, [(s, 0, 9)]).partitions[(s, 0)][0] == ErrorCode.OFFSET_OUT_OF_RANGE
    assert session_fetch(raw, V, session, 4).partitions[(s, 0)][0] == ErrorCode.OFFSET_OUT_OF_RANGE
    back = session_fetch(raw, V, session, 5, [(s, 0, 1)], forgotten=[("nosuch", 0)])
    assert back.partitions == {(s, 0): (ErrorCode.NONE, 1, [])}  # told again though nothing changed
    assert session_fetch(raw, V, session, 6).partitions == {}


def test_session_errors_are_answered_at_the_top_level_with_no_partitions(s, raw):
    session = session_fetch(raw, V, 0, 0, [(s, 0, 1)]).session_id
    unknown = session_fetch(raw, V, session ^ 0x55, 1)
    assert (unknown.error, unknown.session_id, unknown.partitions) == (ErrorCode.FETCH_SESSION_ID_NOT_FOUND, 0, {})
    wrong_epoch = session_fetch(raw, V, session, 7)
    assert (wrong_epoch.error, wrong_epoch.partitions) == (ErrorCode.INVALID_FETCH_SESSION_EPOCH, {})
    by_id = session_fetch(raw, V_IDS, session, 1)  # a session made by names, asked by ids
    assert (by_id.error, by_id.partitions) == (ErrorCode.FETCH_SESSION_TOPIC_ID_ERROR, {})
    # Control: the errors left the session as it was, so its next epoch works.
    assert session_fetch(raw, V, session, 1).error == ErrorCode.NONE
    # Epoch -1 closes it; epoch 0 naming it closes it and makes another.
    replaced = session_fetch(raw, V, session, 0, [(s, 0, 1)])
    assert replaced.session_id not in (0, session)
    assert session_fetch(raw, V, session, 2).error == ErrorCode.FETCH_SESSION_ID_NOT_FOUND
    closed = session_fetch(raw, V, replaced.session_id, -1, [(s, 0, 1)])
    assert closed.error == ErrorCode.NONE and closed.session_id == 0 and (s, 0) in closed.partitions
    assert session_fetch(raw, V, replaced.session_id, 1).error == ErrorCode.FETCH_SESSION_ID_NOT_FOUND


def test_an_answer_whose_session_moved_on_while_it_waited_is_an_epoch_error(shared, s, raw):
    """The same session used from two connections: the request that waits finds the session past its epoch when
    it is answered, and is told so rather than given partitions the session no longer expects."""
    session = session_fetch(raw, V, 0, 0, [(s, 0, 1)]).session_id
    waiting = send_session_fetch(raw, V, session, 1, max_wait_ms=5_000, min_bytes=1)
    with RawKafka(shared.port) as other:
        assert session_fetch(other, V, session, 2).error == ErrorCode.NONE  # served at once: the epoch moves on
        produce(other, s, 0, b"wake")
    answer = receive_session_answer(raw, waiting, V)
    assert (answer.error, answer.session_id, answer.partitions) == (ErrorCode.INVALID_FETCH_SESSION_EPOCH, session,
                                                                    {})


def test_sessions_by_topic_id_answer_unknown_ids_and_refuse_requests_by_name(s, raw):
    tid = topic_id(raw, s)
    ghost = uuid.uuid4()
    full = session_fetch(raw, V_IDS, 0, 0, [(tid, 0, 1), (tid, 1, 0), (ghost, 0, 0)])
    assert full.session_id > 0 and full.partitions[(tid, 1)][2] == [b"s1-0"]
    assert full.partitions[(ghost, 0)][0] == ErrorCode.UNKNOWN_TOPIC_ID
    produce(raw, s, 0, b"by-id")
    step = session_fetch(raw, V_IDS, full.session_id, 1, [(tid, 1, 1)], forgotten=[])
    assert step.partitions == {(tid, 0): (0, 2, [b"by-id"]), (ghost, 0): (ErrorCode.UNKNOWN_TOPIC_ID, -1, [])}
    assert session_fetch(raw, V, full.session_id, 2).error == ErrorCode.FETCH_SESSION_TOPIC_ID_ERROR
    assert session_fetch(raw, V_IDS, full.session_id, 2, [(tid, 0, 2)], forgotten=[(ghost, 0)]).partitions == {}


def test_the_cache_holds_at_most_its_slots_and_counts_its_fetches(start_broker):
    broker = start_broker({"max.incremental.fetch.session.cache.slots": "1"})
    with RawKafka(broker.port) as raw:
        raw.create_topic("s", 2)
        first = session_fetch(raw, V, 0, 0, [("s", 0, 0)])
        second = session_fetch(raw, V, 0, 0, [("s", 0, 0), ("s", 1, 0)])
        # The first session is young and used: not evicted, so the second fetch is answered without a session.
        assert first.session_id > 0 and second.session_id == 0 and ("s", 1) in second.partitions
        assert session_fetch(raw, V, first.session_id, 1).error == ErrorCode.NONE
        metrics = scrape(broker)
        assert sample(metrics, "kop_fetch_sessions") == 1 and sample(metrics, "kop_fetch_session_partitions") == 1
        assert sample(metrics, "kop_fetch_session_requests_total", kind="full") == 2
        assert sample(metrics, "kop_fetch_session_requests_total", kind="incremental") == 1
        session_fetch(raw, V, first.session_id, 9)
        assert sample(scrape(broker), "kop_fetch_session_requests_total", kind="session_error") == 1


def test_no_slots_means_every_fetch_is_full(broker_factory):
    broker = broker_factory({"max.incremental.fetch.session.cache.slots": "0"})
    with RawKafka(broker.port) as raw:
        raw.create_topic("s", 1)
        answer = session_fetch(raw, V, 0, 0, [("s", 0, 0)])
        assert answer.error == ErrorCode.NONE and answer.session_id == 0 and ("s", 0) in answer.partitions
