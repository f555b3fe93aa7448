"""Kafka record batches (magic 2): split a Produce `records` blob, validate each batch, assign its offsets, build one.

The broker stores client batches byte for byte. Only baseOffset (bytes 0..8) and partitionLeaderEpoch (12..16)
may change after a client wrote the batch: its CRC32C covers bytes 21.. (attributes to the end), nothing before.
The exceptions, where Kafka's broker rewrites a batch too, recompute the CRC: LogAppendTime topics stamp
maxTimestamp and the timestamp type, and a false maxTimestamp is set to the records' greatest (FalseMaxTimestamp).

Batch header, 61 bytes, big-endian:
    baseOffset int64 | batchLength int32 | partitionLeaderEpoch int32 | magic int8 | crc uint32 | attributes int16 |
    lastOffsetDelta int32 | baseTimestamp int64 | maxTimestamp int64 | producerId int64 | producerEpoch int16 |
    baseSequence int32 | recordsCount int32
then the records (compressed as a whole when attributes & 7 != 0), each:
    length varint | attributes int8 | timestampDelta varlong | offsetDelta varint | keyLength varint | key |
    valueLength varint | value | headerCount varint | [keyLength varint | key utf-8 | valueLength varint | value]...

Error codes (RecordBatchError.error_code): bytes that do not hold a whole batch or fail their CRC are
CORRUPT_MESSAGE (retriable for Java clients: damage in transit may not recur); a batch whose CRC matches but whose
content is inconsistent is INVALID_RECORD (the client wrote it so, a retry cannot help), as Kafka's LogValidator
answers; magic 0/1 is UNSUPPORTED_FOR_MESSAGE_FORMAT; an unknown codec is UNSUPPORTED_COMPRESSION_TYPE.
"""
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

import crc32c

from protocol.compression import (
    CODEC_NAMES,
    DEFAULT_MAX_SIZE,
    NONE,
    BytesLike,
    RecordBatchError,
    compress,
    decompress,
)
from protocol.errors import ErrorCode
from protocol.varint import VARINT_MAX_BYTES, VARLONG_MAX_BYTES, VarintError, decode_varint, encode_varint

try:  # the record walk in C (protocol/_accel.c), built by `pip install`; without a compiler the Python walk does all
    from protocol._accel import walk as _fast_walk
    from protocol._accel import walk_watched as _fast_walk_watched
except ImportError:
    _fast_walk = _fast_walk_watched = None

__all__ = [
    "BatchHeader",
    "ControlMarker",
    "Record",
    "HeaderWatch",
    "WalkedRecords",
    "FalseMaxTimestamp",
    "RecordBatchError",
    "assign_offsets",
    "set_log_append_time",
    "set_max_timestamp",
    "clear_transactional",
    "build_batch",
    "build_control_batch",
    "build_marker_batch",
    "marker_payload",
    "control_marker",
    "iter_records",
    "keep_records",
    "record_spans",
    "split_batches",
    "validate_batch",
]

HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE = HEADER.size  # 61
LOG_OVERHEAD = 12  # baseOffset + batchLength: batchLength counts the bytes after these
MIN_BATCH_LENGTH = HEADER_SIZE - LOG_OVERHEAD  # 49
MAGIC_OFFSET = 16  # where every message format (v0, v1, v2) keeps its magic byte
CRC_OFFSET = 17
CRC_START = 21  # the CRC covers attributes onwards
CURRENT_MAGIC = 2

COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_MASK = 0x10
CONTROL_MASK = 0x20
CREATE_TIME = 0
LOG_APPEND_TIME = 1

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_PARTITION_LEADER_EPOCH = -1
INT32_MAX = 2**31 - 1

# length, attributes, timestampDelta, offsetDelta, keyLength, valueLength, headerCount: one byte each at least.
MIN_RECORD_SIZE = 7
_BELOW_ANY_VARLONG = -(2**64)

_INT64 = struct.Struct(">q")
_INT32 = struct.Struct(">i")
_INT16 = struct.Struct(">h")
_UINT32 = struct.Struct(">I")
MAX_TIMESTAMP_OFFSET = 35
_CONTROL_KEY = struct.Struct(">hh")  # version, type
_TXN_MARKER_VALUE = struct.Struct(">hi")  # version, coordinator epoch
CONTROL_ABORT = 0
CONTROL_COMMIT = 1


