"""ListOffsets (earliest, latest, by timestamp), fetch from any offset, out-of-range offsets, long polling, and
retention deleting whole ledgers."""
import time

from kafka import KafkaConsumer, TopicPartition

from integration.clients import ck_produce, kp_consume_all
from integration.fetch_requests import FETCH_VERSION, fetch_answers, fetch_request
from integration.idem_raw import RawKafka, plain_batch
from protocol.errors import ErrorCode

PARKED_MAX_WAIT_MS = 300_000  # far longer than LIVENESS_S: a fetch that waits for it fails the test
LIVENESS_S = 60.0  # how long a test waits for an answer that a working broker sends at once


def consumer(broker):
    return KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None, enable_auto_commit=False,
                         auto_offset_reset="none", consumer_timeout_ms=2000)


def test_list_offsets_earliest_latest_and_by_timestamp(broker):
    base = 1_700_000_000_000
    records = [(None, f"t{i}".encode(), [], base + i * 1000) for i in range(30)]
    for i in range(0, 30, 10):  # three batches
        ck_produce(broker.bootstrap, "times", records[i:i + 10], **{"linger.ms": 50})
    c = consumer(broker)
    tp = TopicPartition("times", 0)
    assert c.beginning_offsets([tp]) == {tp: 0}
    assert c.end_offsets([tp]) == {tp: 30}
    found = c.offsets_for_times({tp: base + 15_000})[tp]  # inside the second batch: its record, not its start
    assert (found.offset, found.timestamp) == (15, base + 15_000)
    found = c.offsets_for_times({tp: base + 15_500})[tp]
    assert (found.offset, found.timestamp) == (16, base + 16_000)
    assert c.offsets_for_times({tp: base + 10**9})[tp] is None
    c.close()


def test_fetch_from_any_offset_and_out_of_range(broker):
    ck_produce(broker.bootstrap, "seek", [(None, f"s{i}".encode(), [], 1_700_000_000_000) for i in range(40)],
               **{"linger.ms": 20})
    c = consumer(broker)
    tp = TopicPartition("seek", 0)
    c.assign([tp])
    c.seek(tp, 17)
    got = []
    deadline = time.monotonic() + 10
    while len(got) < 23 and time.monotonic() < deadline:
        for batch in c.poll(timeout_ms=500).values():
            got.extend(batch)
    assert [m.offset for m in got] == list(range(17, 40))
    c.seek(tp, 1000)
    from kafka.errors import OffsetOutOfRangeError
    raised = False
    deadline = time.monotonic() + 10
    while not raised and time.monotonic() < deadline:
        try:
            c.poll(timeout_ms=500)
        except OffsetOutOfRangeError:
            raised = True
    assert raised
    c.close()


def test_long_poll_answers_with_data_produced_while_it_waits(broker):
    """A fetch parked at the end of the log (max wait 300 s) is answered by the next durable write: the record
    produced while it waits comes back in that same fetch, well before its max wait could have passed."""
    with RawKafka(broker.port, timeout=LIVENESS_S) as waiting, RawKafka(broker.port) as producer:
        producer.create_topic("poll")
        assert producer.produce("poll", 0, plain_batch([b"first"])).error_code == ErrorCode.NONE
        parked = waiting.send(fetch_request([("poll", 0, 1)], max_wait_ms=PARKED_MAX_WAIT_MS, min_bytes=1))
        # Give the broker a moment to park the fetch; if it reads the fetch after the write instead, the fetch
        # finds the record at once and the assertion below holds just the same.
        time.sleep(0.5)
        assert producer.produce("poll", 0, plain_batch([b"late"])).error_code == ErrorCode.NONE
        assert fetch_answers(waiting, parked) == {("poll", 0): (ErrorCode.NONE, [b"late"])}


