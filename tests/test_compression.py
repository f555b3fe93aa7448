"""protocol.compression against the codecs real Kafka clients use, damaged input and decompression bombs."""
import os
import struct
import zlib

import aiokafka.codec
import cramjam
import kafka.codec
import lz4.frame
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.compression import (
    GZIP,
    LZ4,
    NONE,
    SNAPPY,
    XERIAL_MAGIC,
    ZSTD,
    RecordBatchError,
    compress,
    decompress,
)
from protocol.errors import ErrorCode

CODECS = [GZIP, SNAPPY, LZ4, ZSTD]
PAYLOADS = [
    b"",
    b"x",
    b"kafka record batch " * 100,
    os.urandom(3000),  # incompressible
    os.urandom(500) + bytes(200_000),  # several snappy/lz4 blocks
]


def xerial(blocks: list[bytes], *, byteorder: str = "big") -> bytes:
    """Java's snappy framing (xerial SnappyOutputStream), written out by hand from its documented layout."""
    out = bytearray(XERIAL_MAGIC)
    out += (1).to_bytes(4, byteorder) + (1).to_bytes(4, byteorder)  # version, compatible version
    for block in blocks:
        raw = bytes(cramjam.snappy.compress_raw(block))
        out += struct.pack(">i", len(raw)) + raw
    return bytes(out)


def expect_error(code: ErrorCode, codec: int, data: bytes, **kwargs) -> RecordBatchError:
    with pytest.raises(RecordBatchError) as caught:
        decompress(codec, data, **kwargs)
    assert caught.value.error_code == code, str(caught.value)
    return caught.value


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("payload", PAYLOADS, ids=["empty", "one-byte", "text", "random", "large"])
def test_round_trip(codec: int, payload: bytes) -> None:
    assert decompress(codec, compress(codec, payload)) == payload


def test_codec_none_passes_bytes_through() -> None:
    assert decompress(NONE, memoryview(b"abc")) == b"abc"
    assert compress(NONE, b"abc") == b"abc"


@pytest.mark.parametrize("codec", [5, 6, 7, -1])
def test_unknown_codec_is_unsupported_compression_type(codec: int) -> None:
    expect_error(ErrorCode.UNSUPPORTED_COMPRESSION_TYPE, codec, b"data")
    with pytest.raises(RecordBatchError) as caught:
        compress(codec, b"data")
    assert caught.value.error_code == ErrorCode.UNSUPPORTED_COMPRESSION_TYPE


# --- what clients write, we read ----------------------------------------------------------------------------------

PAYLOAD = b"0123456789abcdef" * 5000 + os.urandom(100)


@pytest.mark.parametrize("encoded", [
    kafka.codec.gzip_encode(PAYLOAD),
    aiokafka.codec.gzip_encode(PAYLOAD),
    zlib.compress(PAYLOAD),  # a bare zlib stream, accepted too
], ids=["kafka-python", "aiokafka", "zlib"])
def test_reads_client_gzip(encoded: bytes) -> None:
    assert decompress(GZIP, encoded) == PAYLOAD


def test_reads_concatenated_gzip_members() -> None:
    assert decompress(GZIP, compress(GZIP, b"first ") + compress(GZIP, b"second")) == b"first second"


@pytest.mark.parametrize("encoded", [
    aiokafka.codec.snappy_encode(PAYLOAD),  # xerial framing, 32 KiB blocks, as the Java client writes
    aiokafka.codec.snappy_encode(PAYLOAD, xerial_compatible=False),  # one raw block, as librdkafka writes
    xerial([PAYLOAD[:1000], PAYLOAD[1000:40000], PAYLOAD[40000:]]),
    xerial([PAYLOAD[:33000], PAYLOAD[33000:]], byteorder="little"),  # version ints written little-endian
    bytes(cramjam.snappy.compress_raw(PAYLOAD)),
], ids=["aiokafka-xerial", "aiokafka-raw", "java-xerial-by-hand", "xerial-little-endian-version", "cramjam-raw"])
def test_reads_xerial_and_raw_snappy(encoded: bytes) -> None:
    assert decompress(SNAPPY, encoded) == PAYLOAD


def test_reads_lz4_frames_kafka_python_writes() -> None:
    assert decompress(LZ4, kafka.codec.lz4_encode(PAYLOAD)) == PAYLOAD
    assert decompress(LZ4, aiokafka.codec.lz4_encode(PAYLOAD)) == PAYLOAD
    assert decompress(LZ4, lz4.frame.compress(PAYLOAD, content_checksum=True, block_checksum=True)) == PAYLOAD


def test_reads_zstd_with_and_without_content_size_and_several_frames() -> None:
    streamed = zstandard.ZstdCompressor(write_content_size=False).compressobj()
    without_size = streamed.compress(PAYLOAD) + streamed.flush()
    assert zstandard.frame_content_size(without_size) == -1
    assert decompress(ZSTD, without_size) == PAYLOAD
    assert decompress(ZSTD, kafka.codec.zstd_encode(PAYLOAD)) == PAYLOAD
    assert decompress(ZSTD, aiokafka.codec.zstd_encode(PAYLOAD)) == PAYLOAD
    two_frames = compress(ZSTD, b"one ") + without_size
    assert decompress(ZSTD, two_frames) == b"one " + PAYLOAD


