"""Application-chosen sequence ids at a real broker, batch by batch (hand-made Produce v9 requests, so every offset is
exact): a record whose `kop.sequence.id` is not above the highest stored for its `kop.producer.name` on its partition
is dropped and leaves a hole in the batch's offsets; gaps are allowed; names, and records without the headers, mix in
one batch; compressed batches are rewritten with their codec; malformed headers refuse the batch; a write still in
flight makes its name's duplicates wait; the state survives kill -9."""
import json
import subprocess

import pytest

from integration.idem_raw import BASE_TIMESTAMP, RawKafka, read_topic
from integration.test_dedup_policies import admin, partition_stats, snapshot_at_last_entry
from integration.test_metrics import sample, scrape
from integration.waiting import wait_until
from kop.admin.client import AdminError, topic_resource
from kop.client.sequences import last_sequence_ids
from protocol.compression import CODEC_NAMES
from protocol.errors import ErrorCode
from protocol.records import Record, build_batch, split_batches

NAME, SEQUENCE = "kop.producer.name", "kop.sequence.id"
FAILPOINTS = {"adminFailpointsEnabled": "true"}


def record(name: str | None, sequence: int | None, value: bytes, **extra_headers: bytes) -> tuple:
    headers = []
    if name is not None:
        headers.append((NAME, name.encode()))
    if sequence is not None:
        headers.append((SEQUENCE, str(sequence).encode()))
    headers += [(k, v) for k, v in extra_headers.items()]
    return value, tuple(headers)


def batch(records: list[tuple], *, producer_id: int = -1, base_sequence: int = -1, compression: int = 0) -> bytes:
    return build_batch([Record(offset=i, timestamp=BASE_TIMESTAMP + i, key=None, value=value, headers=headers)
                        for i, (value, headers) in enumerate(records)],
                       producer_id=producer_id, producer_epoch=0 if producer_id >= 0 else -1,
                       base_sequence=base_sequence, compression=compression)


def stored(broker, topic: str) -> list[tuple[int, bytes]]:
    return [(r.offset, r.value) for r in read_topic(broker.port, topic, [0])]


def answer(reply) -> tuple[ErrorCode, int]:
    return ErrorCode(reply.error_code), reply.base_offset


@pytest.fixture
def broker(start_broker):
    return start_broker()  # with its admin API


@pytest.fixture
def kafka(broker):
    with RawKafka(broker.port) as client:
        yield client


def test_a_record_not_above_the_highest_id_stored_for_its_name_is_dropped_and_leaves_a_hole(broker, kafka):
    topic = "holes"
    assert kafka.create_topic(topic) == 0
    first = [record("job-a", i, b"a%d" % i) for i in range(5)]
    assert answer(kafka.produce(topic, 0, batch(first))) == (ErrorCode.NONE, 0)
    # A re-run of the job: ids 3 and 4 again, then 5 and 6. The batch is stored at 5..8; 5 and 6 stay holes.
    again = [record("job-a", i, b"a%d" % i) for i in (3, 4, 5, 6)]
    assert answer(kafka.produce(topic, 0, batch(again))) == (ErrorCode.NONE, 5)
    assert stored(broker, topic) == [(i, b"a%d" % i) for i in range(5)] + [(7, b"a5"), (8, b"a6")]
    assert kafka.end_offsets(topic, [0]) == {0: 9}
    assert partition_stats(broker, topic)["namedSequences"] == {
        "names": 1, "duplicatesDropped": 2, "droppedWithoutIdempotence": 2}


