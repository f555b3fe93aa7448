"""The C parts of protocol (protocol/_accel.c): the record walk against the Python walk it stands in for
(protocol/records.py), and the unzeroed request buffer.

The C walk may only say "sound" (with the greatest timestamp delta) where the Python walk passes the batch with the
same delta and no watched header; anything else it hands back (None), and validation walks the batch in Python. Here
both walk well-formed batches, the same batches damaged (bytes flipped, cut, inserted, a wrong record count or offset
deltas), and random bytes, with and without the sequence-id headers watched. Well-formed batches must take the C
path, or the broker would quietly pay the Python walk's cost.
"""
import os
import shutil
import struct
from unittest import mock

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from protocol import records as records_module
from protocol.compression import RecordBatchError
from protocol.records import HEADER_SIZE, BatchHeader, Record, _walk_records, build_batch, split_batches, validate_batch
from protocol.sequence_headers import (PRODUCER_NAME_HEADER, SEQUENCE_ID_HEADER, SequenceHeaderScan, consecutive_run,
                                       sequenced_records)
from protocol.varint import encode_varint

# Examples per property: a few hundred in make test; `make fuzz` runs them with FUZZ_EXAMPLES (KOP_FUZZ_EXAMPLES).
EXAMPLES = int(os.environ.get("KOP_FUZZ_EXAMPLES", "300"))
fast_walk = records_module._fast_walk
fast_walk_watched = records_module._fast_walk_watched
needs_c = pytest.mark.skipif(fast_walk is None, reason="protocol._accel is not built (no C compiler at install)")


def test_the_c_walk_is_built_where_a_compiler_is():
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler: kop walks records in Python here")
    assert fast_walk is not None, "protocol/_accel.c was not built: run `pip install -e .` (make does)"


def python_walk(data: bytes, count: int, last_delta: int, from_client: bool, watched: bool) -> tuple[int, bool] | None:
    """The Python walk's answer: (greatest timestamp delta, whether a watched header was found), or None if it
    refuses the records."""
    header = BatchHeader(0, len(data) - 12 + HEADER_SIZE, 0, 2, 0, 0, last_delta, 0, 0, -1, -1, -1, count)
    scan = SequenceHeaderScan() if watched else None
    try:
        max_ts_delta = _walk_records(data, 0, header, from_client, headers=scan)
    except RecordBatchError:
        return None
    return max_ts_delta, scan is not None and scan.found


def python_scan(data: bytes, count: int, last_delta: int, from_client: bool) -> tuple | None:
    """The Python walk's answer with the sequence-id headers watched: (greatest timestamp delta, the scan's indexes,
    names, ids, malformed), or None if it refuses the records."""
    walked = python_scanned(data, count, last_delta, from_client)
    if walked is None:
        return None
    max_ts_delta, scan = walked
    return max_ts_delta, scan.indexes, scan.names, scan.ids, scan.malformed


def python_scanned(data: bytes, count: int, last_delta: int,
                   from_client: bool) -> tuple[int, SequenceHeaderScan] | None:
    header = BatchHeader(0, len(data) - 12 + HEADER_SIZE, 0, 2, 0, 0, last_delta, 0, 0, -1, -1, -1, count)
    scan = SequenceHeaderScan()
    try:
        return _walk_records(data, 0, header, from_client, headers=scan), scan
    except RecordBatchError:
        return None


def check_same(data: bytes, count: int, last_delta: int, from_client: bool) -> object:
    """Whatever the C walks answer, the Python walk answers the same; returns walk_watched's answer."""
    for watched in (False, True):
        fast = fast_walk(data, 0, count, last_delta, from_client, SequenceHeaderScan.KEYS if watched else None)
        if fast is not None:
            assert python_walk(data, count, last_delta, from_client, watched) == (fast, False)
    collected = fast_walk_watched(data, 0, count, last_delta, from_client, SequenceHeaderScan.KEYS)
    if isinstance(collected, int):
        assert python_walk(data, count, last_delta, from_client, True) == (collected, False)
    elif collected is not None:
        max_ts_delta, indexes, (names, ids) = collected
        assert python_scan(data, count, last_delta, from_client) == (max_ts_delta, indexes, names, ids, False)
        scan = SequenceHeaderScan.collected(indexes, (names, ids))
        assert (scan.indexes, scan.names, scan.ids, scan.malformed, scan.found) == (indexes, names, ids, False, True)
    # With runs: a producer's run (one name, the next id in each record) as such, anything else as without.
    run = fast_walk_watched(data, 0, count, last_delta, from_client, SequenceHeaderScan.KEYS, True)
    if isinstance(run, tuple) and len(run) == 4:
        max_ts_delta, scan = python_scanned(data, count, last_delta, from_client)
        assert (max_ts_delta, consecutive_run(scan, count)) == (run[0], run[1:])
    else:
        assert run == collected
        if collected is not None:  # a sound batch the Python twin reads as no run either
            assert consecutive_run(python_scanned(data, count, last_delta, from_client)[1], count) is None
    return run


