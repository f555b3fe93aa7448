"""Application-chosen sequence ids, as records carry them: the headers `kop.producer.name` (UTF-8, 1-256 bytes) and
`kop.sequence.id` (a decimal ASCII int64 >= 0), both or neither on each record.

`has_sequence_headers` is the cheap test every produced batch takes (a byte search over records already in memory);
`read_sequence_headers` reads each record's pair, and where it sits, only for a batch that may carry them. A record
with one header but not the other, a name that is empty, too long or not UTF-8, or an id that is not a decimal int64
>= 0 makes the whole batch INVALID_RECORD, with a message that names the header.
"""
from dataclasses import dataclass

from protocol.compression import BytesLike, RecordBatchError
from protocol.errors import ErrorCode
from protocol.records import BatchHeader
from protocol.varint import VARINT_MAX_BYTES, VARLONG_MAX_BYTES, VarintError, decode_varint

PRODUCER_NAME_HEADER = "kop.producer.name"
SEQUENCE_ID_HEADER = "kop.sequence.id"
MAX_PRODUCER_NAME_BYTES = 256
MAX_SEQUENCE_ID = 2**63 - 1

_NAME_KEY = PRODUCER_NAME_HEADER.encode()
_SEQUENCE_KEY = SEQUENCE_ID_HEADER.encode()
_SHOWN = 40  # bytes of a bad header value quoted in the error message


@dataclass(frozen=True, slots=True)
class SequencedRecord:
    """One record of a batch: where its bytes are in the records data, its timestamp delta, and its producer name
    and sequence id (None, None for a record without the headers)."""

    start: int
    end: int
    timestamp_delta: int
    producer_name: str | None
    sequence_id: int | None


def has_sequence_headers(records: BytesLike) -> bool:
    """Whether any record of these (uncompressed) records may carry a sequence id: False means none does."""
    return _SEQUENCE_KEY in records or _NAME_KEY in records


def read_sequence_headers(header: BatchHeader, records: BytesLike, pos: int = 0) -> list[SequencedRecord]:
    """Every record of a batch whose framing is already validated (`records[pos:]`, uncompressed), in order."""
    out = []
    for index in range(header.records_count):
        record_start = pos
        try:
            length, pos = decode_varint(records, pos, VARINT_MAX_BYTES)
            record_end = pos + length
            pos += 1  # attributes
            ts_delta, pos = decode_varint(records, pos, VARLONG_MAX_BYTES)
            _offset_delta, pos = decode_varint(records, pos, VARINT_MAX_BYTES)
            pos = _skip_bytes(records, pos)  # key
            pos = _skip_bytes(records, pos)  # value
            count, pos = decode_varint(records, pos, VARINT_MAX_BYTES)
            name = sequence = None
            for _ in range(count):
                key_start, key_end, pos = _span(records, pos)
                value_start, value_end, pos = _span(records, pos)
                key = records[key_start:key_end]
                if key == _NAME_KEY:
                    name = _once(name, index, PRODUCER_NAME_HEADER, records, value_start, value_end)
                elif key == _SEQUENCE_KEY:
                    sequence = _once(sequence, index, SEQUENCE_ID_HEADER, records, value_start, value_end)
        except (IndexError, VarintError) as exc:  # validated before: only a caller's mistake gets here
            raise RecordBatchError(ErrorCode.INVALID_RECORD, f"record {index}: {exc}") from None
        if name is None and sequence is None:
            out.append(SequencedRecord(record_start, record_end, ts_delta, None, None))
        else:
            out.append(SequencedRecord(record_start, record_end, ts_delta, _producer_name(index, name),
                                       _sequence_id(index, sequence)))
        pos = record_end
    return out


def _once(seen, index: int, header: str, records: BytesLike, start: int, end: int):
    if seen is not None:
        raise _bad(index, header, "appears twice")
    return b"" if start < 0 else bytes(records[start:end])  # a null value is "" for the checks below


def _producer_name(index: int, raw: bytes | None) -> str:
    if raw is None:
        raise _bad(index, SEQUENCE_ID_HEADER, f"comes without {PRODUCER_NAME_HEADER}")
    if not raw:
        raise _bad(index, PRODUCER_NAME_HEADER, "is empty")
    if len(raw) > MAX_PRODUCER_NAME_BYTES:
        raise _bad(index, PRODUCER_NAME_HEADER, f"has {len(raw)} bytes, more than {MAX_PRODUCER_NAME_BYTES}")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _bad(index, PRODUCER_NAME_HEADER, f"is not UTF-8: {raw[:_SHOWN]!r}") from None


def _sequence_id(index: int, raw: bytes | None) -> int:
    if raw is None:
        raise _bad(index, PRODUCER_NAME_HEADER, f"comes without {SEQUENCE_ID_HEADER}")
    if not raw.isdigit() or not raw.isascii():
        raise _bad(index, SEQUENCE_ID_HEADER, f"must be a decimal ASCII integer >= 0, got {raw[:_SHOWN]!r}")
    value = int(raw)
    if value > MAX_SEQUENCE_ID:
        raise _bad(index, SEQUENCE_ID_HEADER, f"{value} is beyond int64")
    return value


def _bad(index: int, header: str, problem: str) -> RecordBatchError:
    return RecordBatchError(ErrorCode.INVALID_RECORD, f"record {index}: header {header} {problem}")


def _span(data: BytesLike, pos: int) -> tuple[int, int, int]:
    """(start, end, next position) of a length-prefixed field; start -1 for a null one."""
    length, pos = decode_varint(data, pos, VARINT_MAX_BYTES)
    if length < 0:
        return -1, -1, pos
    if pos + length > len(data):
        raise IndexError("a header runs past the records")
    return pos, pos + length, pos + length


def _skip_bytes(data: BytesLike, pos: int) -> int:
    length, pos = decode_varint(data, pos, VARINT_MAX_BYTES)
    return pos + length if length > 0 else pos