@dataclass(slots=True)
class BatchHeader:
    """The 61-byte header of a v2 record batch, as the client wrote it (read-only by convention: every produced
    batch builds one, and a frozen dataclass's __init__ costs several times more). `size`, `is_transactional` and
    `is_control`, read several times per batch, are computed once."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int
    size: int = field(init=False, repr=False, compare=False)  # bytes the whole batch takes
    is_transactional: bool = field(init=False, repr=False, compare=False)
    is_control: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.size = LOG_OVERHEAD + self.batch_length
        self.is_transactional = bool(self.attributes & TRANSACTIONAL_MASK)
        self.is_control = bool(self.attributes & CONTROL_MASK)

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def timestamp_type(self) -> int:
        return LOG_APPEND_TIME if self.attributes & TIMESTAMP_TYPE_MASK else CREATE_TIME


    @property
    def has_producer_id(self) -> bool:
        return self.producer_id > NO_PRODUCER_ID

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def last_sequence(self) -> int:
        """Sequence of the batch's last record; sequences wrap from 2**31-1 to 0 (DefaultRecordBatch.incrementSequence)."""
        if self.base_sequence == NO_SEQUENCE:
            return NO_SEQUENCE
        if self.base_sequence > INT32_MAX - self.last_offset_delta:
            return self.last_offset_delta - (INT32_MAX - self.base_sequence) - 1
        return self.base_sequence + self.last_offset_delta


@dataclass(frozen=True, slots=True)
class Record:
    """One record. `offset` is absolute (baseOffset + offsetDelta); header keys are str (bytes that are not UTF-8
    survive as surrogate escapes, so a record decodes and re-encodes to the same bytes)."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()


@dataclass(frozen=True, slots=True)
class ControlMarker:
    """A transaction marker: the one record of a control batch that ends a transaction."""

    commit: bool
    coordinator_epoch: int


def _corrupt(reason: str) -> RecordBatchError:
    return RecordBatchError(ErrorCode.CORRUPT_MESSAGE, reason)


def _invalid(reason: str) -> RecordBatchError:
    return RecordBatchError(ErrorCode.INVALID_RECORD, reason)


class FalseMaxTimestamp(RecordBatchError):
    """A client batch, sound but for a maxTimestamp that is not its records' greatest (`records_max`).

    Kafka's LogValidator does not refuse such a batch: it sets maxTimestamp from the records. librdkafka writes one
    for records whose timestamp is -1 (maxTimestamp 0). A caller that does not repair it (set_max_timestamp)
    refuses the batch as INVALID_RECORD like any other error.
    """

    def __init__(self, reason: str, records_max: int) -> None:
        super().__init__(ErrorCode.INVALID_RECORD, reason)
        self.records_max = records_max


# --- splitting ----------------------------------------------------------------------------------------------------

def split_batches(records: BytesLike) -> list[tuple[BatchHeader, memoryview]]:
    """Split a `records` blob into batches: each header with a zero-copy view of the batch's bytes.

    Empty input gives an empty list (a Produce handler answers that as it sees fit; Kafka says INVALID_RECORD).
    Trailing bytes too short for a whole batch are refused, not trimmed: a client never sends a partial batch.
    Only the framing is checked here; validate_batch checks each batch.
    """
    view = memoryview(records)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    total = len(view)
    batches = []
    pos = 0
    while pos < total:
        left = total - pos
        if left <= MAGIC_OFFSET:
            raise _corrupt(f"{left} bytes at position {pos} are too few for a record batch")
        magic = view[pos + MAGIC_OFFSET]
        if magic != CURRENT_MAGIC:
            if magic in (0, 1):
                raise RecordBatchError(
                    ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT,
                    f"magic v0/v1 not supported: message set with magic {magic} at position {pos}")
            raise _corrupt(f"unknown magic {magic - 256 if magic > 127 else magic} at position {pos}")
        batch_length = _INT32.unpack_from(view, pos + 8)[0]
        if batch_length < MIN_BATCH_LENGTH:
            raise _corrupt(f"batch length {batch_length} at position {pos} is below the minimum {MIN_BATCH_LENGTH}")
        size = LOG_OVERHEAD + batch_length
        if size > left:
            raise _corrupt(f"batch length {batch_length} at position {pos} runs past the {left} bytes left")
        batches.append((BatchHeader(*HEADER.unpack_from(view, pos)), view[pos:pos + size]))
        pos += size
    return batches


def assign_offsets(buf: bytearray, pos: int, base_offset: int) -> None:
    """Write the batch's baseOffset in place; the CRC does not cover it, so the batch stays valid."""
    _INT64.pack_into(buf, pos, base_offset)