def test_the_ordering_hazard_without_idempotence_and_how_idempotence_closes_it(broker, kafka):
    """A producer without idempotence whose retry reorders two batches of a name loses the earlier one: its ids are
    below the highest stored. kop logs it once per name and counts it (stats and metrics). An idempotent producer
    cannot reorder: the later batch is refused OUT_OF_ORDER_SEQUENCE_NUMBER until the earlier one is stored."""
    topic = "hazard"
    assert kafka.create_topic(topic) == 0
    early, late = [record("loader", i, b"e%d" % i) for i in range(3)], [record("loader", i, b"l%d" % i) for i in (3, 4)]
    assert answer(kafka.produce(topic, 0, batch(late))) == (ErrorCode.NONE, 0)  # the retry overtook the first batch
    assert answer(kafka.produce(topic, 0, batch(early))) == (ErrorCode.NONE, -1)  # all dropped: lost
    kafka.produce(topic, 0, batch([record("loader", 2, b"again")]))  # the same name again: no second log line
    kafka.produce(topic, 0, batch([record("other", 9, b"o9")]))
    kafka.produce(topic, 0, batch([record("other", 1, b"o1")]))
    assert [value for _, value in stored(broker, topic)] == [b"l3", b"l4", b"o9"]
    assert partition_stats(broker, topic)["namedSequences"]["droppedWithoutIdempotence"] == 5
    metrics = scrape(broker)
    assert sample(metrics, "kop_sequence_id_records_dropped_without_idempotence_total", topic=topic) == 5
    with open(broker.log_path) as f:
        warned = [line for line in f if "is not above the highest stored" in line]
    assert [("'loader'" in line, "'other'" in line) for line in warned] == [(True, False), (False, True)]

    # With idempotence the same reordering is refused, not lost: the late batch comes back once the early one is in.
    idem = "hazard-idempotent"
    assert kafka.create_topic(idem) == 0
    pid = kafka.init_producer_id().producer_id
    assert answer(kafka.produce(idem, 0, batch(early[:1], producer_id=pid, base_sequence=0))) == (ErrorCode.NONE, 0)
    refused = kafka.produce(idem, 0, batch(late, producer_id=pid, base_sequence=3))
    assert refused.error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert answer(kafka.produce(idem, 0, batch(early[1:], producer_id=pid, base_sequence=1))) == (ErrorCode.NONE, 1)
    assert answer(kafka.produce(idem, 0, batch(late, producer_id=pid, base_sequence=3))) == (ErrorCode.NONE, 3)
    assert [value for _, value in stored(broker, idem)] == [b"e0", b"e1", b"e2", b"l3", b"l4"]


def test_ids_may_have_gaps_and_any_id_at_or_below_the_highest_is_a_duplicate(broker, kafka):
    """Pulsar's testProducerDeduplicationWithDiscontinuousSequenceId: 2, 3, 5, then 2, 4, 6: 4 is dropped."""
    topic = "gaps"
    assert kafka.create_topic(topic) == 0
    for seq in (2, 3, 5):
        kafka.produce(topic, 0, batch([record("p", seq, b"first-%d" % seq)]))
    for seq in (2, 4, 6):
        kafka.produce(topic, 0, batch([record("p", seq, b"second-%d" % seq)]))
    assert [value for _, value in stored(broker, topic)] == [b"first-2", b"first-3", b"first-5", b"second-6"]


def test_names_and_records_without_the_headers_mix_in_one_batch(broker, kafka):
    topic = "mixed"
    assert kafka.create_topic(topic) == 0
    kafka.produce(topic, 0, batch([record("a", 1, b"a1"), record("b", 7, b"b7")]))
    mixed = [record("a", 1, b"a1-again"), record(None, None, b"plain"), record("b", 8, b"b8"),
             record("a", 2, b"a2"), record("a", 2, b"a2-twice-in-one-batch"), record("c", 0, b"c0")]
    assert answer(kafka.produce(topic, 0, batch(mixed))) == (ErrorCode.NONE, 2)
    assert stored(broker, topic) == [(0, b"a1"), (1, b"b7"), (3, b"plain"), (4, b"b8"), (5, b"a2"), (7, b"c0")]


