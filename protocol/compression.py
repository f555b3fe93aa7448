"""The four compression codecs of Kafka record batches, with a bound on how much a payload may expand.

Codec numbers are the batch attributes' low three bits: 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd.

- gzip: RFC 1952 members (zlib streams are accepted too); concatenated members are read, as Java's GZIPInputStream
  reads them.
- snappy: Java clients write xerial's block framing (magic b"\\x82SNAPPY\\x00", int32 version, int32 compat, then
  [int32 length][raw snappy block]...); librdkafka writes one raw snappy block. Both are read; compress() writes
  the xerial framing, which every Kafka client reads.
- lz4: the LZ4 frame format with independent blocks (Java's KafkaLZ4BlockInputStream refuses linked blocks).
- zstd: one or more zstd frames; the content size may be missing from the frame header.

Every failure raises RecordBatchError: an unknown codec is UNSUPPORTED_COMPRESSION_TYPE, anything else (damaged
data, output beyond `max_size`) is CORRUPT_MESSAGE.
"""
import zlib
from typing import TypeAlias

import cramjam
import lz4.frame
import zstandard

from protocol.errors import ErrorCode

BytesLike: TypeAlias = bytes | bytearray | memoryview

NONE, GZIP, SNAPPY, LZ4, ZSTD = 0, 1, 2, 3, 4
CODEC_NAMES = {NONE: "none", GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}

DEFAULT_MAX_SIZE = 64 * 1024 * 1024

XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = XERIAL_MAGIC + (1).to_bytes(4, "big") + (1).to_bytes(4, "big")  # version 1, compatible with 1
_XERIAL_BLOCK = 32 * 1024  # the uncompressed block size xerial's SnappyOutputStream uses

# A zstd block needs at least 4 input bytes and yields at most 128 KiB, so feeding a decompressor n input bytes at a
# time bounds one step's output by n * 32 KiB. Steps are sized from the budget left: the output can at most double
# past max_size (or pass it by 2 MiB) before the loop notices.
_ZSTD_MAX_EXPANSION = 128 * 1024 // 4
_ZSTD_MIN_STEP = 64


class RecordBatchError(Exception):
    """A record batch the broker must refuse; `error_code` is the Kafka error code to answer with.

    It lives here because records.py imports this module; protocol.records re-exports it.
    """

    def __init__(self, error_code: ErrorCode, reason: str) -> None:
        super().__init__(reason)
        self.error_code = error_code


def _corrupt(reason: str) -> RecordBatchError:
    return RecordBatchError(ErrorCode.CORRUPT_MESSAGE, reason)


def _too_big(codec: int, max_size: int) -> RecordBatchError:
    return _corrupt(f"{CODEC_NAMES[codec]} payload expands beyond the {max_size}-byte limit")


def decompress(codec: int, data: BytesLike, max_size: int = DEFAULT_MAX_SIZE) -> bytes:
    """Return the decompressed bytes of `data`, refusing to produce more than `max_size` bytes."""
    if codec == NONE:
        return bytes(data)
    decoder = _DECODERS.get(codec)
    if decoder is None:
        raise RecordBatchError(ErrorCode.UNSUPPORTED_COMPRESSION_TYPE, f"unknown compression codec {codec}")
    if len(data) == 0:
        raise _corrupt(f"empty {CODEC_NAMES[codec]} payload")
    try:
        return decoder(data, max_size)
    except RecordBatchError:
        raise
    except Exception as e:  # each library has its own error types; all of them mean damaged data here
        raise _corrupt(f"{CODEC_NAMES[codec]} payload does not decompress: {e}") from e


def compress(codec: int, data: BytesLike, *, level: int | None = None) -> bytes:
    """Compress `data` the way Kafka clients do for `codec`."""
    encoder = _ENCODERS.get(codec)
    if encoder is None:
        raise RecordBatchError(ErrorCode.UNSUPPORTED_COMPRESSION_TYPE, f"unknown compression codec {codec}")
    return encoder(data, level)


# --- gzip ---------------------------------------------------------------------------------------------------------

def _gzip_decompress(data: BytesLike, max_size: int) -> bytes:
    out = bytearray()
    rest = bytes(data)
    while rest:
        inflater = zlib.decompressobj(wbits=47)  # 32 + 15: gzip or zlib header, detected
        out += inflater.decompress(rest, max_size + 1 - len(out))
        if len(out) > max_size or inflater.unconsumed_tail:
            raise _too_big(GZIP, max_size)
        if not inflater.eof:
            raise _corrupt("gzip payload is truncated")
        rest = inflater.unused_data  # a further member, or garbage the next round refuses
    return bytes(out)


def _gzip_compress(data: BytesLike, level: int | None) -> bytes:
    deflater = zlib.compressobj(6 if level is None else level, zlib.DEFLATED, 31)  # 16 + 15: gzip container
    return deflater.compress(data) + deflater.flush()


# --- snappy -------------------------------------------------------------------------------------------------------