def set_log_append_time(buf: bytearray, pos: int, timestamp_ms: int) -> None:
    """Mark the batch at pos as LogAppendTime with maxTimestamp = timestamp_ms, as Kafka's broker does for topics
    with message.timestamp.type=LogAppendTime; both fields are covered by the CRC, which is recomputed."""
    attributes = _INT16.unpack_from(buf, pos + CRC_START)[0] | TIMESTAMP_TYPE_MASK
    _INT16.pack_into(buf, pos + CRC_START, attributes)
    set_max_timestamp(buf, pos, timestamp_ms)


def set_max_timestamp(buf: bytearray, pos: int, timestamp_ms: int) -> None:
    """Write the batch's maxTimestamp in place and recompute the CRC, which covers it."""
    _INT64.pack_into(buf, pos + MAX_TIMESTAMP_OFFSET, timestamp_ms)
    _update_crc(buf, pos)


def clear_transactional(buf: bytearray, pos: int) -> None:
    """Make the (committed) transactional batch at pos a plain one, recomputing the CRC that covers attributes."""
    attributes = _INT16.unpack_from(buf, pos + CRC_START)[0] & ~TRANSACTIONAL_MASK
    _INT16.pack_into(buf, pos + CRC_START, attributes)
    _update_crc(buf, pos)


def _update_crc(buf: bytearray, pos: int) -> None:
    size = LOG_OVERHEAD + _INT32.unpack_from(buf, pos + 8)[0]
    _UINT32.pack_into(buf, pos + CRC_OFFSET, crc32c.crc32c(memoryview(buf)[pos + CRC_START:pos + size]))


# --- validation ---------------------------------------------------------------------------------------------------

class HeaderWatch(Protocol):
    """Reads the headers of each record that has some, in validation's walk, for a caller that wants some of them
    (protocol/sequence_headers.py): `scan` checks their framing as the walk would and returns where they end. Once
    `watching` is False (no later record can hold what it watches for), the walk skips the rest's headers itself.
    A batch none of whose headers has one of the `KEYS` is not shown to it (it would find nothing)."""

    KEYS: ClassVar[tuple[bytes, ...]]
    # True: KEYS are a name's key and a decimal id's, and `run` takes a batch each record of which holds one name and
    # the next id (the C walk hands it over as that, without an object per record).
    RUNS: ClassVar[bool]
    watching: bool

    @property
    def found(self) -> bool:
        """Whether any record held what it watches for."""

    def scan(self, data: bytes, pos: int, count: int, record_end: int, index: int) -> int:
        """Read record `index`'s `count` headers at `pos` (they must end at `record_end`); return where they end."""

    @classmethod
    def collected(cls, indexes: list[int], values: tuple[list[bytes], ...]) -> "HeaderWatch":
        """The watch as its scans would have left it, from what the C walk collected: the `indexes` of the records
        holding the keys, each of them once with a value that is not null, and the values of each of the `KEYS`."""

    @classmethod
    def run(cls, name: bytes, first: int, last: int) -> "HeaderWatch":
        """The watch for a batch (with RUNS) each of whose records holds both keys once: the name `name` in every
        one, the ids `first`..`last` in turn, as decimals of 1 to 18 ASCII digits."""


@dataclass(frozen=True, slots=True)
class WalkedRecords:
    """The records validate_batch walked: uncompressed `data`, where in it they `start`, and the watch that read
    their headers if it found what it watches for (None otherwise)."""

    data: BytesLike
    start: int
    headers: HeaderWatch | None = None