def test_a_fetch_with_an_errored_partition_is_answered_at_once(broker):
    """As in Kafka, an error on any partition ends the long poll: the client hears of an unknown partition or an
    out-of-range offset now, not after max_wait_ms, even though the request's other partition has no data yet."""
    with RawKafka(broker.port, timeout=LIVENESS_S) as raw:
        raw.create_topic("quiet")
        raw.create_topic("filled")
        assert raw.produce("filled", 0, plain_batch([b"a", b"b"])).error_code == ErrorCode.NONE
        cases = [(("quiet", 7, 0), ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),  # no partition 7
                 (("no-such-topic", 0, 0), ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
                 (("filled", 0, 99), ErrorCode.OFFSET_OUT_OF_RANGE)]  # the log ends at 2
        for errored, code in cases:
            parked = raw.send(fetch_request([("quiet", 0, 0), errored], max_wait_ms=PARKED_MAX_WAIT_MS,
                                            min_bytes=1))
            answers = fetch_answers(raw, parked)
            assert answers == {("quiet", 0): (ErrorCode.NONE, []), errored[:2]: (code, [])}, errored


def test_retention_deletes_old_ledgers_and_moves_the_log_start(broker_factory):
    b = broker_factory({"log.segment.bytes": "2000", "retention_check_interval_ms": "300",
                        "brokerDeduplicationEnabled": "false"})
    from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    admin.create_topics([NewTopic("short", 1, 1, config={"retention.ms": "500"})])["short"].result(10)
    # a compact-only topic is never trimmed by retention (its keys are distinct: compaction removes nothing)
    admin.create_topics([NewTopic("kept", 1, 1, config={"retention.ms": "500",
                                                         "cleanup.policy": "compact"})])["kept"].result(10)
    for i in range(20):
        for topic in ("short", "kept"):  # keyed: a compacted topic refuses records without a key
            ck_produce(b.bootstrap, topic, [(b"k%d" % i, bytes([i]) * 500, [], 1_700_000_000_000 + i)])
    c = consumer(b)
    tp = TopicPartition("short", 0)
    deadline = time.monotonic() + 20
    start = 0
    while start == 0 and time.monotonic() < deadline:
        time.sleep(0.3)
        start = c.beginning_offsets([tp])[tp]
    assert 0 < start <= 20
    # retention stops here, so what is left outlives a slow reader (it would go on deleting the idle ledger)
    altered = admin.alter_configs([ConfigResource("topic", "short", set_config={"retention.ms": "-1"})])
    altered[ConfigResource("topic", "short")].result(10)
    start = c.beginning_offsets([tp])[tp]  # a deletion may have landed before the change
    assert c.end_offsets([tp])[tp] == 20
    kept = TopicPartition("kept", 0)
    assert (c.beginning_offsets([kept])[kept], c.end_offsets([kept])[kept]) == (0, 20)
    if start < 20:  # retention reaches the current ledger too once all of it expired: then nothing is left
        remaining = kp_consume_all(b.bootstrap, "short", 20 - start, timeout=10)
        assert remaining and remaining[0].offset == start
    c.close()


def test_log_append_time_topics_stamp_batches_with_the_broker_clock(broker):
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("lat", 1, 1, config={"message.timestamp.type": "LogAppendTime"})])["lat"].result(10)
    before = int(time.time() * 1000)
    reports = ck_produce(broker.bootstrap, "lat", [(None, b"old", [], 1_000)])
    assert reports[0][0] is None
    got = kp_consume_all(broker.bootstrap, "lat", 1)
    assert before - 1000 <= got[0].timestamp <= int(time.time() * 1000) + 1000


def test_fetch_limits_only_the_first_batch_may_exceed_them(broker):
    """KIP-74: max_bytes and partition_max_bytes are soft only for the response's first batch, so a consumer is never
    stuck behind a large batch; every other partition gets whole batches that fit, or nothing."""
    from protocol.api import RESPONSE_CLASSES
    from protocol.records import split_batches

    big = [b"x" * 3000]
    with RawKafka(broker.port) as raw:
        raw.create_topic("limits", 2)
        for partition in (0, 1):
            for _ in range(2):
                assert raw.produce("limits", partition, plain_batch(big)).error_code == ErrorCode.NONE

        def fetch(max_bytes, partition_max_bytes):
            request = fetch_request([("limits", p, 0) for p in (0, 1)], max_bytes=max_bytes,
                                    partition_max_bytes=partition_max_bytes)
            response = raw.call(request, RESPONSE_CLASSES[1], FETCH_VERSION)
            return [len(split_batches(bytes(p.records))) if p.records else 0
                    for p in response.responses[0].partitions]

        assert fetch(100, 100) == [1, 0]  # the first batch exceeds both limits and still comes back
        assert fetch(7000, 100) == [1, 0]  # partition 1's batch exceeds its partition limit
        assert fetch(5000, 10_000) == [1, 0]  # the second batch would exceed max_bytes
        assert fetch(7000, 10_000) == [2, 0]
        assert fetch(20_000, 10_000) == [2, 2]
        assert fetch(20_000, 4000) == [1, 1]


def test_fetch_v13_and_later_name_topics_by_id(broker):
    """Fetch v13+ addresses topics by the id Metadata gave out; an unknown id is UNKNOWN_TOPIC_ID."""
    import uuid

    from protocol.api import REQUEST_CLASSES, RESPONSE_CLASSES
    from protocol.records import iter_records, split_batches

    with RawKafka(broker.port) as raw:
        raw.create_topic("by-id")
        assert raw.produce("by-id", 0, plain_batch([b"a", b"b"])).error_code == ErrorCode.NONE
        Metadata = REQUEST_CLASSES[3][12]
        meta = raw.call(Metadata(topics=[Metadata.MetadataRequestTopic(name="by-id", topic_id=uuid.UUID(int=0))],
                                 allow_auto_topic_creation=False, include_topic_authorized_operations=False),
                        RESPONSE_CLASSES[3], 12)
        topic_id = meta.topics[0].topic_id
        assert topic_id != uuid.UUID(int=0)
        for version in (13, 16, 17):
            Fetch = REQUEST_CLASSES[1][version]
            fields = dict(max_wait_ms=0, min_bytes=0, max_bytes=1 << 20, isolation_level=0, session_id=0,
                          session_epoch=-1, rack_id="", forgotten_topics_data=[],
                          topics=[Fetch.FetchTopic(topic_id=tid, partitions=[Fetch.FetchTopic.FetchPartition(
                              partition=0, current_leader_epoch=-1, fetch_offset=0, log_start_offset=-1,
                              partition_max_bytes=1 << 20)]) for tid in (topic_id, uuid.uuid4())])
            if version < 15:
                fields["replica_id"] = -1
            response = raw.call(Fetch(**fields), RESPONSE_CLASSES[1], version)
            known, unknown = response.responses
            assert known.topic_id == topic_id and known.partitions[0].error_code == ErrorCode.NONE
            values = [r.value for _, view in split_batches(bytes(known.partitions[0].records))
                      for r in iter_records(view)]
            assert values == [b"a", b"b"]
            assert unknown.partitions[0].error_code == ErrorCode.UNKNOWN_TOPIC_ID