def test_a_batch_of_only_duplicates_from_a_producer_without_idempotence_stores_nothing_and_gets_its_offset(
        start_broker):
    """A resend of a stored batch (a producer without idempotence retrying after a lost response, or a job re-run) is
    answered with the offset its first record was stored at, while the partition remembers it: one of the last
    batches of its name since the partition was loaded. Otherwise -1, Kafka's answer for a duplicate whose offset it
    no longer knows."""
    broker = start_broker()
    topic = "all-duplicates"
    with RawKafka(broker.port) as kafka:
        assert kafka.create_topic(topic) == 0
        kafka.produce(topic, 0, batch([record("other", 1, b"o1")]))
        kafka.produce(topic, 0, batch([record("p", i, b"v%d" % i) for i in range(3)]))  # at 1..3
        kafka.produce(topic, 0, batch([record("p", i, b"v%d" % i) for i in (5, 7)]))  # at 4, 5: a gap in its ids
        assert answer(kafka.produce(topic, 0, batch([record("p", i, b"v%d" % i) for i in range(3)]))) == (
            ErrorCode.NONE, 1)
        assert answer(kafka.produce(topic, 0, batch([record("p", i, b"v%d" % i) for i in (1, 2)]))) == (
            ErrorCode.NONE, 2)  # part of a stored batch of consecutive ids
        assert answer(kafka.produce(topic, 0, batch([record("p", 7, b"v7")]))) == (
            ErrorCode.NONE, -1)  # inside a batch with a gap: not known (its first, 5, is)
        assert answer(kafka.produce(topic, 0, batch([record("p", 5, b"v5")]))) == (ErrorCode.NONE, 4)
        assert answer(kafka.produce(topic, 0, batch([record("p", 4, b"never")]))) == (
            ErrorCode.NONE, -1)  # never stored (a gap below the highest): no offset to give
    broker.stop()
    broker.start()
    with RawKafka(broker.port) as kafka:
        assert answer(kafka.produce(topic, 0, batch([record("p", i, b"v%d" % i) for i in range(3)]))) == (
            ErrorCode.NONE, -1)  # not stored since the partition was loaded: not known
        assert kafka.end_offsets(topic, [0]) == {0: 6}
    assert stored(broker, topic) == [(0, b"o1")] + [(i + 1, b"v%d" % i) for i in range(3)] + [(4, b"v5"), (5, b"v7")]


SNAPSHOT_EVERY_SECOND = {"brokerDeduplicationSnapshotFrequencyInSeconds": "1",
                         "brokerDeduplicationSnapshotIntervalSeconds": "1"}


@pytest.mark.parametrize("recovery", ["replay", "snapshot"])
def test_a_batch_of_only_duplicates_from_an_idempotent_producer_is_kept_empty_and_gets_the_original_offset(
        start_broker, recovery):
    """An idempotent producer's batch whose records were all stored before is stored as an empty batch, so its
    sequence numbers count and its next batch is in sequence; it is answered, as a producer without idempotence is,
    with its original base offset: where its first record was stored the first time (records of several earlier
    batches: its first record's; -1 when not known), and so are its retries, also after kill -9, from a replay of
    the log or from a snapshot of the producer state."""
    broker = start_broker(SNAPSHOT_EVERY_SECOND if recovery == "snapshot" else {})
    topic = "empty-batch"
    values = [record("p", i, b"v%d" % i) for i in range(8)]
    with RawKafka(broker.port) as kafka:
        assert kafka.create_topic(topic) == 0
        kafka.produce(topic, 0, batch([record("other", 1, b"o1")]))  # at 0
        pid = kafka.init_producer_id().producer_id

        def idempotent(records: list[tuple], sequence: int, compression: int = 0) -> bytes:
            return batch(records, producer_id=pid, base_sequence=sequence, compression=compression)

        assert answer(kafka.produce(topic, 0, idempotent(values[0:3], 0))) == (ErrorCode.NONE, 1)  # at 1..3
        # The same records again (sequences 3..5): an empty batch at 4..6, uncompressed as Kafka writes one
        # (librdkafka aborts on a codec's frame of nothing), answered where they are.
        repeated = idempotent(values[0:3], 3, compression=3)  # lz4
        assert answer(kafka.produce(topic, 0, repeated)) == (ErrorCode.NONE, 1)
        assert answer(kafka.produce(topic, 0, repeated)) == (ErrorCode.NONE, 1)  # its retry: the same
        assert answer(kafka.produce(topic, 0, idempotent(values[3:5], 6))) == (ErrorCode.NONE, 7)  # at 7..8
        several = idempotent(values[1:4], 8)  # records of two earlier batches, at 2, 3 and 7: empty at 9..11
        assert answer(kafka.produce(topic, 0, several)) == (ErrorCode.NONE, 2)
        # Partly new: 4 is dropped (a hole at 12), 5 and 6 are stored at 13 and 14; then all of those again.
        assert answer(kafka.produce(topic, 0, idempotent(values[4:7], 11))) == (ErrorCode.NONE, 12)
        rewritten = idempotent(values[5:7], 14)  # empty at 15..16
        assert answer(kafka.produce(topic, 0, rewritten)) == (ErrorCode.NONE, 13)
        if recovery == "snapshot":
            assert wait_until(lambda: snapshot_at_last_entry(broker, topic), 10)
    broker.kill()
    broker.start()
    with RawKafka(broker.port) as kafka:
        assert answer(kafka.produce(topic, 0, several)) == (ErrorCode.NONE, 2)  # retries, from the state recovered
        assert answer(kafka.produce(topic, 0, rewritten)) == (ErrorCode.NONE, 13)
        # Where 0 was stored is not known since the partition was loaded: -1, for the batch and its retry alike.
        unknown = idempotent(values[0:1], 16)  # empty at 17
        assert answer(kafka.produce(topic, 0, unknown)) == (ErrorCode.NONE, -1)
        assert answer(kafka.produce(topic, 0, unknown)) == (ErrorCode.NONE, -1)
        assert answer(kafka.produce(topic, 0, idempotent(values[7:8], 17))) == (ErrorCode.NONE, 18)  # in sequence
        empty = [(h.base_offset, h.records_count, h.last_offset_delta, h.base_sequence, h.compression)
                 for h, _ in split_batches(kafka.fetch_once(topic, 0, 0)[2]) if h.records_count == 0]
    assert empty == [(4, 0, 2, 3, 0), (9, 0, 2, 8, 0), (15, 0, 1, 14, 0), (17, 0, 0, 16, 0)]
    assert stored(broker, topic) == [(0, b"o1"), (1, b"v0"), (2, b"v1"), (3, b"v2"), (7, b"v3"), (8, b"v4"),
                                     (13, b"v5"), (14, b"v6"), (18, b"v7")]