def validate_batch(header: BatchHeader, view: memoryview, *, deep: bool = True, from_client: bool = True,
                   max_decompressed_size: int = DEFAULT_MAX_SIZE,
                   watch: type[HeaderWatch] | None = None) -> WalkedRecords | None:
    """Raise RecordBatchError unless the batch is sound.

    Always: CRC32C, codec, record count against lastOffsetDelta, producer fields. deep=True also decompresses and
    walks every record's framing (without building objects), and returns the records it walked, for a caller that
    reads them too, with a HeaderWatch made by `watch` that read each record's headers in the same walk (records
    without headers cost it nothing). from_client=False relaxes the rules that hold only for batches as producers
    write them (offset deltas exactly 0..n-1, a true maxTimestamp), for batches the broker itself rewrote, as
    compaction or dropped duplicates do.
    """
    if len(view) != header.size:
        raise _corrupt(f"batch view holds {len(view)} bytes, its header declares {header.size}")
    computed = crc32c.crc32c(view[CRC_START:])
    if computed != header.crc:
        raise _corrupt(f"CRC mismatch: batch says {header.crc:#010x}, its bytes give {computed:#010x}")
    codec = header.attributes & COMPRESSION_MASK
    if codec not in CODEC_NAMES:
        raise RecordBatchError(ErrorCode.UNSUPPORTED_COMPRESSION_TYPE, f"unknown compression codec {codec}")
    _check_counts(header, from_client)
    _check_producer_fields(header)
    if codec == NONE:
        if header.records_count > (header.size - HEADER_SIZE) // MIN_RECORD_SIZE:
            raise _invalid(f"{header.records_count} records cannot fit in {header.size - HEADER_SIZE} bytes")
        if deep:
            return _walked(view, HEADER_SIZE, header, from_client, watch)
    elif deep:
        data = decompress(codec, view[HEADER_SIZE:], max_decompressed_size)
        if header.records_count > len(data) // MIN_RECORD_SIZE:
            raise _invalid(f"{header.records_count} records cannot fit in {len(data)} decompressed bytes")
        return _walked(data, 0, header, from_client, watch)
    return None


def _walked(data: BytesLike, start: int, header: BatchHeader, from_client: bool,
            watch: type[HeaderWatch] | None) -> WalkedRecords:
    if _fast_walk is not None and not header.is_control:
        # The C walk answers a sound batch none of whose headers is watched, or (walk_watched) whose records hold
        # each watched key once or none; anything else is walked again below, which raises the error (with its
        # message) or hands the headers to the watch.
        if watch is None:
            walked = _fast_walk(data, start, header.records_count, header.last_offset_delta, from_client, None)
        else:
            walked = _fast_walk_watched(data, start, header.records_count, header.last_offset_delta, from_client,
                                        watch.KEYS, watch.RUNS)
        if walked is not None:
            if isinstance(walked, int):
                _check_max_timestamp(header, from_client, walked)
                return WalkedRecords(data, start)
            _check_max_timestamp(header, from_client, walked[0])
            if len(walked) == 4:  # a run: (delta, name, first id, last id)
                return WalkedRecords(data, start, watch.run(*walked[1:]))
            return WalkedRecords(data, start, watch.collected(*walked[1:]))
    if isinstance(data, memoryview):
        data = bytes(data)  # bytes index faster than views
    headers = watch() if watch is not None else None
    max_ts_delta = _walk_records(data, start, header, from_client, headers=headers)
    if header.records_count:
        _check_max_timestamp(header, from_client, max_ts_delta)
    return WalkedRecords(data, start, headers if headers is not None and headers.found else None)


def record_spans(header: BatchHeader, data: BytesLike, start: int) -> list[tuple[int, int, int]]:
    """Each record of a batch validate_batch walked (its `data` and `start`) as (start, end, timestamp delta)."""
    spans: list[tuple[int, int, int]] = []
    _walk_records(data, start, header, False, spans=spans)
    return spans


def _check_counts(header: BatchHeader, from_client: bool) -> None:
    count = header.records_count
    if count < 0:
        raise _invalid(f"negative record count {count}")
    if from_client:
        # LogValidator.validateBatch: a producer's batch is non-empty and its offsets are 0..count-1.
        if count == 0:
            raise _invalid("batch has no records")
        if header.last_offset_delta != count - 1:
            raise _invalid(f"lastOffsetDelta {header.last_offset_delta} does not match {count} records")
    elif header.last_offset_delta < count - 1:
        raise _invalid(f"lastOffsetDelta {header.last_offset_delta} is too small for {count} records")
    if header.is_control and count != 1:
        raise _invalid(f"control batch holds {count} records, not 1")