header_keys = st.sampled_from(["trace", "k", "", "kop.producer.nam", "app.sequence.id", "é", PRODUCER_NAME_HEADER,
                               SEQUENCE_ID_HEADER])
maybe_bytes = st.none() | st.binary(max_size=200)
a_record = st.tuples(maybe_bytes, maybe_bytes,
                     st.lists(st.tuples(header_keys, maybe_bytes), max_size=3),
                     st.integers(-2**40, 2**40) | st.integers(-100, 100))


def records_bytes(records: list, holes: bool = False) -> tuple[bytes, int]:
    """The records section of a batch built from (key, value, headers, timestamp delta) tuples; offsets 0..n-1, or
    every other one (holes); and the last offset delta."""
    built = build_batch([Record(2 * i if holes else i, 1_000_000 + ts, key, value, tuple(headers))
                         for i, (key, value, headers, ts) in enumerate(records)])
    return built[HEADER_SIZE:], (2 * len(records) - 2 if holes else len(records) - 1)


@needs_c
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(a_record, min_size=1, max_size=12), st.booleans())
def test_sound_batches_give_the_python_walks_answer(records, holes):
    data, last_delta = records_bytes(records, holes)
    count = len(records)
    expected_delta = max(ts for *_, ts in records) - records[0][3]
    assert python_walk(data, count, last_delta, not holes, False) == (expected_delta, False)
    assert fast_walk(data, 0, count, last_delta, not holes, None) == expected_delta
    watched = any(key in (PRODUCER_NAME_HEADER, SEQUENCE_ID_HEADER) for _, _, headers, _ in records for key, _ in headers)
    fast = fast_walk(data, 0, count, last_delta, not holes, SequenceHeaderScan.KEYS)
    assert fast == (None if watched else expected_delta)
    check_same(data, count, last_delta, not holes)
    if not holes:  # a client's batch has no holes: refused by both
        check_same(data, count, last_delta, True)


other_header = st.tuples(st.sampled_from(["trace", "k", "", "kop.producer.nam", "app.sequence.id"]), maybe_bytes)
a_sequenced_record = st.tuples(
    maybe_bytes, maybe_bytes,
    # the two headers (names the same, or not), mostly each once and not null; sometimes one twice, null or missing
    st.tuples(st.sampled_from([b"p", b"p", b"p", "prod\u00e9".encode(), b"\xff", b"", b"x" * 300]),
              st.integers(0, 2**63 - 1).map(lambda i: b"%d" % i) | st.sampled_from([b"-1", b"", b"1x", b"9" * 25]),
              st.sampled_from(["both"] * 8 + ["name twice", "id twice", "name null", "id null", "no name", "no id",
                                              "none"]),
              st.lists(other_header, max_size=2), st.booleans()),
    st.integers(-2**40, 2**40))


def sequenced(key, value, headers_spec, ts):
    """One record of `a_sequenced_record` as `a_record` has it: the sequence-id headers as the spec says."""
    name, sequence_id, how, others, ids_first = headers_spec
    ours = {"both": [(PRODUCER_NAME_HEADER, name), (SEQUENCE_ID_HEADER, sequence_id)],
            "name twice": [(PRODUCER_NAME_HEADER, name), (SEQUENCE_ID_HEADER, sequence_id), (PRODUCER_NAME_HEADER, name)],
            "id twice": [(SEQUENCE_ID_HEADER, sequence_id), (PRODUCER_NAME_HEADER, name), (SEQUENCE_ID_HEADER, b"1")],
            "name null": [(PRODUCER_NAME_HEADER, None), (SEQUENCE_ID_HEADER, sequence_id)],
            "id null": [(PRODUCER_NAME_HEADER, name), (SEQUENCE_ID_HEADER, None)],
            "no name": [(SEQUENCE_ID_HEADER, sequence_id)],
            "no id": [(PRODUCER_NAME_HEADER, name)],
            "none": []}[how]
    if ids_first:
        ours = ours[::-1]
    return key, value, [*others[:1], *ours, *others[1:]], ts