def test_a_retry_of_a_batch_of_only_duplicates_still_being_written_gets_the_original_offset(start_broker):
    broker = start_broker(FAILPOINTS)
    topic = "empty-in-flight"
    values = [record("p", i, b"v%d" % i) for i in range(2)]
    with RawKafka(broker.port) as kafka, RawKafka(broker.port) as retry:
        assert kafka.create_topic(topic) == 0
        kafka.produce(topic, 0, batch([record("other", 1, b"o1")]))  # at 0
        pid = kafka.init_producer_id().producer_id
        assert answer(kafka.produce(topic, 0, batch(values, producer_id=pid, base_sequence=0))) == (ErrorCode.NONE, 1)
        admin(broker).post(f"/admin/v2/kop/failpoints/{topic}/0", {"hold_flushes": True})
        repeated = batch(values, producer_id=pid, base_sequence=2)
        first = kafka.send_produce(topic, 0, repeated)  # its empty batch is written, not yet durable
        assert wait_until(lambda: partition_stats(broker, topic)["namedSequences"]["duplicatesDropped"] == 2, 10)
        again = retry.send_produce(topic, 0, repeated)  # the client's retry: it waits for the write
        assert wait_until(lambda: sample(scrape(broker), "kop_dedup_decisions_total", topic=topic,
                                         decision="unknown") == 1, 10)
        admin(broker).post(f"/admin/v2/kop/failpoints/{topic}/0", {"hold_flushes": False})
        assert answer(kafka.receive_produce(first)) == (ErrorCode.NONE, 1)
        assert answer(retry.receive_produce(again)) == (ErrorCode.NONE, 1)
        assert kafka.end_offsets(topic, [0]) == {0: 5}  # one empty batch, at 3..4
    assert stored(broker, topic) == [(0, b"o1"), (1, b"v0"), (2, b"v1")]


