"""protocol.records against batches real clients encoded (tests/data: kafka-python and aiokafka by make_golden.py,
librdkafka and the Java client by capture_via_kop.py), damaged batches, and the clients' own readers."""
import json
import pathlib
import struct

import aiokafka.record.default_records as aiokafka_records
import cramjam
import crc32c
import kafka.record.default_records as kafka_python_records
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.legacy_records import LegacyRecordBatchBuilder

from protocol.compression import (
    SNAPPY,
    XERIAL_MAGIC,
)
from protocol.errors import ErrorCode
from protocol.records import (
    HEADER_SIZE,
    BatchHeader,
    FalseMaxTimestamp,
    Record,
    RecordBatchError,
    assign_offsets,
    build_batch,
    build_control_batch,
    control_marker,
    iter_records,
    set_max_timestamp,
    split_batches,
    validate_batch,
)

DATA = pathlib.Path(__file__).parent / "data"
GOLDEN = json.loads((DATA / "golden.json").read_text())
CLIENTS = ["kafka_python", "aiokafka"]
CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
GOLDEN_FILES = [(client, codec) for client in CLIENTS for codec in CODECS]


def golden_records(base_offset: int = 0) -> list[Record]:
    def unhex(value):
        return None if value is None else bytes.fromhex(value)

    return [
        Record(base_offset + r["offset_delta"], r["timestamp"], unhex(r["key"]), unhex(r["value"]),
               tuple((name, unhex(value)) for name, value in r["headers"]))
        for r in GOLDEN["records"]
    ]


LIBRDKAFKA_FILES = [("librdkafka", codec) for codec in GOLDEN["librdkafka"]["codecs"]]
JAVA_FILES = [("java", codec) for codec in CODECS]
ALL_GOLDEN_FILES = GOLDEN_FILES + LIBRDKAFKA_FILES + JAVA_FILES


def golden_bytes(client: str, codec: str) -> bytes:
    return (DATA / f"{client}_{codec}.bin").read_bytes()


def only_batch(data: bytes | bytearray) -> tuple[BatchHeader, memoryview]:
    batches = split_batches(data)
    assert len(batches) == 1
    return batches[0]


def refuse(data: bytes | bytearray, *, deep: bool = True, **kwargs) -> RecordBatchError:
    """Split and validate `data`, which must fail; return the error."""
    with pytest.raises(RecordBatchError) as caught:
        for header, view in split_batches(data):
            validate_batch(header, view, deep=deep, **kwargs)
    return caught.value


def with_fixed_crc(batch: bytearray) -> bytearray:
    """Recompute the CRC, as a client with a buggy encoder would have written it."""
    struct.pack_into(">I", batch, 17, crc32c.crc32c(memoryview(batch)[21:]))
    return batch


def patch_header(batch: bytes, fmt: str, offset: int, value: int) -> bytearray:
    patched = bytearray(batch)
    struct.pack_into(fmt, patched, offset, value)
    return with_fixed_crc(patched)


# --- golden bytes from real clients -------------------------------------------------------------------------------

@pytest.mark.parametrize("client,codec", GOLDEN_FILES)
def test_client_batches_split_validate_and_decode(client: str, codec: str) -> None:
    header, view = only_batch(golden_bytes(client, codec))
    validate_batch(header, view, deep=False)
    validate_batch(header, view, deep=True)
    producer = GOLDEN["producers"][client]
    expected = golden_records()
    assert header.compression == CODECS[codec]
    assert header.magic == 2 and header.base_offset == 0
    assert header.records_count == len(expected) and header.last_offset_delta == len(expected) - 1
    assert header.base_timestamp == expected[0].timestamp
    assert header.max_timestamp == max(r.timestamp for r in expected)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (
        producer["producer_id"], producer["producer_epoch"], producer["base_sequence"])
    assert header.is_transactional == producer["transactional"]
    assert not header.is_control and header.timestamp_type == 0
    assert list(iter_records(view)) == expected


@pytest.mark.parametrize("client,codec", LIBRDKAFKA_FILES)
def test_librdkafka_batches(client: str, codec: str) -> None:
    header, view = only_batch(golden_bytes(client, codec))
    validate_batch(header, view)
    assert header.compression == CODECS[codec]
    assert header.has_producer_id and header.base_sequence == 0 and header.producer_epoch == 0
    if codec == "snappy":
        assert not bytes(view[HEADER_SIZE:]).startswith(XERIAL_MAGIC)  # librdkafka writes raw snappy
    assert header.max_timestamp == max(r.timestamp for r in golden_records())
    assert list(iter_records(view)) == golden_records()