def _check_producer_fields(header: BatchHeader) -> None:
    if header.has_producer_id:
        # LogValidator: an idempotent batch needs a sequence; control batches (markers) carry none.
        if header.base_sequence < 0 and not header.is_control:
            raise _invalid(f"batch of producer {header.producer_id} has invalid base sequence {header.base_sequence}")
    elif header.is_transactional:
        raise _invalid("transactional batch without a producer id")


def _walk_records(data: BytesLike, pos: int, header: BatchHeader, from_client: bool, *, spans: list | None = None,
                  headers: HeaderWatch | None = None) -> int:
    """Check the framing of every record in data[pos:] without building any object, and return the greatest
    timestamp delta; with `spans`, append each record's (start, end, timestamp delta) to it; with `headers`, have it
    read the headers of each record that has some. protocol/_accel.c has this walk in C, for the batches it is sure of.

    This runs for every produced batch, so one- and two-byte varints (nearly all of them) are decoded inline and
    longer ones go to decode_varint. Any overrun shows up as IndexError, turned into one error at the end.
    """
    start = pos
    end = len(data)
    count = header.records_count
    last_delta = header.last_offset_delta
    previous_delta = -1
    max_ts_delta = _BELOW_ANY_VARLONG
    index = 0
    try:
        for index in range(count):
            record_start = pos
            b = data[pos]
            if b < 0x80:
                length = (b >> 1) ^ -(b & 1)
                pos += 1
            elif data[pos + 1] < 0x80:
                b = (b & 0x7F) | (data[pos + 1] << 7)
                length = (b >> 1) ^ -(b & 1)
                pos += 2
            else:
                length, pos = decode_varint(data, pos, VARINT_MAX_BYTES)
            record_end = pos + length
            if length < MIN_RECORD_SIZE - 1 or record_end > end:
                raise _invalid(f"record {index} has length {length}, {end - pos} bytes remain")
            pos += 1  # record attributes: unused
            b = data[pos]
            if b < 0x80:
                ts_delta = (b >> 1) ^ -(b & 1)
                pos += 1
            elif data[pos + 1] < 0x80:
                b = (b & 0x7F) | (data[pos + 1] << 7)
                ts_delta = (b >> 1) ^ -(b & 1)
                pos += 2
            else:
                ts_delta, pos = decode_varint(data, pos, VARLONG_MAX_BYTES)
            if ts_delta > max_ts_delta:
                max_ts_delta = ts_delta
            b = data[pos]
            if b < 0x80:
                offset_delta = (b >> 1) ^ -(b & 1)
                pos += 1
            elif data[pos + 1] < 0x80:
                b = (b & 0x7F) | (data[pos + 1] << 7)
                offset_delta = (b >> 1) ^ -(b & 1)
                pos += 2
            else:
                offset_delta, pos = decode_varint(data, pos, VARINT_MAX_BYTES)
            if from_client:
                if offset_delta != index:
                    raise _invalid(f"record {index} has offset delta {offset_delta}")
            elif offset_delta <= previous_delta or offset_delta > last_delta:
                raise _invalid(f"record {index} has offset delta {offset_delta} after {previous_delta}")
            previous_delta = offset_delta
            b = data[pos]
            if b < 0x80:
                key_len = (b >> 1) ^ -(b & 1)
                pos += 1
            elif data[pos + 1] < 0x80:
                b = (b & 0x7F) | (data[pos + 1] << 7)
                key_len = (b >> 1) ^ -(b & 1)
                pos += 2
            else:
                key_len, pos = decode_varint(data, pos, VARINT_MAX_BYTES)
            if key_len > 0:
                pos += key_len
            elif key_len < -1:
                raise _invalid(f"record {index} has key length {key_len}")
            b = data[pos]
            if b < 0x80:
                value_len = (b >> 1) ^ -(b & 1)
                pos += 1
            elif data[pos + 1] < 0x80:
                b = (b & 0x7F) | (data[pos + 1] << 7)
                value_len = (b >> 1) ^ -(b & 1)
                pos += 2
            else:
                value_len, pos = decode_varint(data, pos, VARINT_MAX_BYTES)
            if value_len > 0:
                pos += value_len
            elif value_len < -1:
                raise _invalid(f"record {index} has value length {value_len}")
            b = data[pos]
            if b < 0x80:
                header_count = (b >> 1) ^ -(b & 1)
                pos += 1
            elif data[pos + 1] < 0x80:
                b = (b & 0x7F) | (data[pos + 1] << 7)
                header_count = (b >> 1) ^ -(b & 1)
                pos += 2
            else:
                header_count, pos = decode_varint(data, pos, VARINT_MAX_BYTES)
            if header_count:
                # Each header takes at least two bytes; a bigger count is a lie we need not loop over.
                if header_count < 0 or header_count > (record_end - pos) // 2:
                    raise _invalid(f"record {index} has header count {header_count}")
                if headers is None:
                    pos = _skip_headers(data, pos, header_count, index)
                else:
                    pos = headers.scan(data, pos, header_count, record_end, index)
                    if not headers.watching:
                        headers = None
            if pos != record_end:
                raise _invalid(f"record {index} declares {length} bytes but its fields take {length + pos - record_end}")
            if spans is not None:
                spans.append((record_start, record_end, ts_delta))
    except IndexError:
        raise _invalid(f"records end inside record {index} of {count}") from None
    except VarintError as e:
        raise _invalid(f"record {index}: {e}") from None
    if pos != end:
        raise _invalid(f"{end - pos} bytes follow the last of {count} records")
    if header.is_control:
        _check_control_key(data, start, header)
    return max_ts_delta