# --- what we write, clients read ----------------------------------------------------------------------------------

def test_clients_read_what_we_write() -> None:
    assert kafka.codec.gzip_decode(compress(GZIP, PAYLOAD)) == PAYLOAD
    assert aiokafka.codec.snappy_decode(compress(SNAPPY, PAYLOAD)) == PAYLOAD
    assert compress(SNAPPY, PAYLOAD).startswith(XERIAL_MAGIC)
    assert kafka.codec.lz4_decode(compress(LZ4, PAYLOAD)) == PAYLOAD
    assert kafka.codec.zstd_decode(compress(ZSTD, PAYLOAD)) == PAYLOAD


def test_lz4_blocks_are_independent() -> None:
    # FLG byte of the frame descriptor: bit 5 set = blocks independent (Java's reader refuses linked blocks).
    frame = compress(LZ4, PAYLOAD)
    assert frame[:4] == b"\x04\x22\x4d\x18"
    assert frame[4] & 0x20


# --- damaged input ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("codec", CODECS)
def test_truncated_payload_is_corrupt(codec: int) -> None:
    encoded = compress(codec, PAYLOAD)
    for cut in (1, 7, len(encoded) // 2):
        expect_error(ErrorCode.CORRUPT_MESSAGE, codec, encoded[:-cut])


@pytest.mark.parametrize("codec", CODECS)
def test_trailing_garbage_is_corrupt(codec: int) -> None:
    expect_error(ErrorCode.CORRUPT_MESSAGE, codec, compress(codec, PAYLOAD) + b"\x01garbage")


@pytest.mark.parametrize("codec", CODECS)
def test_empty_payload_is_corrupt(codec: int) -> None:
    expect_error(ErrorCode.CORRUPT_MESSAGE, codec, b"")


def test_xerial_block_length_past_the_end_is_corrupt() -> None:
    framed = bytearray(xerial([b"hello" * 100]))
    struct.pack_into(">i", framed, 16, 10_000)
    expect_error(ErrorCode.CORRUPT_MESSAGE, SNAPPY, bytes(framed))
    struct.pack_into(">i", framed, 16, -5)
    expect_error(ErrorCode.CORRUPT_MESSAGE, SNAPPY, bytes(framed))
    expect_error(ErrorCode.CORRUPT_MESSAGE, SNAPPY, xerial([b"x"]) + b"\x00\x00")  # a block length cut short


# --- decompression bombs ------------------------------------------------------------------------------------------

ONE_MIB = 1 << 20


@pytest.mark.parametrize("codec", CODECS)
def test_payload_expanding_past_max_size_is_corrupt(codec: int) -> None:
    bomb = compress(codec, bytes(8 * ONE_MIB))
    assert len(bomb) < 400_000
    error = expect_error(ErrorCode.CORRUPT_MESSAGE, codec, bomb, max_size=ONE_MIB)
    assert "limit" in str(error)
    assert len(decompress(codec, bomb, max_size=8 * ONE_MIB)) == 8 * ONE_MIB  # exactly at the limit is fine


def test_zstd_bomb_without_content_size_stops_at_default_limit() -> None:
    writer = zstandard.ZstdCompressor(write_content_size=False).compressobj()
    chunk = bytes(ONE_MIB)
    bomb = b"".join(writer.compress(chunk) for _ in range(80)) + writer.flush()  # 80 MiB of zeros
    assert len(bomb) < 10_000
    assert "limit" in str(expect_error(ErrorCode.CORRUPT_MESSAGE, ZSTD, bomb))


def test_snappy_block_declaring_a_huge_length_is_refused_before_decoding() -> None:
    # A raw snappy block starts with its uncompressed length; 0xFFFFFFFF here, and nothing behind it.
    expect_error(ErrorCode.CORRUPT_MESSAGE, SNAPPY, b"\xff\xff\xff\xff\x0f\x00")
    many_blocks = xerial([bytes(ONE_MIB)] * 3)
    expect_error(ErrorCode.CORRUPT_MESSAGE, SNAPPY, many_blocks, max_size=2 * ONE_MIB)


# --- arbitrary input ----------------------------------------------------------------------------------------------

@settings(max_examples=300, deadline=None)
@given(codec=st.sampled_from(CODECS), data=st.binary(max_size=300))
def test_random_bytes_raise_only_record_batch_error(codec: int, data: bytes) -> None:
    try:
        decompress(codec, data, max_size=ONE_MIB)
    except RecordBatchError as e:
        assert e.error_code == ErrorCode.CORRUPT_MESSAGE


@settings(max_examples=200, deadline=None)
@given(codec=st.sampled_from(CODECS), payload=st.binary(max_size=2000), flip=st.integers(min_value=0),
       value=st.integers(min_value=1, max_value=255))
def test_damaged_compressed_bytes_raise_only_record_batch_error(codec: int, payload: bytes, flip: int,
                                                                value: int) -> None:
    damaged = bytearray(compress(codec, payload))
    damaged[flip % len(damaged)] ^= value
    try:
        decompress(codec, bytes(damaged), max_size=ONE_MIB)
    except RecordBatchError as e:
        assert e.error_code == ErrorCode.CORRUPT_MESSAGE