def _snappy_decompress(data: BytesLike, max_size: int) -> bytes:
    view = memoryview(data)
    if len(view) >= 16 and view[:8] == XERIAL_MAGIC:
        return _xerial_decompress(view, max_size)
    if _raw_snappy_length(view) > max_size:
        raise _too_big(SNAPPY, max_size)
    return bytes(cramjam.snappy.decompress_raw(view))


def _xerial_decompress(view: memoryview, max_size: int) -> bytes:
    # The version and compat ints are not checked: only version 1 exists, and some writers encode them
    # little-endian (kafka-python issue #2414).
    out = bytearray()
    pos = 16
    end = len(view)
    while pos < end:
        if end - pos < 4:
            raise _corrupt("xerial snappy block length is truncated")
        block_len = int.from_bytes(view[pos:pos + 4], "big", signed=True)
        pos += 4
        if block_len < 0 or block_len > end - pos:
            raise _corrupt(f"xerial snappy block length {block_len} does not fit the {end - pos} bytes left")
        block = view[pos:pos + block_len]
        pos += block_len
        if len(out) + _raw_snappy_length(block) > max_size:
            raise _too_big(SNAPPY, max_size)
        out += cramjam.snappy.decompress_raw(block)
    return bytes(out)


def _raw_snappy_length(block: memoryview) -> int:
    """The uncompressed length a raw snappy block declares in its preamble (an unsigned varint, up to 32 bits)."""
    length = 0
    for i in range(min(5, len(block))):
        b = block[i]
        length |= (b & 0x7F) << (7 * i)
        if b < 0x80:
            return length
    raise _corrupt("snappy block preamble is malformed")


def _snappy_compress(data: BytesLike, level: int | None) -> bytes:
    view = memoryview(data)
    out = bytearray(_XERIAL_HEADER)
    for start in range(0, len(view), _XERIAL_BLOCK):
        block = cramjam.snappy.compress_raw(view[start:start + _XERIAL_BLOCK])
        out += len(block).to_bytes(4, "big")
        out += block
    return bytes(out)


# --- lz4 ----------------------------------------------------------------------------------------------------------

def _lz4_decompress(data: BytesLike, max_size: int) -> bytes:
    out = bytearray()
    rest = bytes(data)
    while rest:
        decoder = lz4.frame.LZ4FrameDecompressor()
        out += decoder.decompress(rest, max_length=max_size + 1 - len(out))
        if len(out) > max_size:
            raise _too_big(LZ4, max_size)
        if not decoder.eof:
            if not decoder.needs_input:  # stopped by max_length with output still pending
                raise _too_big(LZ4, max_size)
            raise _corrupt("lz4 frame is truncated")
        rest = decoder.unused_data or b""
    return bytes(out)


def _lz4_compress(data: BytesLike, level: int | None) -> bytes:
    return lz4.frame.compress(data, compression_level=level or 0, block_linked=False)


# --- zstd ---------------------------------------------------------------------------------------------------------

_ZSTD_DCTX = zstandard.ZstdDecompressor()


def _zstd_decompress(data: BytesLike, max_size: int) -> bytes:
    declared = zstandard.frame_content_size(data)
    if declared > max_size:
        raise _too_big(ZSTD, max_size)
    if declared >= 0:
        # One frame that declares its size (python-zstandard checks for trailing data only then): one call.
        try:
            return _ZSTD_DCTX.decompress(data, allow_extra_data=False)
        except zstandard.ZstdError:
            pass  # several frames, or damage: the stepwise path tells which
    return _zstd_decompress_frames(memoryview(data), max_size)


def _zstd_decompress_frames(view: memoryview, max_size: int) -> bytes:
    # Streaming writers (Java's zstd-jni, librdkafka) leave the content size out, so this is the usual path.
    out = bytearray()
    pos = 0
    while pos < len(view):
        frame = _ZSTD_DCTX.decompressobj()
        while not frame.eof:
            if pos >= len(view):
                raise _corrupt("zstd frame is truncated")
            step = max(_ZSTD_MIN_STEP, (max_size - len(out)) // _ZSTD_MAX_EXPANSION)
            chunk = view[pos:pos + step]
            pos += len(chunk)
            out += frame.decompress(chunk)
            if len(out) > max_size:
                raise _too_big(ZSTD, max_size)
        pos -= len(frame.unused_data)  # input past this frame's end belongs to the next frame
    return bytes(out)


def _zstd_compress(data: BytesLike, level: int | None) -> bytes:
    return zstandard.ZstdCompressor(level=3 if level is None else level).compress(data)


_DECODERS = {GZIP: _gzip_decompress, SNAPPY: _snappy_decompress, LZ4: _lz4_decompress, ZSTD: _zstd_decompress}
_ENCODERS = {
    NONE: lambda data, level: bytes(data),
    GZIP: _gzip_compress,
    SNAPPY: _snappy_compress,
    LZ4: _lz4_compress,
    ZSTD: _zstd_compress,
}
