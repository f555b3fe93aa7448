"""Application-chosen sequence ids, as records carry them: the headers `kop.producer.name` (UTF-8, 1-256 bytes) and
`kop.sequence.id` (a decimal ASCII int64 >= 0), both or neither on each record.

Validation finds them: `validate_batch(..., watch=SEQUENCE_HEADER_KEYS)` notes where each record keeps their values,
in the walk it makes over the records anyway, and only for a batch whose bytes contain one of the keys (a byte
search): a batch without them pays nothing more. `sequenced_records` then reads each record's pair. A record with
one header but not the other, a name that is empty, too long or not UTF-8, or an id that is not a decimal int64 >= 0
makes the whole batch INVALID_RECORD, with a message that names the header.
"""
from protocol.compression import BytesLike, RecordBatchError
from protocol.errors import ErrorCode

PRODUCER_NAME_HEADER = "kop.producer.name"
SEQUENCE_ID_HEADER = "kop.sequence.id"
MAX_PRODUCER_NAME_BYTES = 256
MAX_SEQUENCE_ID = 2**63 - 1

_NAME_KEY = PRODUCER_NAME_HEADER.encode()
_SEQUENCE_KEY = SEQUENCE_ID_HEADER.encode()
SEQUENCE_HEADER_KEYS = frozenset({_NAME_KEY, _SEQUENCE_KEY})
_SHOWN = 40  # bytes of a bad header value quoted in the error message
_ABSENT = (None, None)


def sequenced_records(data: BytesLike,
                      scanned: list[tuple[int, int, int, dict | None]]) -> list[tuple[str | None, int | None]]:
    """(producer name, sequence id) of each record validation scanned for SEQUENCE_HEADER_KEYS, in order; (None,
    None) for a record without them. Runs for every record of such a batch: the common shapes go first."""
    out = []
    append = out.append
    names: dict[bytes, str] = {}  # a batch's records mostly share a name or a few: decode and check each once
    for index, (_start, _end, _delta, found) in enumerate(scanned):
        if found is None:
            append(_ABSENT)
            continue
        name_span, id_span = found.get(_NAME_KEY, _ABSENT), found.get(_SEQUENCE_KEY, _ABSENT)
        if name_span is None or id_span is None or name_span is _ABSENT or id_span is _ABSENT:
            raise _missing_or_twice(index, name_span, id_span)
        raw_name = data[name_span[0]:name_span[1]]
        name = names.get(raw_name)
        if name is None:
            name = names[raw_name] = _producer_name(index, bytes(raw_name))
        raw_id = data[id_span[0]:id_span[1]]
        if raw_id.isdigit() and len(raw_id) < 19:  # ASCII digits only (bytes), and within int64 for sure
            append((name, int(raw_id)))
        else:
            append((name, _sequence_id(index, bytes(raw_id))))
    return out


def _missing_or_twice(index: int, name_span, id_span) -> RecordBatchError:
    if name_span is None or id_span is None:
        return _bad(index, PRODUCER_NAME_HEADER if name_span is None else SEQUENCE_ID_HEADER, "appears twice")
    if name_span is _ABSENT:
        return _bad(index, SEQUENCE_ID_HEADER, f"comes without {PRODUCER_NAME_HEADER}")
    return _bad(index, PRODUCER_NAME_HEADER, f"comes without {SEQUENCE_ID_HEADER}")


def _producer_name(index: int, raw: bytes) -> str:
    if not raw:
        raise _bad(index, PRODUCER_NAME_HEADER, "is empty")
    if len(raw) > MAX_PRODUCER_NAME_BYTES:
        raise _bad(index, PRODUCER_NAME_HEADER, f"has {len(raw)} bytes, more than {MAX_PRODUCER_NAME_BYTES}")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _bad(index, PRODUCER_NAME_HEADER, f"is not UTF-8: {raw[:_SHOWN]!r}") from None


def _sequence_id(index: int, raw: bytes) -> int:
    if not raw.isdigit() or not raw.isascii():
        raise _bad(index, SEQUENCE_ID_HEADER, f"must be a decimal ASCII integer >= 0, got {raw[:_SHOWN]!r}")
    value = int(raw)
    if value > MAX_SEQUENCE_ID:
        raise _bad(index, SEQUENCE_ID_HEADER, f"{value} is beyond int64")
    return value


def _bad(index: int, header: str, problem: str) -> RecordBatchError:
    return RecordBatchError(ErrorCode.INVALID_RECORD, f"record {index}: header {header} {problem}")
