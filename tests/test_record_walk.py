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

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from protocol import records as records_module
from protocol.compression import RecordBatchError
from protocol.records import HEADER_SIZE, BatchHeader, Record, _walk_records, build_batch, split_batches, validate_batch
from protocol.sequence_headers import PRODUCER_NAME_HEADER, SEQUENCE_ID_HEADER, SequenceHeaderScan
from protocol.varint import encode_varint

# Examples per property: a few hundred in make test; `make fuzz` runs them with FUZZ_EXAMPLES (KOP_FUZZ_EXAMPLES).
EXAMPLES = int(os.environ.get("KOP_FUZZ_EXAMPLES", "300"))
fast_walk = records_module._fast_walk
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


def check_same(data: bytes, count: int, last_delta: int, from_client: bool) -> None:
    for watched in (False, True):
        fast = fast_walk(data, 0, count, last_delta, from_client, SequenceHeaderScan.KEYS if watched else None)
        if fast is not None:
            assert python_walk(data, count, last_delta, from_client, watched) == (fast, False)


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


@needs_c
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(a_record, min_size=1, max_size=6), st.booleans(), st.data())
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
