"""Hostile bytes against the request decoder, the record-batch validator and the compression codecs: whatever
arrives, each answers with its own error (ProtocolError, UnsupportedVersion, RecordBatchError) or a value, never
another exception (which would close a connection as an internal error, or worse). `make test` runs a bounded pass;
`make fuzz` runs the same properties with KOP_FUZZ_EXAMPLES (default there: 20,000) examples each."""
import os
import struct

import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kop.handlers import build_api_router
from protocol.api import REQUEST_CLASSES, ProtocolError, UnsupportedVersion, decode_body, parse_header
from protocol.compression import CODEC_NAMES, RecordBatchError, compress, decompress
from protocol.records import CRC_START, Record, build_batch, iter_records, split_batches, validate_batch

EXAMPLES = int(os.environ.get("KOP_FUZZ_EXAMPLES", "300"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
SERVED = build_api_router().versions
SMALL_LIMIT = 1 << 16  # what a decompression may produce here: bombs must stop at it


def decode(frame: bytes) -> None:
    try:
        header, offset = parse_header(frame, SERVED)
        decode_body(header, frame, offset)
    except (ProtocolError, UnsupportedVersion):
        pass


@FUZZ
@given(st.binary(max_size=512))
def test_arbitrary_frames_decode_or_raise_protocol_errors(frame):
    decode(frame)


@st.composite
def served_request_frames(draw):
    """A well-formed header of an API and version kop serves, then a body of random or mutated bytes."""
    api_key = draw(st.sampled_from(sorted(SERVED)))
    low, high = SERVED[api_key]
    version = draw(st.integers(low, high))
    header = struct.pack(">hhih", api_key, version, 7, 4) + b"fuzz"
    if REQUEST_CLASSES[api_key].flexible_version_q(version):
        header += b"\x00"  # no tagged fields
    return header + draw(st.binary(max_size=256))


@FUZZ
@given(served_request_frames())
def test_served_apis_with_random_bodies_decode_or_raise_protocol_errors(frame):
    decode(frame)


records = st.lists(st.builds(Record, offset=st.just(0), timestamp=st.integers(0, 2**40),
                             key=st.none() | st.binary(max_size=20), value=st.none() | st.binary(max_size=60),
                             headers=st.lists(st.tuples(st.text(max_size=5), st.none() | st.binary(max_size=5)),
                                              max_size=2).map(tuple)), min_size=1, max_size=5)


@st.composite
def mutated_batches(draw):
    """A real batch with some bytes changed, cut or added; half the time the CRC is fixed up after the change, so the
    validator's deeper checks (counts, codecs, record framing) see the damage rather than the CRC alone."""
    recs = [Record(i, r.timestamp + i, r.key, r.value, r.headers) for i, r in enumerate(draw(records))]
    batch = bytearray(build_batch(recs, compression=draw(st.sampled_from(sorted(CODEC_NAMES)))))
    for _ in range(draw(st.integers(1, 4))):
        position = draw(st.integers(0, len(batch) - 1))
        batch[position] = draw(st.integers(0, 255))
    if draw(st.booleans()):
        batch = batch[:draw(st.integers(0, len(batch)))] + draw(st.binary(max_size=16))
    if draw(st.booleans()) and len(batch) > CRC_START:
        struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[CRC_START:])))
    return bytes(batch)


@FUZZ
@given(mutated_batches())
def test_damaged_batches_are_refused_with_a_record_batch_error(data):
    try:
        for header, view in split_batches(data):
            validate_batch(header, view, max_decompressed_size=SMALL_LIMIT)
            list(iter_records(view, max_decompressed_size=SMALL_LIMIT))  # a batch passed: its records decode
    except RecordBatchError:
        pass


@FUZZ
@given(st.sampled_from(sorted(set(CODEC_NAMES) - {0})), st.binary(max_size=512))
def test_codecs_refuse_garbage_with_a_record_batch_error(codec, data):
    try:
        assert len(decompress(codec, data, SMALL_LIMIT)) <= SMALL_LIMIT
    except RecordBatchError:
        pass


@FUZZ
@given(st.sampled_from(sorted(set(CODEC_NAMES) - {0})), st.binary(min_size=1, max_size=2048),
       st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4))
def test_codecs_refuse_damaged_streams_and_never_exceed_the_limit(codec, plain, flips):
    damaged = bytearray(compress(codec, plain * 64))  # repetitive: compresses well, so a bomb is near
    for position, value in flips:
        damaged[position % len(damaged)] = value
    try:
        assert len(decompress(codec, bytes(damaged), SMALL_LIMIT)) <= SMALL_LIMIT
    except RecordBatchError:
        pass