@pytest.mark.parametrize("client,codec", JAVA_FILES)
def test_java_client_batches(client: str, codec: str) -> None:
    header, view = only_batch(golden_bytes(client, codec))
    validate_batch(header, view)
    assert header.compression == CODECS[codec]
    assert header.has_producer_id and header.base_sequence == 0 and not header.is_transactional
    if codec == "snappy":
        assert bytes(view[HEADER_SIZE:]).startswith(XERIAL_MAGIC)  # the Java client writes xerial framing
    records = list(iter_records(view))
    expected = GOLDEN["java"]["records"]
    assert [(r.key.hex(), r.value.hex(), [[k, v.hex()] for k, v in r.headers]) for r in records] == [
        (e["key"], e["value"], e["headers"]) for e in expected]
    assert [r.offset for r in records] == list(range(len(expected)))
    assert records[0].timestamp == header.base_timestamp
    assert max(r.timestamp for r in records) == header.max_timestamp


def test_idempotent_batch_last_sequence_wraps_past_int32_max() -> None:
    header, _ = only_batch(golden_bytes("aiokafka", "none"))
    assert header.base_sequence == 2**31 - 3 and header.last_offset_delta == 4
    assert header.last_sequence == 1  # 2**31-3, 2**31-2, 2**31-1, 0, 1


def test_plain_batch_has_no_sequence() -> None:
    header, _ = only_batch(golden_bytes("kafka_python", "none"))
    assert not header.has_producer_id
    assert header.last_sequence == -1


@pytest.mark.parametrize("base,delta,last", [(0, 0, 0), (5, 4, 9), (2**31 - 1, 1, 0), (2**31 - 1, 0, 2**31 - 1),
                                             (2**31 - 10, 20, 10)])
def test_last_sequence_matches_kafka_increment_sequence(base: int, delta: int, last: int) -> None:
    header = BatchHeader(0, 49, -1, 2, 0, 0, delta, 0, 0, 1, 0, base, delta + 1)
    assert header.last_sequence == last


def test_several_batches_split_in_order_as_views_into_the_request() -> None:
    blob = bytearray(b"".join(golden_bytes(client, codec) for client, codec in ALL_GOLDEN_FILES))
    batches = split_batches(blob)
    assert [h.compression for h, _ in batches] == [CODECS[codec] for _, codec in ALL_GOLDEN_FILES]
    position = 0
    for (client, codec), (header, view) in zip(ALL_GOLDEN_FILES, batches):
        assert view.obj is blob  # zero-copy
        assert bytes(view) == golden_bytes(client, codec)
        assert header.size == len(view)
        validate_batch(header, view)
        position += header.size
    assert position == len(blob)


def test_empty_records_give_no_batches() -> None:
    assert split_batches(b"") == []


def test_assign_offsets_keeps_the_batch_valid() -> None:
    blob = bytearray(golden_bytes("aiokafka", "lz4") + golden_bytes("kafka_python", "zstd"))
    next_offset, position = 1000, 0
    for header, _ in split_batches(blob):
        assign_offsets(blob, position, next_offset)
        next_offset += header.records_count
        position += header.size
    (first, first_view), (second, second_view) = split_batches(blob)
    assert (first.base_offset, second.base_offset) == (1000, 1005)
    validate_batch(first, first_view)
    validate_batch(second, second_view)
    assert list(iter_records(second_view)) == golden_records(base_offset=1005)


def test_java_style_xerial_snappy_batch() -> None:
    # Build the records uncompressed, then frame them by hand the way Java's xerial SnappyOutputStream does:
    # magic, version 1, compatible 1, then [int32 length][raw snappy block] per 32 KiB of input.
    records = [Record(i, 1_700_000_000_000 + i, b"k%d" % i, b"value %05d " % i * 20, ()) for i in range(400)]
    plain = build_batch(records)
    body = plain[HEADER_SIZE:]
    framed = bytearray(XERIAL_MAGIC + struct.pack(">ii", 1, 1))
    for start in range(0, len(body), 32 * 1024):
        block = bytes(cramjam.snappy.compress_raw(body[start:start + 32 * 1024]))
        framed += struct.pack(">i", len(block)) + block
    assert len(body) > 2 * 32 * 1024  # several blocks
    batch = bytearray(plain[:HEADER_SIZE]) + framed
    struct.pack_into(">i", batch, 8, len(batch) - 12)
    struct.pack_into(">h", batch, 21, SNAPPY)
    header, view = only_batch(with_fixed_crc(batch))
    validate_batch(header, view)
    assert list(iter_records(view)) == records