@needs_c
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(a_sequenced_record, min_size=1, max_size=12), st.booleans())
def test_the_c_walk_reads_the_sequence_headers_as_the_python_scan_does(records, holes):
    records = [sequenced(*r) for r in records]
    data, last_delta = records_bytes(records, holes)
    collected = check_same(data, len(records), last_delta, not holes)
    # each record with the headers holds each once, not null: the C walk reads them (the broker's usual batch)
    assert collected is not None or not all(
        sum(k == PRODUCER_NAME_HEADER for k, _ in headers) == sum(k == SEQUENCE_ID_HEADER for k, _ in headers) <= 1
        and all(v is not None for k, v in headers if k in (PRODUCER_NAME_HEADER, SEQUENCE_ID_HEADER))
        for _, _, headers, _ in records)


# A producer's run (one name, consecutive ids), as it is or with one record changed at `at`.
RUN_CHANGES = ["none", "ids first", "other header", "leading zero", "gap", "same id", "other name", "no headers",
               "id twice", "name null", "id null", "no id", "not digits", "19 digits"]
a_run = st.tuples(st.sampled_from([b"p", b"", b"\xff", "\u00e9".encode(), b"n" * 300]),
                  st.integers(0, 10**18) | st.integers(10**18 - 12, 10**18 - 1), st.integers(1, 12),
                  st.sampled_from(RUN_CHANGES), st.integers(0, 11))


def run_records(name: bytes, first: int, count: int, change: str, at: int) -> list:
    records = []
    for i in range(count):
        sequence_id, headers = b"%d" % (first + i), None
        if i == at:
            sequence_id = {"leading zero": b"0" + sequence_id, "gap": b"%d" % (first + i + 1),
                           "same id": b"%d" % (first + i - 1), "not digits": sequence_id + b"x",
                           "19 digits": b"1" * 19}.get(change, sequence_id)
            headers = {"ids first": [(SEQUENCE_ID_HEADER, sequence_id), (PRODUCER_NAME_HEADER, name)],
                       "other header": [(PRODUCER_NAME_HEADER, name), ("trace", b"t"), (SEQUENCE_ID_HEADER, sequence_id)],
                       "other name": [(PRODUCER_NAME_HEADER, name + b"2"), (SEQUENCE_ID_HEADER, sequence_id)],
                       "no headers": [],
                       "id twice": [(PRODUCER_NAME_HEADER, name), (SEQUENCE_ID_HEADER, sequence_id),
                                    (SEQUENCE_ID_HEADER, sequence_id)],
                       "name null": [(PRODUCER_NAME_HEADER, None), (SEQUENCE_ID_HEADER, sequence_id)],
                       "id null": [(PRODUCER_NAME_HEADER, name), (SEQUENCE_ID_HEADER, None)],
                       "no id": [(PRODUCER_NAME_HEADER, name)]}.get(change)
        if headers is None:
            headers = [(PRODUCER_NAME_HEADER, name), (SEQUENCE_ID_HEADER, sequence_id)]
        records.append((None, b"v", headers, i))
    return records


@needs_c
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(a_run)
def test_a_producers_run_is_read_as_one_and_anything_else_as_before(run):
    name, first, count, change, at = run
    data, last_delta = records_bytes(run_records(name, first, count, change, at))
    walked = check_same(data, count, last_delta, True)
    if first + count - 1 < 10**18 and (change in ("none", "ids first", "other header") or at >= count):
        assert isinstance(walked, tuple) and walked[1:] == (name, first, first + count - 1)  # the control: a run
    # validation and the batch check give the same records, or the same error, with the C walk and without
    raw = build_batch([Record(i, 1_000 + ts, key, value, tuple(headers))
                       for i, (key, value, headers, ts) in enumerate(run_records(name, first, count, change, at))])
    answers = []
    for fast in (records_module._fast_walk, None):
        with mock.patch.object(records_module, "_fast_walk", fast):
            try:
                scan = validate_batch(*split_batches(raw)[0], watch=SequenceHeaderScan).headers
                got = None if scan is None else sequenced_records(scan)  # None: no record holds either header
                answers.append(got and (list(got.indexes), got.names, list(got.ids), got.name, got.rising))
            except RecordBatchError as exc:
                answers.append(str(exc))
    assert answers[0] == answers[1]


