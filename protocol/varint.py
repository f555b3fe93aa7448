"""Kafka's zigzag varints (record fields of batch format v2), as protobuf's sint32/sint64 encode them.

A varint (int32) takes at most 5 bytes and a varlong (int64) at most 10; longer encodings are malformed, as Kafka's
ByteUtils.readVarint/readVarlong say. Decoding raises IndexError when the buffer ends mid-varint and VarintError for
an over-long encoding, so callers can map both to their own error.
"""
from typing import TypeAlias

BytesLike: TypeAlias = bytes | bytearray | memoryview
VARINT_MAX_BYTES = 5
VARLONG_MAX_BYTES = 10


class VarintError(ValueError):
    """A varint longer than its type allows."""


def decode_varint(buf: BytesLike, pos: int, max_bytes: int = VARLONG_MAX_BYTES) -> tuple[int, int]:
    """Decode one zigzag varint at `pos`; return (value, position after it)."""
    raw = 0
    shift = 0
    end = pos + max_bytes
    while True:
        if pos >= end:
            raise VarintError(f"varint longer than {max_bytes} bytes")
        b = buf[pos]
        pos += 1
        raw |= (b & 0x7F) << shift
        if b < 0x80:
            return (raw >> 1) ^ -(raw & 1), pos
        shift += 7


def encode_varint(value: int, out: bytearray) -> None:
    """Append the zigzag varint of `value` (any int64) to `out`."""
    raw = (value << 1) ^ (value >> 63)
    while raw >= 0x80:
        out.append((raw & 0x7F) | 0x80)
        raw >>= 7
    out.append(raw)


_ONE_BYTE = [bytes((i,)) for i in range(0x80)]


def encode_uvarint(value: int) -> bytes:
    """The unsigned varint of `value` >= 0, as flexible protocol versions frame lengths (compact arrays, strings and
    bytes, as length + 1); one byte (nearly every length) from a table."""
    if value < 0x80:
        return _ONE_BYTE[value]
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