def test_librdkafka_style_raw_snappy_batch() -> None:
    records = [Record(i, 1_700_000_000_000, None, b"raw snappy " * 10, ()) for i in range(50)]
    plain = build_batch(records)
    batch = bytearray(plain[:HEADER_SIZE]) + bytes(cramjam.snappy.compress_raw(plain[HEADER_SIZE:]))
    struct.pack_into(">i", batch, 8, len(batch) - 12)
    struct.pack_into(">h", batch, 21, SNAPPY)
    header, view = only_batch(with_fixed_crc(batch))
    validate_batch(header, view)
    assert list(iter_records(view)) == records


# --- build_batch against kafka-python and aiokafka readers --------------------------------------------------------

def test_uncompressed_build_is_byte_identical_to_kafka_python() -> None:
    ours = build_batch(golden_records(), partition_leader_epoch=0)  # kafka-python leaves the epoch at 0
    assert ours == golden_bytes("kafka_python", "none")


@pytest.mark.parametrize("codec", [0, 1, 3, 4])
def test_kafka_python_reads_what_we_build(codec: int) -> None:
    records = golden_records(base_offset=77)
    ours = build_batch(records, base_offset=77, producer_id=12, producer_epoch=1, base_sequence=40,
                       compression=codec)
    batch = kafka_python_records.DefaultRecordBatch(ours)
    assert batch.validate_crc()
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (12, 1, 40)
    assert batch.compression_type == codec and batch.base_offset == 77
    decoded = [(r.offset, r.timestamp, r.key, r.value, [tuple(h) for h in r.headers]) for r in batch]
    assert decoded == [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in records]


@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4])
def test_aiokafka_reads_what_we_build(codec: int) -> None:
    records = golden_records()
    ours = build_batch(records, compression=codec, transactional=True, producer_id=5, producer_epoch=0,
                       base_sequence=0)
    batch = aiokafka_records.DefaultRecordBatch(ours)
    assert batch.validate_crc()
    assert batch.is_transactional and batch.compression_type == codec
    decoded = [(r.offset, r.timestamp, r.key, r.value, [tuple(h) for h in r.headers]) for r in batch]
    assert decoded == [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in records]


@pytest.mark.parametrize("commit", [True, False])
def test_control_batch_is_a_transaction_marker_kafka_python_understands(commit: bool) -> None:
    ours = build_control_batch(base_offset=500, producer_id=9, producer_epoch=3, commit=commit,
                               coordinator_epoch=17, timestamp_ms=1_700_000_000_000)
    header, view = only_batch(ours)
    validate_batch(header, view)
    assert header.is_control and header.is_transactional and header.records_count == 1
    assert header.base_sequence == -1 and header.last_offset == 500
    [record] = iter_records(view)
    assert control_marker(record).commit is commit
    assert control_marker(record).coordinator_epoch == 17
    theirs = kafka_python_records.DefaultRecordBatch(ours)
    assert theirs.validate_crc() and theirs.is_control_batch
    [marker] = list(theirs)
    assert marker.commit is commit and marker.abort is not commit and marker.offset == 500


def test_log_append_time_records_take_the_batch_max_timestamp() -> None:
    records = [Record(0, 10, None, b"a"), Record(1, 20, None, b"b")]
    header, view = only_batch(build_batch(records, timestamp_type=1, max_timestamp=99))
    validate_batch(header, view)
    assert header.timestamp_type == 1
    assert [r.timestamp for r in iter_records(view)] == [99, 99]


def test_batch_with_offset_holes_is_for_the_broker_only() -> None:
    records = [Record(100, 1, None, b"a"), Record(102, 2, None, b"b"), Record(105, 3, None, b"c")]
    batch = build_batch(records, base_offset=100, last_offset_delta=6)
    header, view = only_batch(batch)
    assert (header.records_count, header.last_offset_delta) == (3, 6)
    validate_batch(header, view, from_client=False)
    assert [r.offset for r in iter_records(view)] == [100, 102, 105]
    assert refuse(batch).error_code == ErrorCode.INVALID_RECORD