@pytest.mark.parametrize("codec", sorted(CODEC_NAMES))
def test_a_compressed_batch_is_rewritten_with_its_codec(broker, kafka, codec):
    topic = f"codec-{CODEC_NAMES[codec]}"
    assert kafka.create_topic(topic) == 0
    kafka.produce(topic, 0, batch([record("z", 1, b"z1")], compression=codec))
    assert answer(kafka.produce(topic, 0, batch([record("z", i, b"z%d" % i) for i in (1, 2, 3)],
                                                compression=codec))) == (ErrorCode.NONE, 1)
    assert stored(broker, topic) == [(0, b"z1"), (2, b"z2"), (3, b"z3")]
    [(header, _)] = [b for b in split_batches(kafka.fetch_once(topic, 0, 1)[2]) if b[0].base_offset == 1]
    assert (header.compression, header.records_count, header.last_offset_delta) == (codec, 2, 2)


@pytest.mark.parametrize("headers, complaint", [
    ({NAME: b"p"}, f"header {NAME} comes without {SEQUENCE}"),
    ({SEQUENCE: b"3"}, f"header {SEQUENCE} comes without {NAME}"),
    ({NAME: b"p", SEQUENCE: b"-3"}, f"header {SEQUENCE} must be a decimal ASCII integer"),
    ({NAME: b"p", SEQUENCE: b"12a"}, f"header {SEQUENCE} must be a decimal ASCII integer"),
    ({NAME: b"p", SEQUENCE: b"9223372036854775808"}, f"header {SEQUENCE} 9223372036854775808 is beyond int64"),
    ({NAME: b"", SEQUENCE: b"1"}, f"header {NAME} is empty"),
    ({NAME: b"n" * 257, SEQUENCE: b"1"}, f"header {NAME} has 257 bytes, more than 256"),
    ({NAME: b"\xff\xfe", SEQUENCE: b"1"}, f"header {NAME} is not UTF-8"),
])
def test_malformed_headers_refuse_the_batch_with_invalid_record_naming_the_header(broker, kafka, headers, complaint):
    topic = "malformed"
    kafka.create_topic(topic)
    good = record("p", 1, b"good")
    bad = (b"bad", tuple(headers.items()))
    reply = kafka.produce(topic, 0, batch([good, bad]))
    assert ErrorCode(reply.error_code) is ErrorCode.INVALID_RECORD
    assert complaint in reply.error_message and "record 1" in reply.error_message, reply.error_message
    assert stored(broker, topic) == []  # nothing of the batch, not even its good record


def test_a_duplicate_of_a_write_still_in_flight_is_answered_retriably_then_dropped(start_broker):
    broker = start_broker(FAILPOINTS)
    topic = "in-flight"
    with RawKafka(broker.port) as kafka, RawKafka(broker.port) as rerun:
        assert kafka.create_topic(topic) == 0
        admin(broker).post(f"/admin/v2/kop/failpoints/{topic}/0", {"hold_flushes": True})
        first = kafka.send_produce(topic, 0, batch([record("p", 1, b"first")]))
        assert wait_until(lambda: partition_stats(broker, topic)["publishers"] is not None, 5)
        # The same name and id from another producer (a task retried while the first attempt's write hangs).
        assert answer(rerun.produce(topic, 0, batch([record("p", 1, b"rerun")]))) == (
            ErrorCode.REQUEST_TIMED_OUT, -1)
        admin(broker).post(f"/admin/v2/kop/failpoints/{topic}/0", {"hold_flushes": False})
        assert answer(kafka.receive_produce(first)) == (ErrorCode.NONE, 0)
        assert answer(rerun.produce(topic, 0, batch([record("p", 1, b"rerun")]))) == (ErrorCode.NONE, 0)
    assert stored(broker, topic) == [(0, b"first")]


def test_the_highest_ids_survive_kill_9(start_broker):
    broker = start_broker({"brokerDeduplicationEntriesInterval": "3"})  # snapshots, and a replay after them
    topic = "after-crash"
    with RawKafka(broker.port) as kafka:
        assert kafka.create_topic(topic) == 0
        for i in range(8):
            kafka.produce(topic, 0, batch([record(f"name-{i % 3}", 100 + i, b"v%d" % i)]))
    broker.kill()
    broker.start()
    with RawKafka(broker.port) as kafka:
        replay = [record(f"name-{i % 3}", 100 + i, b"v%d" % i) for i in range(8)] + [record("name-0", 200, b"new")]
        assert answer(kafka.produce(topic, 0, batch(replay))) == (ErrorCode.NONE, 8)
    assert [value for _, value in stored(broker, topic)] == [b"v%d" % i for i in range(8)] + [b"new"]