def _check_max_timestamp(header: BatchHeader, from_client: bool, max_ts_delta: int) -> None:
    if from_client and header.timestamp_type == CREATE_TIME:
        # We store batches as they are, and time lookups and retention read maxTimestamp: it must be true.
        max_timestamp = header.base_timestamp + max_ts_delta
        if max_timestamp != header.max_timestamp:
            raise FalseMaxTimestamp(f"maxTimestamp {header.max_timestamp} is not the records' greatest, "
                                    f"{max_timestamp}", max_timestamp)


def _skip_headers(data: bytes, pos: int, count: int, index: int) -> int:
    for _ in range(count):
        b = data[pos]  # header key length: short keys are the rule, so one byte inline
        if b < 0x80:
            key_len = (b >> 1) ^ -(b & 1)
            pos += 1
        else:
            key_len, pos = decode_varint(data, pos, VARINT_MAX_BYTES)
        if key_len < 0:
            raise _invalid(f"record {index} has a header key of length {key_len}")
        pos += key_len
        b = data[pos]
        if b < 0x80:
            value_len = (b >> 1) ^ -(b & 1)
            pos += 1
        else:
            value_len, pos = decode_varint(data, pos, VARINT_MAX_BYTES)
        if value_len > 0:
            pos += value_len
        elif value_len < -1:
            raise _invalid(f"record {index} has a header value of length {value_len}")
    return pos


def _check_control_key(data: BytesLike, start: int, header: BatchHeader) -> None:
    record = next(_decode_records(data, start, header))
    if record.key is None or len(record.key) < _CONTROL_KEY.size:
        raise _invalid("control record key is shorter than its 4-byte version and type")


# --- reading records ----------------------------------------------------------------------------------------------

def iter_records(view: BytesLike, *, max_decompressed_size: int = DEFAULT_MAX_SIZE) -> Iterator[Record]:
    """Decode the records of one batch (the batch's full bytes). Checks structure, not the CRC: run validate_batch
    first on bytes that did not come from our own store."""
    batches = split_batches(view)
    if len(batches) != 1:
        raise _corrupt(f"expected one record batch, found {len(batches)}")
    header, view = batches[0]
    body = view[HEADER_SIZE:header.size]
    if header.compression != NONE:
        body = decompress(header.compression, body, max_decompressed_size)
    return _decode_records(body, 0, header)