def test_build_batch_refuses_offsets_that_do_not_increase() -> None:
    with pytest.raises(ValueError):
        build_batch([Record(1, 0, None, b"a"), Record(1, 0, None, b"b")])
    with pytest.raises(ValueError):
        build_batch([])


# --- damaged batches ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("client,codec", [("kafka_python", "none"), ("aiokafka", "zstd"), ("java", "snappy"),
                                          ("librdkafka", "gzip")])
def test_every_flipped_byte_is_refused_except_in_fields_the_crc_leaves_out(client: str, codec: str) -> None:
    original = golden_bytes(client, codec)
    ignorable = set(range(0, 8)) | set(range(12, 16))  # baseOffset, partitionLeaderEpoch: the broker's to set
    for position in range(len(original)):
        damaged = bytearray(original)
        damaged[position] ^= 0x40
        if position in ignorable:
            header, view = only_batch(damaged)
            validate_batch(header, view)
            continue
        error = refuse(damaged)
        if position == 16:  # magic 2 ^ 0x40 = 66
            assert error.error_code == ErrorCode.CORRUPT_MESSAGE and "magic" in str(error)
        else:
            assert error.error_code == ErrorCode.CORRUPT_MESSAGE, (position, str(error))


def test_crc_mismatch_names_both_values() -> None:
    damaged = bytearray(golden_bytes("aiokafka", "none"))
    damaged[-1] ^= 1
    assert "CRC mismatch" in str(refuse(damaged, deep=False))


def test_every_truncation_is_corrupt() -> None:
    original = golden_bytes("aiokafka", "gzip")
    for length in range(1, len(original)):
        assert refuse(original[:length]).error_code == ErrorCode.CORRUPT_MESSAGE


def test_trailing_partial_batch_is_corrupt() -> None:
    two = golden_bytes("aiokafka", "lz4") + golden_bytes("aiokafka", "none")[:30]
    assert refuse(two).error_code == ErrorCode.CORRUPT_MESSAGE


@pytest.mark.parametrize("length", [-1, -2**31, 0, 48, 2**31 - 1, 100_000])
def test_bad_batch_lengths_are_corrupt(length: int) -> None:
    damaged = bytearray(golden_bytes("kafka_python", "none"))
    struct.pack_into(">i", damaged, 8, length)
    error = refuse(damaged)
    assert error.error_code == ErrorCode.CORRUPT_MESSAGE and str(length) in str(error)


@pytest.mark.parametrize("magic", [0, 1])
def test_legacy_message_sets_are_refused_with_a_clear_reason(magic: int) -> None:
    builder = LegacyRecordBatchBuilder(magic=magic, compression_type=0, batch_size=1 << 16)
    builder.append(0, timestamp=1_700_000_000_000 if magic else None, key=b"k", value=b"v")
    builder.append(1, timestamp=1_700_000_000_000 if magic else None, key=None, value=b"w")
    error = refuse(bytes(builder.build()))
    assert error.error_code == ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT
    assert "magic v0/v1 not supported" in str(error)


@pytest.mark.parametrize("codec", [5, 6, 7])
def test_unknown_codec_in_attributes(codec: int) -> None:
    damaged = patch_header(golden_bytes("aiokafka", "none"), ">h", 21, codec)
    assert refuse(damaged, deep=False).error_code == ErrorCode.UNSUPPORTED_COMPRESSION_TYPE


@pytest.mark.parametrize("count,last_delta", [(6, 5), (4, 3), (1, 0), (1_000_000_000, 999_999_999)])
def test_record_count_that_lies_is_invalid(count: int, last_delta: int) -> None:
    original = golden_bytes("kafka_python", "none")
    damaged = bytearray(original)
    struct.pack_into(">i", damaged, 57, count)
    struct.pack_into(">i", damaged, 23, last_delta)
    error = refuse(with_fixed_crc(damaged))
    assert error.error_code == ErrorCode.INVALID_RECORD, str(error)


@pytest.mark.parametrize("codec", ["none", "lz4"])
def test_record_count_that_lies_in_a_compressed_batch_is_invalid(codec: str) -> None:
    damaged = patch_header(golden_bytes("aiokafka", codec), ">i", 57, 6)
    struct.pack_into(">i", damaged, 23, 5)
    assert refuse(with_fixed_crc(damaged)).error_code == ErrorCode.INVALID_RECORD


