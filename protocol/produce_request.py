"""Produce requests (key 0, v3-v13) decoded directly, without kafka-python's message objects.

Every produce request pays for its decoding, and the schema-driven decoder builds a struct object per topic and per
partition and copies each partition's records; this reads the same fields with struct and leaves the records as
zero-copy views of the request frame. `tests/test_produce_request.py` checks it against kafka-python's decoder for
every version (random requests, tagged fields, null and non-ASCII strings, truncated and malformed bodies).

Layout (`ProduceRequest.json` in Kafka): transactional_id nullable string, acks int16, timeout_ms int32,
topic_data [name string (v13+: topic_id uuid, 16 bytes), partition_data [index int32, records nullable bytes]].
v9+ is flexible: compact arrays, strings and bytes (length + 1 as an unsigned varint, 0 for null), and a tagged-field
section closing every struct (skipped: Produce defines no tagged fields).
"""
import struct
import uuid
from dataclasses import dataclass
from typing import ClassVar

MIN_VERSION = 3
MAX_VERSION = 13
FLEXIBLE_FROM = 9
TOPIC_IDS_FROM = 13

_ACKS_TIMEOUT = struct.Struct(">hi")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


class MalformedRequest(ValueError):
    """The bytes do not hold a produce request of the version its header names."""


@dataclass(slots=True)
class PartitionProduceData:
    index: int
    records: memoryview | None


@dataclass(slots=True)
class TopicProduceData:
    name: str | None  # v3-v12
    topic_id: uuid.UUID | None  # v13+
    partition_data: list[PartitionProduceData]


@dataclass(slots=True)
class ProduceRequest:
    API_KEY: ClassVar[int] = 0
    version: int
    transactional_id: str | None
    acks: int
    timeout_ms: int
    topic_data: list[TopicProduceData]


def _uvarint(buf: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 28:
            raise MalformedRequest("unsigned varint longer than 5 bytes")


def _skip_tagged_fields(buf: memoryview, pos: int) -> int:
    count, pos = _uvarint(buf, pos)
    for _ in range(count):
        _tag, pos = _uvarint(buf, pos)
        size, pos = _uvarint(buf, pos)
        pos += size
    return pos


def _length(buf: memoryview, pos: int, flexible: bool, wide: bool) -> tuple[int, int]:
    """The length of a string (wide=False: int16), bytes or array (wide: int32) at pos; -1 for null."""
    if flexible:
        n, pos = _uvarint(buf, pos)
        return n - 1, pos
    if wide:
        return _I32.unpack_from(buf, pos)[0], pos + 4
    return _I16.unpack_from(buf, pos)[0], pos + 2


def _string(buf: memoryview, pos: int, flexible: bool, nullable: bool) -> tuple[str | None, int]:
    if flexible and buf[pos] < 0x80:
        n, pos = buf[pos] - 1, pos + 1
    else:
        n, pos = _length(buf, pos, flexible, wide=False)
    if n < 0:
        if nullable and n == -1:
            return None, pos
        raise MalformedRequest(f"string length {n}")
    end = pos + n
    if end > len(buf):
        raise MalformedRequest("string runs past the end of the request")
    return str(buf[pos:end], "utf-8"), end


def _count(buf: memoryview, pos: int, flexible: bool, item_bytes: int) -> tuple[int, int]:
    if flexible and buf[pos] < 0x80:
        n, pos = buf[pos] - 1, pos + 1
    else:
        n, pos = _length(buf, pos, flexible, wide=True)
    if n < 0:  # a null array, which Produce's fields may not be
        raise MalformedRequest(f"array length {n}")
    if n * item_bytes > len(buf) - pos:  # each item takes at least item_bytes: a bigger count is a lie
        raise MalformedRequest(f"array of {n} items cannot fit in {len(buf) - pos} bytes")
    return n, pos


def decode_produce_request(body: memoryview, version: int) -> ProduceRequest:
    """The request in `body` (the frame after the request header); raises MalformedRequest for bytes that do not
    hold one."""
    if not MIN_VERSION <= version <= MAX_VERSION:
        raise MalformedRequest(f"produce v{version} is not served")
    try:
        return _decode(body, version)
    except (IndexError, struct.error, UnicodeDecodeError) as exc:
        raise MalformedRequest(f"truncated or malformed: {exc}") from None


def _decode(buf: memoryview, version: int) -> ProduceRequest:
    # Lengths of one byte (nearly all of them) are read inline; the helpers take the rest.
    flexible = version >= FLEXIBLE_FROM
    by_id = version >= TOPIC_IDS_FROM
    transactional_id, pos = _string(buf, 0, flexible, nullable=True)
    acks, timeout_ms = _ACKS_TIMEOUT.unpack_from(buf, pos)
    pos += 6
    topics, pos = _count(buf, pos, flexible, 2)
    topic_data = []
    end_of_buf = len(buf)
    for _ in range(topics):
        name = topic_id = None
        if by_id:
            end = pos + 16
            if end > end_of_buf:
                raise MalformedRequest("topic id runs past the end of the request")
            topic_id = uuid.UUID(bytes=bytes(buf[pos:end]))
            pos = end
        else:
            name, pos = _string(buf, pos, flexible, nullable=False)
        partitions, pos = _count(buf, pos, flexible, 5)
        partition_data = []
        for _ in range(partitions):
            index = _I32.unpack_from(buf, pos)[0]
            pos += 4
            if flexible and buf[pos] < 0x80:
                size = buf[pos] - 1
                pos += 1
            else:
                size, pos = _length(buf, pos, flexible, wide=True)
            if size < 0:
                if size != -1:
                    raise MalformedRequest(f"records length {size}")
                records = None
            else:
                end = pos + size
                if end > end_of_buf:
                    raise MalformedRequest("records run past the end of the request")
                records = buf[pos:end]
                pos = end
            if flexible:
                pos = pos + 1 if buf[pos] == 0 else _skip_tagged_fields(buf, pos)
            partition_data.append(PartitionProduceData(index, records))
        if flexible:
            pos = pos + 1 if buf[pos] == 0 else _skip_tagged_fields(buf, pos)
        topic_data.append(TopicProduceData(name, topic_id, partition_data))
    if flexible:
        _skip_tagged_fields(buf, pos)
    # Bytes after the request are ignored, as kafka-python's decoder (and Kafka's) ignores them.
    return ProduceRequest(version, transactional_id, acks, timeout_ms, topic_data)
