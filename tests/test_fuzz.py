"""Hostile bytes against every parser kop runs on a client's input: the request decoder, the record-batch validator,
the compression codecs, the SASL PLAIN/SCRAM and OAUTHBEARER messages and the admin API's credentials. Each oracle
of fuzz/oracles.py says what the parser may answer (a value or its own error, never another exception, never a
batch that passed and cannot be read). `make test` runs a bounded hypothesis pass; `make fuzz` runs the same
properties with KOP_FUZZ_EXAMPLES (default there: 20,000) examples each; `make fuzz-atheris` runs the oracles under
atheris, coverage-guided, for minutes (fuzz/__main__.py)."""
import os
import struct

import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuzz import oracles, seeds
from fuzz.targets import CODECS, SCRAM_MECHANISMS, split_two
from protocol.api import REQUEST_CLASSES
from protocol.compression import CODEC_NAMES, compress
from protocol.records import CRC_START, Record, build_batch

EXAMPLES = int(os.environ.get("KOP_FUZZ_EXAMPLES", "300"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
SERVED = oracles.SERVED


@FUZZ
@given(st.binary(max_size=512))
def test_arbitrary_frames_decode_or_raise_protocol_errors(frame):
    oracles.request_frame(frame)


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
    oracles.request_frame(frame)


records = st.lists(st.builds(Record, offset=st.just(0), timestamp=st.integers(0, 2**40),
                             key=st.none() | st.binary(max_size=20), value=st.none() | st.binary(max_size=60),
                             headers=st.lists(st.tuples(st.text(max_size=5), st.none() | st.binary(max_size=5)),
                                              max_size=2).map(tuple)), min_size=1, max_size=5)


def damaged(draw, data: bytes, fix_crc: bool) -> bytes:
    """`data` with some bytes changed, maybe cut or extended, and (for a batch) maybe its CRC fixed up after."""
    data = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    if draw(st.booleans()):
        data = data[:draw(st.integers(0, len(data)))] + draw(st.binary(max_size=16))
    if fix_crc and draw(st.booleans()) and len(data) > CRC_START:
        struct.pack_into(">I", data, 17, crc32c.crc32c(bytes(data[CRC_START:])))
    return bytes(data)


@st.composite
def mutated_batches(draw):
    """A real batch (or one of the seeds: sequence-id headers, idempotent, transactional, a false maxTimestamp)
    with some bytes changed; half the time the CRC is fixed up after the change, so the validator's deeper checks
    (counts, codecs, record framing) see the damage rather than the CRC alone."""
    if draw(st.booleans()):
        recs = [Record(i, r.timestamp + i, r.key, r.value, r.headers) for i, r in enumerate(draw(records))]
        batch = build_batch(recs, compression=draw(st.sampled_from(sorted(CODEC_NAMES))))
    else:
        batch = draw(st.sampled_from(seeds.batches()))
    return damaged(draw, batch, fix_crc=True)


@FUZZ
@given(mutated_batches())
def test_damaged_batches_are_refused_with_a_record_batch_error_or_read_whole(data):
    oracles.produce_records(data)


@FUZZ
@given(st.sampled_from(CODECS), st.binary(max_size=512))
def test_codecs_refuse_garbage_with_a_record_batch_error(codec, data):
    oracles.codec_stream(codec, data)


@FUZZ
@given(st.sampled_from(CODECS), st.binary(min_size=1, max_size=2048),
       st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4))
def test_codecs_refuse_damaged_streams_and_never_exceed_the_limit(codec, plain, flips):
    stream = bytearray(compress(codec, plain * 64))  # repetitive: compresses well, so a bomb is near
    for position, value in flips:
        stream[position % len(stream)] = value
    oracles.codec_stream(codec, bytes(stream))


@FUZZ
@given(st.data())
def test_sasl_plain_tokens_authenticate_or_fail_authentication(data):
    real = f"\0{oracles.USER}\0{oracles.PASSWORD}".encode()
    oracles.sasl_plain(data.draw(st.binary(max_size=64)) if data.draw(st.booleans())
                       else damaged(data.draw, real, fix_crc=False))


@FUZZ
@given(st.sampled_from(SCRAM_MECHANISMS), st.data())
def test_scram_client_messages_authenticate_or_fail_authentication(mechanism, data):
    first, final = seeds.scram_messages(mechanism)
    if data.draw(st.booleans()):
        first = damaged(data.draw, first, fix_crc=False)
    else:
        final = damaged(data.draw, final, fix_crc=False)
    oracles.scram(mechanism, first, final)


@FUZZ
@given(st.sampled_from(seeds.oauthbearer()), st.data(), st.booleans())
def test_oauthbearer_messages_authenticate_or_fail_authentication(seed, data, scoped):
    message, acknowledgement = split_two(seed[1:])
    oracles.oauthbearer(damaged(data.draw, message, fix_crc=False), acknowledgement, "kafka" if scoped else "")


@FUZZ
@given(st.sampled_from(["GET", "POST"]), st.sampled_from(["Basic ", "Bearer ", "basic ", ""]),
       st.text(alphabet=st.characters(max_codepoint=255), max_size=40))
def test_admin_credentials_are_accepted_or_answered_401_or_403(method, scheme, credentials):
    oracles.admin_authorization(method, scheme + credentials)