@pytest.mark.parametrize("count,last_delta", [(5, 3), (5, 5), (0, -1), (-1, -2)])
def test_count_inconsistent_with_last_offset_delta_is_invalid_without_deep_walk(count: int,
                                                                                 last_delta: int) -> None:
    damaged = bytearray(golden_bytes("aiokafka", "snappy"))
    struct.pack_into(">i", damaged, 57, count)
    struct.pack_into(">i", damaged, 23, last_delta)
    assert refuse(with_fixed_crc(damaged), deep=False).error_code == ErrorCode.INVALID_RECORD


def test_base_offset_from_a_client_is_accepted() -> None:
    header, view = only_batch(build_batch(golden_records(base_offset=42), base_offset=42))
    validate_batch(header, view)


def records_section_damage(mutate) -> RecordBatchError:
    """Damage the records of an uncompressed client batch, fix the CRC, validate deeply."""
    batch = bytearray(golden_bytes("kafka_python", "none"))
    mutate(batch)
    return refuse(with_fixed_crc(batch))


def test_wrong_offset_delta_is_invalid() -> None:
    # Record 0 starts at 61: length varint (2 bytes), attributes, timestampDelta (1 byte), then offsetDelta.
    def mutate(batch):
        batch[HEADER_SIZE + 4] = 2  # zigzag 1: record 0 claims offset delta 1
    assert records_section_damage(mutate).error_code == ErrorCode.INVALID_RECORD


def test_wrong_record_length_is_invalid() -> None:
    def mutate(batch):
        batch[HEADER_SIZE] += 2  # record 0 one byte longer than its fields
    error = records_section_damage(mutate)
    assert error.error_code == ErrorCode.INVALID_RECORD


def test_negative_key_length_is_invalid() -> None:
    def mutate(batch):
        batch[HEADER_SIZE + 5] = 0x03  # zigzag -2
    assert records_section_damage(mutate).error_code == ErrorCode.INVALID_RECORD


def test_negative_record_length_is_invalid() -> None:
    def mutate(batch):
        batch[HEADER_SIZE:HEADER_SIZE + 2] = b"\x01\x00"  # zigzag -1, then a zero byte of padding
    assert records_section_damage(mutate).error_code == ErrorCode.INVALID_RECORD


def test_huge_key_length_is_invalid() -> None:
    records = [Record(0, 0, b"k" * 10, b"v")]
    batch = bytearray(build_batch(records))
    # Record: length (1 byte), attributes, timestampDelta, offsetDelta, then keyLength = 10 (zigzag 20).
    assert batch[HEADER_SIZE + 4] == 20
    batch[HEADER_SIZE + 4] = 0x7E  # zigzag 63: runs past the record and the batch
    assert refuse(with_fixed_crc(batch)).error_code == ErrorCode.INVALID_RECORD


def test_offset_delta_beyond_last_offset_delta_is_invalid_even_for_broker_batches() -> None:
    batch = build_batch([Record(0, 0, None, b"a"), Record(5, 0, None, b"b")], last_offset_delta=5)
    header, view = only_batch(batch)
    validate_batch(header, view, from_client=False)
    shrunk = patch_header(batch, ">i", 23, 4)
    error = refuse(shrunk, from_client=False)
    assert error.error_code == ErrorCode.INVALID_RECORD and "offset delta 5" in str(error)


def test_overlong_varint_is_invalid() -> None:
    def mutate(batch):
        batch[HEADER_SIZE + 3:HEADER_SIZE + 13] = b"\xff" * 10  # timestampDelta that never ends
    assert records_section_damage(mutate).error_code == ErrorCode.INVALID_RECORD


def test_false_max_timestamp_of_a_client_batch_is_reported_with_the_true_one_and_can_be_set() -> None:
    golden = golden_bytes("aiokafka", "none")
    damaged = patch_header(golden, ">q", 35, 1_800_000_000_000)
    header, view = only_batch(damaged)
    validate_batch(header, view, deep=False)  # only the deep walk sees the records' timestamps
    error = refuse(damaged)
    assert isinstance(error, FalseMaxTimestamp)
    assert error.error_code == ErrorCode.INVALID_RECORD and "maxTimestamp" in str(error)
    assert error.records_max == only_batch(golden)[0].max_timestamp
    repaired = bytearray(damaged)
    set_max_timestamp(repaired, 0, error.records_max)  # what the produce path does, as Kafka's broker does
    assert bytes(repaired) == golden


