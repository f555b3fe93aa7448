"""The fast paths of application-chosen sequence ids give what the record-by-record paths give:

* reading: `SequenceHeaderScan` (a producer's `[name, id]` records read by their shape) finds each record's pair, and
  accepts or refuses a batch, exactly as decoding every header would (random batches, hand-made framings);
* judging: `judge_run` (a batch of one name with rising ids, all new, judged once) decides as `judge_records`;
* storing: a stream of batches through a real partition (file ledger) with the fast path and with it switched off
  leaves the same answers, stored bytes, dedup state, snapshots and recovered state."""
import asyncio
import struct
from unittest import mock

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kop.sequence_filter
from dedup import DedupConfig
from dedup.memory import InMemoryDedupLedger
from dedup.message_deduplication import MessageDeduplication
from dedup.named_sequences import commit, judge_records, judge_run
from kop.ledger import FileManagedLedger, LedgerConfig
from kop.partition import PartitionLog
from kop.sequence_filter import MAX_RUN_NAMES, RUNS_PER_NAME, Run, SequenceFilter, StoredRuns
from protocol import records as records_module
from protocol.compression import CODEC_NAMES, RecordBatchError
from protocol.records import (HEADER, HEADER_SIZE, Record, _walk_records, build_batch, iter_records, split_batches,
                              validate_batch)
from protocol.sequence_headers import (ABSENT, TWICE, SequencedRecords, SequenceHeaderScan, _checked_one_by_one,
                                       sequenced_records)
from protocol.varint import encode_varint

NAME, SEQUENCE = "kop.producer.name", "kop.sequence.id"

# Headers a record may carry: ours (valid or not), keys that nearly are ours, and others.
header = st.one_of(
    st.tuples(st.just(NAME), st.sampled_from([b"a", b"b", b"", None, "é".encode(), b"\xff", b"n" * 257])),
    st.tuples(st.just(SEQUENCE), st.sampled_from([b"0", b"1", b"7", b"12", b"", None, b"-1", b"1a", b"\xd9\xa1",
                                                  b"9223372036854775807", b"9223372036854775808", b"0" * 30])),
    st.tuples(st.sampled_from(["kop.producer.nam", "kop.sequence.ie", "kop.producer.namf", "kop.sequence.iD",
                               "app.producer.name", "trace"]), st.sampled_from([b"x", None])),
)
pair = st.tuples(st.sampled_from([b"a", b"b", b"" + b"q" * 40]), st.integers(0, 10**18)).map(
    lambda p: ((NAME, p[0]), (SEQUENCE, b"%d" % p[1])))
record_headers = st.one_of(pair, pair, pair, st.just(()), st.lists(header, max_size=4).map(tuple))


def expected_pairs(raw: bytes) -> list[tuple]:
    """(index, raw name, raw id) of each record with either header, from every header decoded: the reference."""
    out = []
    for index, record in enumerate(iter_records(raw)):
        found = {}
        for key, value in record.headers:
            if key in (NAME, SEQUENCE):
                found[key] = TWICE if key in found else (value or b"")
        if found:
            out.append((index, found.get(NAME, ABSENT), found.get(SEQUENCE, ABSENT)))
    return out


def python_scan(raw: bytes) -> SequenceHeaderScan | None:
    """The batch validated with the Python walk and its scan (not the C walk, which reads a producer's run itself)."""
    [(batch_header, view)] = split_batches(raw)
    with mock.patch.object(records_module, "_fast_walk", None):
        return validate_batch(batch_header, view, watch=SequenceHeaderScan).headers


def scanned(raw: bytes):
    scan = python_scan(raw)
    return [] if scan is None else list(zip(scan.indexes, scan.names, scan.ids))


def one_by_one(raw: bytes) -> SequencedRecords:
    """What the scan's findings give when every record is checked on its own (the reference for the batch check)."""
    return _checked_one_by_one(python_scan(raw))


def as_lists(sequenced: SequencedRecords) -> tuple:
    """Its fields, a run's ranges as lists."""
    return list(sequenced.indexes), sequenced.names, list(sequenced.ids), sequenced.name, sequenced.rising


@settings(max_examples=300, deadline=None)
@given(st.lists(record_headers, min_size=1, max_size=12), st.sampled_from(sorted(CODEC_NAMES)))
def test_the_scan_finds_what_decoding_every_header_finds(headers, codec):
    raw = build_batch([Record(i, 1_000, None, b"v", h) for i, h in enumerate(headers)], compression=codec)
    assert scanned(raw) == expected_pairs(raw)
    if not expected_pairs(raw):
        return
    try:
        reference = one_by_one(raw)
    except RecordBatchError as exc:
        for scan in (python_scan(raw), validate_batch(*split_batches(raw)[0], watch=SequenceHeaderScan).headers):
            with pytest.raises(RecordBatchError) as refused:
                sequenced_records(scan)
            assert str(refused.value) == str(exc)
        return
    for scan in (python_scan(raw), validate_batch(*split_batches(raw)[0], watch=SequenceHeaderScan).headers):
        assert as_lists(sequenced_records(scan)) == as_lists(reference)