def _decode_records(data: BytesLike, pos: int, header: BatchHeader) -> Iterator[Record]:
    base_offset = header.base_offset
    log_append_time = header.timestamp_type == LOG_APPEND_TIME
    end = len(data)
    for index in range(header.records_count):
        try:
            length, pos = decode_varint(data, pos, VARINT_MAX_BYTES)
            record_end = pos + length
            pos += 1  # attributes
            ts_delta, pos = decode_varint(data, pos, VARLONG_MAX_BYTES)
            offset_delta, pos = decode_varint(data, pos, VARINT_MAX_BYTES)
            key, pos = _read_bytes(data, pos)
            value, pos = _read_bytes(data, pos)
            header_count, pos = decode_varint(data, pos, VARINT_MAX_BYTES)
            if header_count < 0 or header_count > (record_end - pos) // 2:
                raise _invalid(f"record {index} has header count {header_count}")
            headers = []
            for _ in range(header_count):
                name, pos = _read_bytes(data, pos)
                if name is None:
                    raise _invalid(f"record {index} has a null header key")
                header_value, pos = _read_bytes(data, pos)
                headers.append((name.decode("utf-8", "surrogateescape"), header_value))
        except IndexError:
            raise _invalid(f"records end inside record {index}") from None
        except VarintError as e:
            raise _invalid(f"record {index}: {e}") from None
        if pos != record_end or pos > end:
            raise _invalid(f"record {index} declares {length} bytes but its fields take {length + pos - record_end}")
        timestamp = header.max_timestamp if log_append_time else header.base_timestamp + ts_delta
        yield Record(base_offset + offset_delta, timestamp, key, value, tuple(headers))


def _read_bytes(data: BytesLike, pos: int) -> tuple[bytes | None, int]:
    length, pos = decode_varint(data, pos, VARINT_MAX_BYTES)
    if length < 0:
        if length != -1:
            raise _invalid(f"field length {length}")
        return None, pos
    end = pos + length
    if end > len(data):
        raise IndexError("field runs past the data")
    return bytes(data[pos:end]), end


def control_marker(record: Record) -> ControlMarker:
    """Read the transaction marker a control record carries (key: version, type; value: version, epoch)."""
    if record.key is None or len(record.key) < _CONTROL_KEY.size:
        raise _invalid("control record key is shorter than its 4-byte version and type")
    _, marker_type = _CONTROL_KEY.unpack_from(record.key)
    if marker_type not in (CONTROL_ABORT, CONTROL_COMMIT):
        raise _invalid(f"control record type {marker_type} is not a transaction marker")
    if record.value is None or len(record.value) < _TXN_MARKER_VALUE.size:
        raise _invalid("transaction marker value is shorter than its version and coordinator epoch")
    _, coordinator_epoch = _TXN_MARKER_VALUE.unpack_from(record.value)
    return ControlMarker(commit=marker_type == CONTROL_COMMIT, coordinator_epoch=coordinator_epoch)


# --- building -----------------------------------------------------------------------------------------------------

def build_batch(records: Sequence[Record], *, base_offset: int = 0, producer_id: int = NO_PRODUCER_ID,
                producer_epoch: int = NO_PRODUCER_EPOCH, base_sequence: int = NO_SEQUENCE,
                transactional: bool = False, control: bool = False, compression: int = NONE,
                timestamp_type: int = CREATE_TIME, max_timestamp: int | None = None,
                last_offset_delta: int | None = None,
                partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH) -> bytes:
    """Encode a v2 batch. Each record's offset delta is `record.offset - base_offset` and must increase; the
    first record's timestamp is the base timestamp. `last_offset_delta` defaults to the last record's delta (give
    it to keep a hole at the end, as compaction does); `max_timestamp` defaults to the greatest record timestamp
    (give it for LOG_APPEND_TIME). The codec is always applied, even when it does not shrink the records."""
    if not records and last_offset_delta is None:
        raise ValueError("an empty batch needs an explicit last_offset_delta")
    if compression not in CODEC_NAMES:
        raise ValueError(f"unknown compression codec {compression}")
    base_timestamp = records[0].timestamp if records else -1
    body = bytearray()
    previous_delta = -1
    for record in records:
        offset_delta = record.offset - base_offset
        if offset_delta <= previous_delta:
            raise ValueError(f"record offset {record.offset} does not follow {base_offset + previous_delta}")
        previous_delta = offset_delta
        _encode_record(body, offset_delta, record.timestamp - base_timestamp, record)
    if last_offset_delta is None:
        last_offset_delta = previous_delta
    elif last_offset_delta < previous_delta:
        raise ValueError(f"last_offset_delta {last_offset_delta} is below the last record's {previous_delta}")
    if max_timestamp is None:
        max_timestamp = max((r.timestamp for r in records), default=-1)
    if compression != NONE:
        body = compress(compression, body)
    attributes = compression
    if timestamp_type == LOG_APPEND_TIME:
        attributes |= TIMESTAMP_TYPE_MASK
    if transactional:
        attributes |= TRANSACTIONAL_MASK
    if control:
        attributes |= CONTROL_MASK
    batch = bytearray(HEADER_SIZE)
    batch += body
    HEADER.pack_into(batch, 0, base_offset, len(batch) - LOG_OVERHEAD, partition_leader_epoch, CURRENT_MAGIC, 0,
                     attributes, last_offset_delta, base_timestamp, max_timestamp, producer_id, producer_epoch,
                     base_sequence, len(records))
    struct.pack_into(">I", batch, CRC_OFFSET, crc32c.crc32c(memoryview(batch)[CRC_START:]))
    return bytes(batch)