def test_control_batch_with_two_records_is_invalid() -> None:
    records = [Record(0, 0, b"\x00\x00\x00\x01", b"\x00\x00\x00\x00\x00\x00"),
               Record(1, 0, b"\x00\x00\x00\x01", b"\x00\x00\x00\x00\x00\x00")]
    batch = build_batch(records, control=True, transactional=True, producer_id=1, producer_epoch=0)
    assert refuse(batch, deep=False).error_code == ErrorCode.INVALID_RECORD


def test_control_record_without_its_key_is_invalid() -> None:
    batch = build_batch([Record(0, 0, b"\x00", b"")], control=True, transactional=True, producer_id=1,
                        producer_epoch=0)
    assert refuse(batch).error_code == ErrorCode.INVALID_RECORD


def test_idempotent_batch_without_sequence_is_invalid() -> None:
    batch = build_batch(golden_records(), producer_id=3, producer_epoch=0, base_sequence=-1)
    assert refuse(batch, deep=False).error_code == ErrorCode.INVALID_RECORD


def test_transactional_batch_without_producer_id_is_invalid() -> None:
    batch = build_batch(golden_records(), transactional=True)
    assert refuse(batch, deep=False).error_code == ErrorCode.INVALID_RECORD


def test_decompression_bomb_in_a_batch_is_corrupt() -> None:
    batch = build_batch([Record(0, 0, None, bytes(4 << 20))], compression=3)
    assert len(batch) < 100_000
    header, view = only_batch(batch)
    validate_batch(header, view, deep=False)  # the shallow check does not decompress
    error = refuse(batch, max_decompressed_size=1 << 20)
    assert error.error_code == ErrorCode.CORRUPT_MESSAGE and "limit" in str(error)


def test_error_codes_are_kafkas() -> None:
    """The codes a refused batch carries, with the numbers Kafka clients decode from the wire."""
    assert ErrorCode.CORRUPT_MESSAGE == 2
    assert ErrorCode.INVALID_RECORD == 87
    assert ErrorCode.UNSUPPORTED_COMPRESSION_TYPE == 76
    assert ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT == 43


# --- properties ---------------------------------------------------------------------------------------------------

@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=400))
def test_random_bytes_raise_only_record_batch_error(data: bytes) -> None:
    try:
        for header, view in split_batches(data):
            validate_batch(header, view)
            list(iter_records(view))
    except RecordBatchError:
        pass


@st.composite
def batch_with_valid_crc_but_damaged_records(draw):
    """A golden batch with CRC-covered bytes changed and the CRC fixed: a client with a buggy encoder."""
    client, codec = draw(st.sampled_from(ALL_GOLDEN_FILES))
    batch = bytearray(golden_bytes(client, codec))
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        position = draw(st.integers(min_value=21, max_value=len(batch) - 1))  # attributes onwards
        batch[position] = draw(st.integers(min_value=0, max_value=255))
    return with_fixed_crc(batch)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch_with_valid_crc_but_damaged_records())
def test_a_batch_that_validates_always_decodes(batch: bytearray) -> None:
    header, view = only_batch(batch)
    try:
        validate_batch(header, view, max_decompressed_size=1 << 20)
    except RecordBatchError:
        return
    decoded = list(iter_records(view))  # deep validation passed, so decoding must not fail
    assert len(decoded) == header.records_count


header_names = st.text(max_size=8)
optional_bytes = st.none() | st.binary(max_size=40)


@st.composite
def record_lists(draw):
    count = draw(st.integers(min_value=1, max_value=12))
    base_ts = draw(st.integers(min_value=0, max_value=2**41))
    return [
        Record(i, base_ts + draw(st.integers(min_value=-10_000, max_value=10_000)), draw(optional_bytes),
               draw(optional_bytes), tuple(draw(st.lists(st.tuples(header_names, optional_bytes), max_size=3))))
        for i in range(count)
    ]


@settings(max_examples=150, deadline=None)
@given(records=record_lists(), codec=st.sampled_from([0, 1, 2, 3, 4]))
def test_build_then_read_round_trips(records: list[Record], codec: int) -> None:
    header, view = only_batch(build_batch(records, compression=codec))
    validate_batch(header, view)
    assert list(iter_records(view)) == records
    theirs = aiokafka_records.DefaultRecordBatch(bytes(view))
    assert [(r.key, r.value, r.timestamp) for r in theirs] == [(r.key, r.value, r.timestamp) for r in records]