def test_with_deduplication_disabled_the_headers_are_plain_headers(start_broker):
    broker = start_broker()
    topic = "not-deduplicated"
    with RawKafka(broker.port) as kafka:
        assert kafka.create_topic(topic) == 0
        admin(broker).post(topic_resource(topic, "deduplicationEnabled"), False)
        kafka.produce(topic, 0, batch([record("p", 1, b"x")]))
        kafka.produce(topic, 0, batch([record("p", 1, b"x"), record("p", 0, b"y")]))
        kafka.produce(topic, 0, batch([(b"z", ((SEQUENCE, b"not a number"),))]))  # not read at all
    assert [value for _, value in stored(broker, topic)] == [b"x", b"x", b"y", b"z"]


def test_the_last_stored_id_per_name_and_partition_over_rest_cli_and_client(broker, kafka, kop_script):
    topic = "seek"
    assert kafka.create_topic(topic, partitions=2) == 0
    kafka.produce(topic, 0, batch([record("loader/a.jsonl", i * 10, b"x") for i in range(10)]))
    kafka.produce(topic, 1, batch([record("loader/a.jsonl", 1000, b"y"), record("other", 5, b"z")]))
    rest = admin(broker).get(topic_resource(topic, "sequences"), producer="loader/a.jsonl")
    assert rest == {"producer": "loader/a.jsonl", "partitions": {"0": 90, "1": 1000}}
    assert admin(broker).get(topic_resource(topic, "sequences"), producer="never")["partitions"] == {
        "0": None, "1": None}
    assert last_sequence_ids(broker.admin_url, topic, "loader/a.jsonl") == {0: 90, 1: 1000}
    assert last_sequence_ids(broker.admin_url, topic, "other") == {1: 5}
    assert last_sequence_ids(broker.admin_url, "no-such-topic", "other") == {}
    cli = subprocess.run([kop_script, "admin", "--admin-url", broker.admin_url, "topics", "last-sequence-id", topic,
                          "--producer", "other"], capture_output=True, text=True, timeout=30)
    assert cli.returncode == 0, cli.stderr
    assert json.loads(cli.stdout)["partitions"] == {"0": None, "1": 5}


def test_a_purged_name_is_unknown_not_a_stale_number(start_broker):
    broker = start_broker({"testDedupProducerInactivityTimeoutSeconds": "1"})
    topic = "purged"
    with RawKafka(broker.port) as kafka:
        assert kafka.create_topic(topic) == 0
        kafka.produce(topic, 0, batch([record("short-lived", 7, b"x")]))
    assert last_sequence_ids(broker.admin_url, topic, "short-lived") == {0: 7}
    assert wait_until(lambda: last_sequence_ids(broker.admin_url, topic, "short-lived") == {}, 15)


def test_while_the_state_is_recovered_the_last_id_is_not_answered_and_the_client_waits(start_broker):
    broker = start_broker(FAILPOINTS)
    topic = "recovering"
    with RawKafka(broker.port) as kafka:
        assert kafka.create_topic(topic) == 0
        admin(broker).post(topic_resource(topic, "deduplicationEnabled"), False)
        kafka.produce(topic, 0, batch([record("p", 3, b"x")]))  # stored, not judged: dedup is off
        admin(broker).post(f"/admin/v2/kop/failpoints/{topic}/0", {"replay_read_failures": 1})
        admin(broker).post(topic_resource(topic, "deduplicationEnabled"), True)  # its recovery fails
        assert partition_stats(broker, topic)["deduplicationStatus"] == "Failed"
        with pytest.raises(AdminError) as refused:
            admin(broker).get(topic_resource(topic, "sequences"), producer="p")
        assert refused.value.status == 503
        assert last_sequence_ids(broker.admin_url, topic, "p") == {}  # once retried: history before the enable
        kafka.produce(topic, 0, batch([record("p", 4, b"y")]))
        assert last_sequence_ids(broker.admin_url, topic, "p") == {0: 4}