def keep_records(header: BatchHeader, records: BytesLike, spans: Sequence[tuple[int, int]],
                 max_timestamp: int) -> bytes:
    """The batch with only the records whose bytes are at `spans` of its uncompressed `records`, as Kafka's log
    cleaner rewrites a batch: the same base offset and lastOffsetDelta (dropped records leave holes in the offsets
    and the records kept keep theirs), the same producer fields, attributes and codec; the record count,
    `max_timestamp` and the CRC follow what is kept. No spans: an empty batch, which keeps its offsets and producer
    sequence numbers taken; it is uncompressed, as Kafka writes one (a codec's frame of nothing trips clients)."""
    body = b"".join(records[start:end] for start, end in spans)
    attributes = header.attributes
    if not spans:
        attributes &= ~COMPRESSION_MASK
    elif header.compression != NONE:
        body = compress(header.compression, body)
    batch = bytearray(HEADER_SIZE)
    batch += body
    HEADER.pack_into(batch, 0, header.base_offset, len(batch) - LOG_OVERHEAD, header.partition_leader_epoch,
                     CURRENT_MAGIC, 0, attributes, header.last_offset_delta, header.base_timestamp,
                     max_timestamp, header.producer_id, header.producer_epoch, header.base_sequence, len(spans))
    _UINT32.pack_into(batch, CRC_OFFSET, crc32c.crc32c(memoryview(batch)[CRC_START:]))
    return bytes(batch)


def _encode_record(out: bytearray, offset_delta: int, timestamp_delta: int, record: Record) -> None:
    body = bytearray(b"\x00")  # attributes
    encode_varint(timestamp_delta, body)
    encode_varint(offset_delta, body)
    _write_bytes(body, record.key)
    _write_bytes(body, record.value)
    encode_varint(len(record.headers), body)
    for name, header_value in record.headers:
        _write_bytes(body, name.encode("utf-8", "surrogateescape"))
        _write_bytes(body, header_value)
    encode_varint(len(body), out)
    out += body


def _write_bytes(out: bytearray, value: bytes | None) -> None:
    if value is None:
        encode_varint(-1, out)
    else:
        encode_varint(len(value), out)
        out += value


def build_marker_batch(marker_type: int, payload: bytes) -> bytes:
    """A kop marker (PIP-33) as a record batch: a control batch of one record whose key holds the marker type and
    whose value holds the marker, without a timestamp (-1), so no ListOffsets by time can land on it. It is stored
    in an entry that covers no offset and is never served to a Kafka client."""
    record = Record(offset=0, timestamp=-1, key=_CONTROL_KEY.pack(0, marker_type), value=payload)
    return build_batch([record], control=True)


def marker_payload(view: BytesLike) -> tuple[int, bytes]:
    """The marker type and marker of a batch built by build_marker_batch."""
    record = next(iter_records(view))
    return _CONTROL_KEY.unpack_from(record.key)[1], record.value or b""


def build_control_batch(*, base_offset: int, producer_id: int, producer_epoch: int, commit: bool,
                        coordinator_epoch: int, timestamp_ms: int,
                        partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH) -> bytes:
    """Encode the transaction marker batch Kafka writes when a transaction commits or aborts."""
    marker = Record(
        offset=base_offset,
        timestamp=timestamp_ms,
        key=_CONTROL_KEY.pack(0, CONTROL_COMMIT if commit else CONTROL_ABORT),
        value=_TXN_MARKER_VALUE.pack(0, coordinator_epoch),
    )
    return build_batch([marker], base_offset=base_offset, producer_id=producer_id, producer_epoch=producer_epoch,
                       transactional=True, control=True, partition_leader_epoch=partition_leader_epoch)