def hand_made_batch(header_areas: list[bytes]) -> bytes:
    """A batch whose records' header areas (count and headers) are given as bytes, framings of our choosing."""
    body = bytearray()
    for delta, area in enumerate(header_areas):
        record = bytearray(b"\x00")  # attributes
        encode_varint(0, record)  # timestamp delta
        encode_varint(delta, record)
        encode_varint(-1, record)  # no key
        encode_varint(1, record)
        record += b"v"
        record += area
        encode_varint(len(record), body)
        body += record
    batch = bytearray(HEADER.size) + body
    HEADER.pack_into(batch, 0, 0, len(batch) - 12, -1, 2, 0, 0, len(header_areas) - 1, 1_000, 1_000, -1, -1, -1,
                     len(header_areas))
    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))
    return bytes(batch)


def area(*headers: tuple[bytes, bytes]) -> bytes:
    out = bytearray()
    encode_varint(len(headers), out)
    for key, length_bytes_value in headers:
        out += bytes([len(key) << 1]) + key + length_bytes_value
    return bytes(out)


SHAPE = area((NAME.encode(), b"\x02p"), (SEQUENCE.encode(), b"\x021"))


@pytest.mark.parametrize("second, sound", [
    (area((NAME.encode(), b"\x02p"), (SEQUENCE.encode(), b"\x022")), True),
    (area((NAME.encode(), b"\x02p"), (SEQUENCE.encode(), b"\x80\x012")), False),  # a two-byte length: 64, not 1
    (area((NAME.encode(), b"\x02p"), (SEQUENCE.encode(), b"\x82\x002")), True),  # 1, in two bytes
    (area((NAME.encode(), b"\x02p"), (SEQUENCE.encode(), b"\x0422")), True),
    (area((NAME.encode(), b"\x02p"), (SEQUENCE.encode(), b"\x0622")), False),  # runs past its record
    (area((NAME.encode(), b"\x02p"), (SEQUENCE.encode(), b"\x01")), True),  # a null id
    (area((NAME.encode(), b"\x82\x00p"), (SEQUENCE.encode(), b"\x022")), True),  # the name's length in two bytes
])
def test_a_record_that_almost_has_the_shape_is_read_as_decoding_reads_it(second, sound):
    raw = hand_made_batch([SHAPE, second, SHAPE])
    [(batch_header, view)] = split_batches(raw)
    if not sound:
        with pytest.raises(RecordBatchError):
            validate_batch(batch_header, view)  # the control: decoding refuses it too
        with pytest.raises(RecordBatchError):
            validate_batch(batch_header, view, watch=SequenceHeaderScan)
        return
    assert scanned(raw) == expected_pairs(raw)


# -- judging ---------------------------------------------------------------------------------------------------------

async def dedup_with(pushed: dict[str, int], persisted: dict[str, int]) -> MessageDeduplication:
    """A dedup state where each name's ids up to `persisted` are stored and up to `pushed` being written."""
    dedup = MessageDeduplication(InMemoryDedupLedger(), DedupConfig())
    await dedup.check_status(True)
    for name, sequence_id in persisted.items():
        dedup.push("app:" + name, sequence_id)
        dedup.record_persisted_names([("app:" + name, sequence_id)])
    for name, sequence_id in pushed.items():
        dedup.push("app:" + name, sequence_id)
    return dedup


batch_ids = st.one_of(
    st.builds(lambda first, n: list(range(first, first + n)), st.integers(0, 30), st.integers(1, 8)),
    st.lists(st.integers(0, 40), min_size=1, max_size=8),  # gaps, repeats, going down
)


@settings(max_examples=400, deadline=None)
@given(ids=batch_ids, plain=st.lists(st.integers(0, 8), max_size=3), persisted=st.integers(-1, 35),
       in_flight=st.integers(0, 6))
def test_a_batch_judged_once_is_judged_as_record_by_record(ids, plain, persisted, in_flight):
    state = {} if persisted < 0 else {"a": persisted}
    pushed = {"a": persisted + in_flight} if persisted >= 0 and in_flight else {}
    records: list[tuple] = [("a", i) for i in ids]
    for position in sorted(plain):  # records without the headers, here and there
        records.insert(min(position, len(records)), (None, None))
    dedup = asyncio.run(dedup_with(pushed, state))
    reference = judge_records(dedup, records)
    fast = judge_run(dedup, "a", ids, len(records))
    if fast is not None:  # it decides only what it can decide at once: all kept
        assert (list(fast.keep), fast.dropped, fast.highest, fast.unknown) == (
            list(reference.keep), reference.dropped, reference.highest, reference.unknown)
        assert not reference.dropped and reference.unknown is None
    sequenced = SequencedRecords([i for i, r in enumerate(records) if r[0]], ["a"] * len(ids), ids, "a")
    whole = SequenceFilter(dedup, "t-0").judge(sequenced, len(records))
    assert (list(whole.keep), whole.dropped, whole.highest, whole.unknown) == (
        list(reference.keep), reference.dropped, reference.highest, reference.unknown)