@needs_c
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(a_record | a_sequenced_record.map(lambda r: sequenced(*r)), min_size=1, max_size=6), st.booleans(),
       st.data())
def test_damaged_batches_are_never_sound_where_the_python_walk_refuses(records, holes, data):
    raw, last_delta = records_bytes(records, holes)
    damaged = bytearray(raw)
    for _ in range(data.draw(st.integers(1, 3))):
        how = data.draw(st.sampled_from(["flip", "set", "cut", "insert", "delete"]))
        at = data.draw(st.integers(0, max(0, len(damaged) - 1)))
        if how == "flip" and damaged:
            damaged[at] ^= 1 << data.draw(st.integers(0, 7))
        elif how == "set" and damaged:
            damaged[at] = data.draw(st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0xFF, 0x02, 0x0C]))
        elif how == "cut":
            del damaged[at:]
        elif how == "insert":
            damaged[at:at] = bytes([data.draw(st.integers(0, 255))])
        elif how == "delete" and damaged:
            del damaged[at]
    count = len(records) + data.draw(st.sampled_from([0, 0, 0, -1, 1]))
    assume(count > 0)
    last_delta = last_delta + data.draw(st.sampled_from([0, 0, -1, 1]))
    check_same(bytes(damaged), count, last_delta, not holes)
    check_same(bytes(damaged), count, last_delta, holes)


@needs_c
@settings(max_examples=EXAMPLES, deadline=None)
@given(st.binary(max_size=64), st.integers(1, 5), st.integers(-1, 6), st.booleans())
def test_random_bytes_are_never_sound_where_the_python_walk_refuses(data, count, last_delta, from_client):
    check_same(data, count, last_delta, from_client)


def varint(value: int) -> bytes:
    out = bytearray()
    encode_varint(value, out)
    return bytes(out)


@needs_c
@pytest.mark.parametrize("ts_bytes", [
    bytes([0xFF] * 9 + [0x01]),  # the largest 10-byte varlong within 64 bits
    bytes([0xFF] * 9 + [0x03]),  # beyond 64 bits: Python's ints hold it, the C walk leaves it to them
    bytes([0xFF] * 10 + [0x01]),  # 11 bytes: too long for a varlong
    bytes([0x80] * 4 + [0x7F]),  # a 5-byte varlong
])
def test_long_and_overlong_timestamp_deltas(ts_bytes):
    body = b"\x00" + ts_bytes + varint(0) + varint(-1) + varint(1) + b"v" + varint(0)
    data = varint(len(body)) + body
    check_same(data, 1, 0, True)
    if len(ts_bytes) <= 10 and ts_bytes[-1] <= 1:  # within 64 bits: the C walk answers it
        assert fast_walk(data, 0, 1, 0, True, None) is not None


@needs_c
def test_a_buffer_view_is_walked_in_place_and_a_start_outside_it_is_not_sound():
    raw = build_batch([Record(i, 1_000 + i, b"k", b"v" * 300) for i in range(50)])
    [(header, view)] = split_batches(raw)
    assert fast_walk(view, HEADER_SIZE, 50, 49, True, None) == 49
    assert fast_walk(memoryview(bytearray(raw)), HEADER_SIZE, 50, 49, True, None) == 49
    assert fast_walk(view, len(raw) + 1, 50, 49, True, None) is None
    assert fast_walk(view, -1, 50, 49, True, None) is None
    with pytest.raises(TypeError):
        fast_walk(view, HEADER_SIZE, 50, 49, True, ("not bytes",))
    assert fast_walk_watched(view, HEADER_SIZE, 50, 49, True, (b"x",)) == 49
    assert fast_walk_watched(view, len(raw) + 1, 50, 49, True, (b"x",)) is None
    for keys in (None, (), ("not bytes",), (b"k",) * 9):
        with pytest.raises(TypeError):
            fast_walk_watched(view, HEADER_SIZE, 50, 49, True, keys)
    assert fast_walk_watched(view, HEADER_SIZE, 50, 49, True, (b"x", b"y"), True) == 49
    with pytest.raises(TypeError):  # a run is read for two keys: the name's and the id's
        fast_walk_watched(view, HEADER_SIZE, 50, 49, True, (b"x",), True)


