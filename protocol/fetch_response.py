"""Fetch responses (key 1, v4-v18) encoded directly, as a list of parts to write: the record bytes go out as the views
of the ledger reads they are, never copied into the response.

kafka-python's encoder copied every byte a consumer reads three times (into its buffer, out of it, into bytes),
after the handler had joined the batches into one: most of the broker's Python time when serving 1 KB records.
`tests/test_fetch_response.py` checks these bytes against kafka-python's encoder for every version (random answers,
aborted transactions null or not, null and empty records, topic names and ids, errors).

Layout (`FetchResponse.json` in Kafka): throttle_time_ms int32, error_code int16 (v7+), session_id int32 (v7+),
responses [topic string (v13+: topic id uuid), partitions [partition_index int32, error_code int16, high_watermark
int64, last_stable_offset int64, log_start_offset int64 (v5+), aborted_transactions nullable [producer_id int64,
first_offset int64], preferred_read_replica int32 (v11+), records nullable bytes]]. v12+ is flexible: compact
arrays, strings and bytes, response header v1, and tagged-field sections, left empty: kop never sets the tagged
fields (diverging epoch, current leader, snapshot id, node endpoints), whose defaults kafka-python leaves out too.
"""
import struct
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from protocol.varint import encode_uvarint

MIN_VERSION = 4
MAX_VERSION = 18
_FLEXIBLE_FROM = 12
_TOPIC_IDS_FROM = 13

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_HEAD = struct.Struct(">ii")  # frame size, correlation id
_TOP_V4 = struct.Struct(">i")  # throttle
_TOP_V7 = struct.Struct(">ihi")  # throttle, error code, session id
_PARTITION_V4 = struct.Struct(">ihqq")  # index, error code, high watermark, last stable offset
_PARTITION_V5 = struct.Struct(">ihqqq")  # ... and log start offset
_ABORTED = struct.Struct(">qq")  # producer id, first offset
_NULL_ARRAY = b"\xff\xff\xff\xff"


class AbortedTransaction(NamedTuple):
    producer_id: int
    first_offset: int


@dataclass(slots=True)
class PartitionData:
    """One partition's answer. `records`: the batches as buffers (views of what the ledger read), written as they
    are; empty: no records."""

    partition_index: int
    error_code: int
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    aborted_transactions: list[AbortedTransaction] | None = None
    records: Sequence[bytes | memoryview] = ()
    records_size: int = 0  # bytes in records
    preferred_read_replica: int = -1


@dataclass(slots=True)
class FetchableTopicResponse:
    topic: str | uuid.UUID  # a name (v4-v12) or an id (v13+)
    partitions: list[PartitionData]


@dataclass(slots=True)
class FetchResponse:
    """What the fetch handler answers; the connection writes the parts `frame(correlation id)` gives."""

    version: int
    throttle_time_ms: int = 0
    error_code: int = 0
    session_id: int = 0
    responses: list[FetchableTopicResponse] = field(default_factory=list)

    def frame(self, correlation_id: int) -> list[bytes | bytearray | memoryview]:
        return encode_fetch_response(self, correlation_id)


def _length(count: int, flexible: bool) -> bytes:
    """An array's or a bytes field's length (-1: null)."""
    if flexible:
        return encode_uvarint(count + 1)
    return _I32.pack(count)


def encode_fetch_response(response: FetchResponse, correlation_id: int) -> list[bytes | bytearray | memoryview]:
    """The framed response as parts: the frame's size and the response header first, then the body, the records as
    the buffers they are."""
    version = response.version
    if not MIN_VERSION <= version <= MAX_VERSION:
        raise ValueError(f"fetch response v{version} is not served")
    flexible = version >= _FLEXIBLE_FROM
    by_id = version >= _TOPIC_IDS_FROM
    partition_struct = _PARTITION_V5 if version >= 5 else _PARTITION_V4
    first = head = bytearray(_HEAD.pack(0, correlation_id))  # the frame's size is filled in at the end
    out: list[bytes | bytearray | memoryview] = [first]
    if flexible:
        head.append(0)  # response header v1: no tagged fields
    head += (_TOP_V7.pack(response.throttle_time_ms, response.error_code, response.session_id) if version >= 7
             else _TOP_V4.pack(response.throttle_time_ms))
    head += _length(len(response.responses), flexible)
    for topic in response.responses:
        if by_id:
            if not isinstance(topic.topic, uuid.UUID):
                raise ValueError(f"fetch response v{version} names topics by id")
            head += topic.topic.bytes
        else:
            if not isinstance(topic.topic, str):
                raise ValueError(f"fetch response v{version} names topics by name")
            name = topic.topic.encode("utf-8")
            head += encode_uvarint(len(name) + 1) if flexible else _I16.pack(len(name))
            head += name
        head += _length(len(topic.partitions), flexible)
        for p in topic.partitions:
            if version >= 5:
                head += partition_struct.pack(p.partition_index, p.error_code, p.high_watermark, p.last_stable_offset,
                                              p.log_start_offset)
            else:
                head += partition_struct.pack(p.partition_index, p.error_code, p.high_watermark,
                                              p.last_stable_offset)
            aborted = p.aborted_transactions
            if aborted is None:
                head += b"\x00" if flexible else _NULL_ARRAY
            else:
                head += _length(len(aborted), flexible)
                for producer_id, first_offset in aborted:
                    head += _ABORTED.pack(producer_id, first_offset)
                    if flexible:
                        head.append(0)
            if version >= 11:
                head += _I32.pack(p.preferred_read_replica)
            head += _length(p.records_size, flexible)
            if p.records_size:
                out.extend(p.records)
                head = bytearray()
                out.append(head)
            if flexible:
                head.append(0)  # the partition's tagged fields
        if flexible:
            head.append(0)  # the topic's
    if flexible:
        head.append(0)  # the response's
    _I32.pack_into(first, 0, sum(map(len, out)) - 4)
    return out
