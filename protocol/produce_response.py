"""Produce responses (key 0, v3-v13) encoded directly, without kafka-python's message objects.

Every produce request gets one, so building it through the schema-driven classes cost more than anything else the
broker does per request: 60-70 µs (building the objects, then encoding them) of the ~400 µs a single-record
produce takes in all (bench/BENCHMARKS.md, "Where the produce path spends its CPU"). This writes the same bytes
with struct in a few µs. `tests/test_produce_response.py` checks it byte for byte against kafka-python's encoder
for every version, with and without record errors, error messages, empty and non-ASCII strings.

Layout (`ProduceResponse.json` in Kafka): responses [name (v13+: topic id, 16 bytes), partitions [index int32, error_code int16, base_offset
int64, log_append_time_ms int64, log_start_offset int64 (v5+), record_errors [batch_index int32, message
nullable string] (v8+), error_message nullable string (v8+)]], throttle_time_ms int32. v9+ is flexible: compact
arrays and strings, response header v1, and empty tagged-field sections (v10's tagged current_leader and
node_endpoints hold their defaults and are left out, as kafka-python leaves them out). v11 and v12 are v10's layout.
"""
import functools
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

MIN_VERSION = 3
MAX_VERSION = 13
_FLEXIBLE_FROM = 9
_TOPIC_IDS_FROM = 13

_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")
_FRAME_AND_CORRELATION = struct.Struct(">ii")
_PARTITION_V3 = struct.Struct(">ihqq")  # index, error code, base offset, log-append time
_PARTITION_V5 = struct.Struct(">ihqqq")  # ... and log start offset
_NO_ERRORS = b"\x00\x00\x00\x00\xff\xff"  # v8+: no record errors, a null error message
_NO_ERRORS_FLEXIBLE = b"\x01\x00"  # the same, compact


class PartitionResponse(NamedTuple):  # one per partition of every request: cheaper to build than a dataclass
    index: int
    error_code: int
    base_offset: int
    log_append_time_ms: int
    log_start_offset: int
    record_errors: Sequence[tuple[int, str | None]] = ()  # (batch index, message)
    error_message: str | None = None


@dataclass(frozen=True, slots=True)
class ProduceResponse:
    """What the produce handler answers; the connection frames it with `frame`."""

    version: int
    responses: Sequence[tuple[str | bytes, Sequence[PartitionResponse]]]  # topic name, or its id's 16 bytes (v13+)
    throttle_time_ms: int = 0

    def frame(self, correlation_id: int) -> bytes:
        return encode_produce_response(self, correlation_id)


_ONE_BYTE = [bytes((i,)) for i in range(0x80)]


def _uvarint(value: int) -> bytes:
    if value < 0x80:
        return _ONE_BYTE[value]
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


@functools.lru_cache(maxsize=4096)  # topic names and the usual messages: encoded once
def _string(value: str, flexible: bool) -> bytes:
    raw = value.encode("utf-8")
    return (_uvarint(len(raw) + 1) if flexible else _I16.pack(len(raw))) + raw


def _nullable_string(value: str | None, flexible: bool) -> bytes:
    if value is None:
        return b"\x00" if flexible else b"\xff\xff"
    return _string(value, flexible)


def _array_length(count: int, flexible: bool) -> bytes:
    if flexible:
        return _ONE_BYTE[count + 1] if count < 0x7F else _uvarint(count + 1)
    return _I32.pack(count)


def encode_produce_response(response: ProduceResponse, correlation_id: int) -> bytes:
    """The framed response: size, response header, body."""
    version = response.version
    if not MIN_VERSION <= version <= MAX_VERSION:
        raise ValueError(f"produce response v{version} is not served")
    flexible = version >= _FLEXIBLE_FROM
    partition_struct = _PARTITION_V5 if version >= 5 else _PARTITION_V3
    parts: list[bytes] = [b"\x00"] if flexible else []  # header v1: no tagged fields
    parts.append(_array_length(len(response.responses), flexible))
    topic_ids = version >= _TOPIC_IDS_FROM
    for topic, partitions in response.responses:
        if topic_ids != isinstance(topic, bytes):
            raise ValueError(f"produce response v{version} names topics by {'id' if topic_ids else 'name'}")
        parts.append(topic if isinstance(topic, bytes) else _string(topic, flexible))
        parts.append(_array_length(len(partitions), flexible))
        for p in partitions:
            if version >= 5:
                parts.append(partition_struct.pack(p.index, p.error_code, p.base_offset, p.log_append_time_ms,
                                                   p.log_start_offset))
            else:
                parts.append(partition_struct.pack(p.index, p.error_code, p.base_offset, p.log_append_time_ms))
            if version >= 8 and not p.record_errors and p.error_message is None:
                parts.append(_NO_ERRORS_FLEXIBLE if flexible else _NO_ERRORS)
            elif version >= 8:
                parts.append(_array_length(len(p.record_errors), flexible))
                for batch_index, message in p.record_errors:
                    parts.append(_I32.pack(batch_index))
                    parts.append(_nullable_string(message, flexible))
                    if flexible:
                        parts.append(b"\x00")
                parts.append(_nullable_string(p.error_message, flexible))
            if flexible:
                parts.append(b"\x00")
        if flexible:
            parts.append(b"\x00")
    parts.append(_I32.pack(response.throttle_time_ms))
    if flexible:
        parts.append(b"\x00")
    body = b"".join(parts)
    return _FRAME_AND_CORRELATION.pack(len(body) + 4, correlation_id) + body