async def test_the_fast_judgement_is_taken_for_a_producers_next_records():
    dedup = await dedup_with({}, {"a": 9})
    assert judge_run(dedup, "a", [10, 11, 12], 3).highest == {"app:a": 12}  # the control: it decides
    assert judge_run(dedup, "a", [10, 14, 20], 3).highest == {"app:a": 20}  # gaps: it decides too
    assert judge_run(dedup, "a", [9, 10], 2) is None  # a duplicate among them
    assert judge_run(dedup, "a", [11, 10], 2) is None  # going down
    commit(dedup, judge_records(dedup, [("a", 15)]))  # 15 being written
    assert judge_run(dedup, "a", [12, 13], 2) is None  # Unknown: judged record by record (and answered so)


# -- storing ---------------------------------------------------------------------------------------------------------

def sequenced_batch(pairs: list[tuple], codec: int = 0, producer_id: int = -1, base_sequence: int = -1) -> bytes:
    return build_batch([Record(i, 1_000 + i, None, b"%s-%d" % (n.encode(), s) if n else b"plain",
                               ((NAME, n.encode()), (SEQUENCE, b"%d" % s)) if n else ())
                        for i, (n, s) in enumerate(pairs)], compression=codec, producer_id=producer_id,
                       producer_epoch=0 if producer_id >= 0 else -1, base_sequence=base_sequence)


def stream() -> list[tuple[str, bytes]]:
    """Steps of a run: ("send", batch) is awaited; ("fire", batch) is left in flight until the next "send"."""
    steps = []
    for codec in sorted(CODEC_NAMES):
        base = codec * 100
        steps.append(("send", sequenced_batch([("a", base + i) for i in range(5)], codec)))  # a producer's run
        steps.append(("send", sequenced_batch([("a", base + i) for i in range(3, 8)], codec)))  # a retry overlapping
        steps.append(("send", sequenced_batch([("a", base + i) for i in range(5)], codec)))  # all duplicates
        steps.append(("send", sequenced_batch([("a", base + 10), (None, None), ("a", base + 12)], codec)))
        steps.append(("send", sequenced_batch([("b", base + 1), ("a", base + 13), ("b", base + 1)], codec)))
        steps.append(("fire", sequenced_batch([("c", base + i) for i in range(4)], codec)))  # in flight ...
        steps.append(("send", sequenced_batch([("c", base + 2), ("c", base + 3)], codec)))  # ... so Unknown
        steps.append(("send", sequenced_batch([("c", base + i) for i in range(2, 6)], codec)))
    pid, sequence = 7, 0
    for ids in ([0, 1, 2], [0, 1, 2], [3, 4], [4, 5, 6], [20, 21]):  # an idempotent producer's batches
        steps.append(("send", sequenced_batch([("k", i) for i in ids], producer_id=pid, base_sequence=sequence)))
        sequence += len(ids)
    return steps


async def run_stream(directory, fast: bool, monkeypatch) -> dict:
    taken = []

    def spy(*args):
        decision = real(*args) if fast else None
        taken.append(decision is not None)
        return decision

    real = judge_run
    monkeypatch.setattr(kop.sequence_filter, "judge_run", spy)
    ledger = FileManagedLedger.open("t-partition-0", str(directory), LedgerConfig(fsync=False), None)
    partition = PartitionLog("t", 0, ledger, DedupConfig(entries_interval=4))
    await partition.apply_dedup_policy(True)
    answers, in_flight = [], []
    for how, raw in stream():
        [(batch_header, view)] = split_batches(raw)
        result = partition.publish_normal(batch_header, view, records=validate_batch(
            batch_header, view, watch=SequenceHeaderScan))
        if how == "fire":
            in_flight.append(result)
            continue
        outcome = await result
        answers.append((outcome.error, outcome.base_offset, outcome.message))
        for earlier in in_flight:
            answers.append(((await earlier).error, "in flight"))
        in_flight.clear()
    stored = [bytes(entry.data) for entry in partition.read(0, 1 << 24)]
    state = (dict(partition.dedup.pushed), dict(partition.dedup.persisted), partition.sequences.dropped,
             partition.high_watermark)
    await partition.dedup.flush_snapshot()
    await partition.close()
    ledger = FileManagedLedger.open("t-partition-0", str(directory), LedgerConfig(fsync=False), None)
    recovered = PartitionLog("t", 0, ledger, DedupConfig(entries_interval=4))
    await recovered.apply_dedup_policy(True)
    after = {name: recovered.last_sequence_id(name) for name in "abck"}
    await recovered.close()
    return {"answers": answers, "stored": stored, "state": state, "recovered": after, "fast": sum(taken),
            "judged": len(taken)}