@needs_c
def test_validation_takes_the_c_path_for_sound_batches_and_still_reports_python_errors(monkeypatch):
    raw = bytearray(build_batch([Record(i, 1_000, None, b"v" * 100) for i in range(100)], producer_id=1,
                                producer_epoch=0, base_sequence=0))
    walked_in_python = []
    real = records_module._walk_records
    monkeypatch.setattr(records_module, "_walk_records", lambda *a, **k: walked_in_python.append(1) or real(*a, **k))
    [(header, view)] = split_batches(raw)
    walked = validate_batch(header, view, watch=SequenceHeaderScan)
    assert walked.headers is None and not walked_in_python
    # a producer's batch with the sequence-id headers: read in C too, as the Python walk reads it
    sequenced_raw = build_batch([Record(i, 1_000, None, b"v" * 100, ((PRODUCER_NAME_HEADER, b"p"),
                                                                      (SEQUENCE_ID_HEADER, b"%d" % i)))
                                 for i in range(100)], producer_id=1, producer_epoch=0, base_sequence=0)
    [(header, view)] = split_batches(sequenced_raw)
    walked = validate_batch(header, view, watch=SequenceHeaderScan)
    assert not walked_in_python
    assert (walked.headers.run_read, list(walked.headers.indexes)) == ((b"p", 0, 99), list(range(100)))
    monkeypatch.setattr(records_module, "_fast_walk", None)
    in_python = validate_batch(header, view, watch=SequenceHeaderScan)
    assert walked_in_python and (in_python.headers.indexes, in_python.headers.names, in_python.headers.ids) == (
        list(range(100)), [b"p"] * 100, [b"%d" % i for i in range(100)])
    assert consecutive_run(in_python.headers, 100) == walked.headers.run_read
    monkeypatch.undo()
    monkeypatch.setattr(records_module, "_walk_records", lambda *a, **k: walked_in_python.append(1) or real(*a, **k))
    walked_in_python.clear()
    # a record that claims a longer value: the CRC is made right, so only the walk can tell; Python's message
    raw[HEADER_SIZE + 5] += 2
    struct.pack_into(">I", raw, 17, records_module.crc32c.crc32c(bytes(raw[21:])))
    [(header, view)] = split_batches(raw)
    with pytest.raises(RecordBatchError, match="record 0"):
        validate_batch(header, view)
    assert walked_in_python


@needs_c
def test_an_uninitialized_buffer_is_a_bytearray_of_that_size():
    from protocol._accel import uninitialized
    buffer = uninitialized(100_000)
    assert type(buffer) is bytearray and len(buffer) == 100_000
    buffer[:] = b"x" * 100_000
    assert bytes(buffer) == b"x" * 100_000 and uninitialized(0) == bytearray()
    with pytest.raises(ValueError):
        uninitialized(-1)


an_id = (st.integers(0, 2**63 - 1).map(lambda i: b"%d" % i)
         | st.sampled_from([b"", b"0", b"007", b"-1", b"+1", b" 1", b"1_0", b"1x", b"\xd9\xa1", b"9" * 18, b"9" * 19,
                            b"1" * 25]))


@needs_c
@settings(max_examples=EXAMPLES, deadline=None)
@given(st.lists(an_id, max_size=12) | st.lists(st.integers(0, 10**18 - 1), max_size=12).map(
    lambda ids: [b"%d" % i for i in sorted(set(ids))]))
def test_the_c_reading_of_sequence_ids_is_the_pythons(raw_ids):
    from protocol._accel import decimal_ids
    from protocol.sequence_headers import _decimal_ids
    assert decimal_ids(raw_ids) == _decimal_ids(raw_ids)
    read = decimal_ids(raw_ids)
    if read is not None:  # the control: what it read is what int() reads, and rising is what sorting says
        assert read == ([int(r) for r in raw_ids], [int(r) for r in raw_ids] == sorted(set(map(int, raw_ids))))
    with pytest.raises(TypeError):
        decimal_ids(tuple(raw_ids))
    with pytest.raises(TypeError):
        decimal_ids(["12", *raw_ids])