async def test_a_stream_stores_and_answers_the_same_with_and_without_the_fast_path(tmp_path, monkeypatch):
    fast = await run_stream(tmp_path / "fast", True, monkeypatch)
    slow = await run_stream(tmp_path / "slow", False, monkeypatch)
    assert fast["fast"] >= 15 and slow["fast"] == 0  # the control: the fast path ran, and then did not
    assert fast["judged"] == slow["judged"]
    for what in ("answers", "stored", "state", "recovered"):
        assert fast[what] == slow[what], what
    assert [r.value for raw in fast["stored"][:3] for r in iter_records(raw)][:5] == [b"a-%d" % i for i in range(5)]


def test_stored_runs_answer_from_the_latest_batch_of_a_name_and_forget_the_oldest():
    runs = StoredRuns()
    runs.stored(Run("a", 1, 5, 0, consecutive=True), base=0)
    runs.stored(Run("a", 1, 5, 2, consecutive=True), base=10)  # its resend after a failed write, stored at 12..16
    assert (runs.offset_of("a", 1), runs.offset_of("a", 4), runs.offset_of("a", 6)) == (12, 15, -1)
    for i in range(RUNS_PER_NAME):
        runs.stored(Run("a", 10 + i, 10 + i, 0, consecutive=True), base=100 + i)
    assert runs.offset_of("a", 1) == -1 and runs.offset_of("a", 10) == 100  # only the last RUNS_PER_NAME
    for i in range(MAX_RUN_NAMES):
        runs.stored(Run(f"n{i}", 0, 0, 0, consecutive=True), base=i)
    assert runs.offset_of("a", 10) == -1 and runs.offset_of(f"n{MAX_RUN_NAMES - 1}", 0) == MAX_RUN_NAMES - 1


def test_a_batch_of_other_headers_is_searched_once_and_a_later_record_with_ours_is_still_read():
    other = (("trace", b"t"), ("app.sequence.id", b"1"))
    raw = build_batch([Record(i, 1_000, None, b"v", other) for i in range(3)] +
                      [Record(3, 1_000, None, b"v", ((NAME, b"p"), (SEQUENCE, b"4")))])
    assert scanned(raw) == [(3, b"p", b"4")]
    [(batch_header, view)] = split_batches(build_batch([Record(i, 1_000, None, b"v", other) for i in range(3)]))
    scan = SequenceHeaderScan()
    _walk_records(bytes(view), HEADER_SIZE, batch_header, True, headers=scan)  # the Python walk, which watches
    assert not scan.watching and not scan.found  # the walk skipped the later records' headers itself


async def test_a_run_s_name_is_checked_again_whenever_it_changes(tmp_path):
    """The run path keeps the last name it checked per partition: a run of another name, valid or not, is checked as
    the record-by-record path checks it (an INVALID_RECORD naming record 0, nothing stored), the last good one is not
    taken for it."""
    ledger = FileManagedLedger.open("t-partition-0", str(tmp_path), LedgerConfig(fsync=False), None)
    partition = PartitionLog("t", 0, ledger, DedupConfig())
    await partition.apply_dedup_policy(True)

    async def publish(name: bytes, first: int) -> tuple:
        raw = build_batch([Record(i, 1_000, None, b"v", ((NAME, name), (SEQUENCE, b"%d" % (first + i))))
                           for i in range(3)])
        [(batch_header, view)] = split_batches(raw)
        records = validate_batch(batch_header, view, watch=SequenceHeaderScan)
        if records_module._fast_walk_watched is not None:
            assert records.headers.run_read is not None  # the control: read as a run, so judged on the run path
        outcome = await partition.publish_normal(batch_header, view, records=records)
        return outcome.error, outcome.message

    assert await publish(b"a", 0) == (0, None)
    for bad, problem in ((b"n" * 257, "has 257 bytes, more than 256"), (b"\xff", "is not UTF-8"),
                         (b"a\xff", "is not UTF-8")):
        error, message = await publish(bad, 10)
        assert error == 87 and message.startswith(f"record 0: header {NAME} {problem}"), message  # INVALID_RECORD
    assert await publish("é".encode(), 0) == (0, None)
    assert await publish(b"a", 3) == (0, None)
    assert await publish(b"a", 3) == (0, None)  # all duplicates: answered, not stored again
    assert (partition.last_sequence_id("a"), partition.last_sequence_id("é"), partition.high_watermark) == (5, 2, 9)
    await partition.close()
