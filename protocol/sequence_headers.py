"""Application-chosen sequence ids, as records carry them: the headers `kop.producer.name` (UTF-8, 1-256 bytes) and
`kop.sequence.id` (a decimal ASCII int64 >= 0), both or neither on each record.

Validation finds them: `validate_batch(..., watch=SequenceHeaderScan)` hands a `SequenceHeaderScan` the headers of
each record that has some, in the walk it makes over the records anyway: records without headers cost nothing more.
A producer's records mostly share one shape, `[name, id]` with the same name, so the scan reads a record of that
shape as its bytes up to the id's value (one comparison) and the id, any `[name, id]` record with three, and any
other header by header (only keys of our keys' length and first byte are compared: foreign headers cost little).
Where protocol/_accel.c is built, the C walk reads the values itself when every record holding either header holds
both once with a value (`SequenceHeaderScan.collected`), and the scan runs only for the other batches. A producer's
usual batch, every record with the same name and the next id, it hands over as a run (`SequenceHeaderScan.run`: the
name, the first and the last id), with no object per record, and `sequenced_records` checks the name once.
`sequenced_records` checks and converts the values of any other batch at once. A record with one header but
not the other, a name that is empty, too long or not UTF-8, or an id that is not a decimal int64 >= 0 makes the
whole batch INVALID_RECORD, with a message that names the header and the first record at fault.
"""
from collections.abc import Sequence
from dataclasses import dataclass

from dedup.named_sequences import strictly_rising  # the rule is the dedup core's: a producer's ids rise
from protocol.compression import BytesLike, RecordBatchError
from protocol.errors import ErrorCode
from protocol.varint import VARINT_MAX_BYTES, decode_varint

try:  # protocol/_accel.c, where it is built; `_decimal_ids` below is the same in Python
    from protocol._accel import decimal_ids as _fast_decimal_ids
except ImportError:
    _fast_decimal_ids = None

PRODUCER_NAME_HEADER = "kop.producer.name"
SEQUENCE_ID_HEADER = "kop.sequence.id"
MAX_PRODUCER_NAME_BYTES = 256
MAX_SEQUENCE_ID = 2**63 - 1

_NAME_KEY = PRODUCER_NAME_HEADER.encode()
_SEQUENCE_KEY = SEQUENCE_ID_HEADER.encode()
_NAME_LENGTH, _SEQUENCE_LENGTH = len(_NAME_KEY), len(_SEQUENCE_KEY)
_KEYS_FIRST_BYTE = ord("k")  # a cheap test before comparing a key
# Each header as the wire frames it when its key's length takes one byte (zigzag: 2 * length), as both do.
_NAME_FIELD = bytes([_NAME_LENGTH << 1]) + _NAME_KEY
_SEQUENCE_FIELD = bytes([_SEQUENCE_LENGTH << 1]) + _SEQUENCE_KEY
_NAME_FIELD_SIZE, _SEQUENCE_FIELD_SIZE = len(_NAME_FIELD), len(_SEQUENCE_FIELD)
_SHOWN = 40  # bytes of a bad header value quoted in the error message
_SURE_DIGITS = 18  # an id of at most this many digits is within int64
_ONE_BYTE_LENGTH = 64  # value lengths below this take one varint byte (zigzag: 2 * length)


class _Missing:
    """A header value that is not there (`ABSENT`) or is there twice (`TWICE`): the batch is refused."""

    __slots__ = ("what",)

    def __init__(self, what: str) -> None:
        self.what = what

    def __repr__(self) -> str:
        return self.what


ABSENT = _Missing("absent")
TWICE = _Missing("twice")


class SequenceHeaderScan:
    """A HeaderWatch (protocol/records.py) for the two headers: for each record that carries either, its index and
    the raw values (bytes; a null value as b""; ABSENT or TWICE), in order; or, for a batch the C walk read as a run
    (`run`), that run (raw name, first id, last id), every record's index, and no values listed."""

    __slots__ = ("indexes", "names", "ids", "malformed", "run_read", "watching", "_searched", "_shape", "_shape_name")
    KEYS = (_NAME_KEY, _SEQUENCE_KEY)
    RUNS = True

    def __init__(self) -> None:
        self.watching = True  # False: no later record holds either key (the walk then skips their headers)
        self.run_read: tuple[bytes, int, int] | None = None
        self.indexes: list[int] | range = []  # a range for a run
        self.names: list[bytes | _Missing] = []
        self.ids: list[bytes | _Missing] = []
        self.malformed = False  # some record has a header missing or twice
        self._searched = False  # the bytes after a record with other headers were searched for the keys
        # The bytes of the last `[name, id]` record's headers up to the id's value (name key, name, id key) and
        # its name: a record whose headers start with them holds the same name, and its id runs to its end.
        self._shape: bytes | None = None
        self._shape_name = b""

    @classmethod
    def collected(cls, indexes: list[int], values: tuple[list[bytes], ...]) -> "SequenceHeaderScan":
        scan = cls()
        scan.indexes, (scan.names, scan.ids) = indexes, values
        return scan

    @classmethod
    def run(cls, name: bytes, first: int, last: int) -> "SequenceHeaderScan":
        scan = cls()
        scan.run_read, scan.indexes = (name, first, last), range(last - first + 1)
        return scan

    @property
    def found(self) -> bool:
        return bool(self.indexes)

    def scan(self, data: bytes, pos: int, count: int, record_end: int, index: int) -> int:
        if count == 2:
            shape = self._shape
            if shape is not None and data.startswith(shape, pos):  # [name, id], the name of the record before
                id_start = pos + len(shape) + 1
                length = record_end - id_start
                if 0 <= length < _ONE_BYTE_LENGTH and data[id_start - 1] == length << 1:
                    self.indexes.append(index)
                    self.names.append(self._shape_name)
                    self.ids.append(data[id_start:record_end])
                    return record_end
            # [name, id] with any name, its length in one byte?
            if data[pos + 1] == _KEYS_FIRST_BYTE and data.startswith(_NAME_FIELD, pos):
                b = data[pos + _NAME_FIELD_SIZE]
                name_end = pos + _NAME_FIELD_SIZE + 1 + (b >> 1)
                if b < 0x80 and not b & 1 and data.startswith(_SEQUENCE_FIELD, name_end):
                    id_start = name_end + _SEQUENCE_FIELD_SIZE + 1
                    length = record_end - id_start
                    if 0 <= length < _ONE_BYTE_LENGTH and data[id_start - 1] == length << 1:
                        name = data[pos + _NAME_FIELD_SIZE + 1:name_end]
                        self.indexes.append(index)
                        self.names.append(name)
                        self.ids.append(data[id_start:record_end])
                        if shape is None:
                            self._shape, self._shape_name = data[pos:id_start - 1], name
                        return record_end
        # One by one, framing checked as the walk in records.py checks it (one-byte lengths inline: the rule). A key is
        # compared only when its length and first byte are those of one of ours: foreign headers cost little.
        name: bytes | _Missing = ABSENT
        sequence_id: bytes | _Missing = ABSENT
        found = False
        for _ in range(count):
            b = data[pos]
            if b < 0x80:
                key_len = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                key_len, pos = decode_varint(data, pos, VARINT_MAX_BYTES)
            if key_len < 0:
                raise _invalid(f"record {index} has a header key of length {key_len}")
            ours = 0  # 1: the name, 2: the id
            if key_len == _NAME_LENGTH:
                if data[pos] == _KEYS_FIRST_BYTE and data.startswith(_NAME_KEY, pos):
                    ours = 1
            elif key_len == _SEQUENCE_LENGTH and data[pos] == _KEYS_FIRST_BYTE and data.startswith(_SEQUENCE_KEY, pos):
                ours = 2
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
            if ours:
                found = True
                value = data[pos - value_len:pos] if value_len > 0 else b""  # a null value as empty
                if ours == 1:
                    name = value if name is ABSENT else TWICE
                else:
                    sequence_id = value if sequence_id is ABSENT else TWICE
        if found:
            self.indexes.append(index)
            self.names.append(name)
            self.ids.append(sequence_id)
            if isinstance(name, _Missing) or isinstance(sequence_id, _Missing):
                self.malformed = True
        elif not self._searched:
            # The first record with other headers (of a batch that may hold only such): if neither key is in the
            # bytes after it (one search per batch), no later record holds them and the walk need not call us again.
            self._searched = True
            self.watching = data.find(_NAME_KEY, pos) >= 0 or data.find(_SEQUENCE_KEY, pos) >= 0
        return pos


@dataclass(slots=True)  # not frozen: built per batch, and a frozen dataclass costs ~3.5x to build
class SequencedRecords:
    """The records of a batch that carry the headers: their indexes in the batch, names and ids, in order; `name`
    when they all carry one name (the rule for a producer's batch), else None; `rising`: whether the ids rise
    strictly (None: not known). A run's indexes and ids are ranges."""

    indexes: Sequence[int]
    names: list[str]
    ids: Sequence[int]
    name: str | None
    rising: bool | None = None


def sequenced_records(scan: SequenceHeaderScan) -> SequencedRecords:
    """Check and convert what the scan found, the whole batch at once; raise RecordBatchError (INVALID_RECORD) for
    the first record at fault."""
    if scan.run_read is not None:  # one name, the ids first..last, one per record: valid but for the name
        raw_name, first, last = scan.run_read
        name = run_producer_name(raw_name)
        return SequencedRecords(scan.indexes, [name] * len(scan.indexes), range(first, last + 1), name, True)
    raw_names, raw_ids = scan.names, scan.ids
    names: dict[bytes, str] = {}
    distinct = set(raw_names)
    if not scan.malformed:
        for raw in distinct:
            decoded = _valid_name(raw)
            if decoded is None:
                break
            names[raw] = decoded
    read = None if scan.malformed or len(names) < len(distinct) else decimal_ids(raw_ids)
    if read is None:
        return _checked_one_by_one(scan)
    ids, rising = read
    if len(names) == 1:
        [name] = names.values()
        return SequencedRecords(scan.indexes, [name] * len(ids), ids, name, rising)
    return SequencedRecords(scan.indexes, [names[raw] for raw in raw_names], ids, None, rising)


def decimal_ids(raw_ids: list[bytes]) -> tuple[list[int], bool] | None:
    """The ids, and whether they rise strictly, when each is 1 to 18 ASCII digits (within int64); else None."""
    if _fast_decimal_ids is not None:
        return _fast_decimal_ids(raw_ids)
    return _decimal_ids(raw_ids)


def _decimal_ids(raw_ids: list[bytes]) -> tuple[list[int], bool] | None:
    if not all(map(bytes.isdigit, raw_ids)) or (raw_ids and max(map(len, raw_ids)) > _SURE_DIGITS):
        return None
    ids = list(map(int, raw_ids))  # ASCII digits only (bytes.isdigit), within int64
    return ids, strictly_rising(ids)


def consecutive_run(scan: SequenceHeaderScan, count: int) -> tuple[bytes, int, int] | None:
    """The run a batch of `count` records is, from what the Python scan found: (name, first id, last id) when each
    record holds the name `name` and the next id, a decimal of 1 to 18 ASCII digits; else None. The Python twin of
    the C walk's runs (walk_watched with runs, protocol/_accel.c), which leaves null values to the Python walk."""
    raw_names, raw_ids = scan.names, scan.ids
    if count == 0 or len(scan.indexes) != count or scan.malformed:
        return None
    name = raw_names[0]
    if raw_names.count(name) != count:
        return None
    read = _decimal_ids(raw_ids)  # all bytes: not malformed
    if read is None:
        return None
    ids, _ = read
    first, last = ids[0], ids[-1]
    if last - first != count - 1 or ids != list(range(first, last + 1)):
        return None
    return name, first, last


def _checked_one_by_one(scan: SequenceHeaderScan) -> SequencedRecords:
    """Record by record, so that the error names the first record at fault."""
    names: list[str] = []
    ids: list[int] = []
    for index, raw_name, raw_id in zip(scan.indexes, scan.names, scan.ids):
        if isinstance(raw_name, _Missing) or isinstance(raw_id, _Missing):
            raise _missing_or_twice(index, raw_name, raw_id)
        names.append(_producer_name(index, raw_name))
        ids.append(_sequence_id(index, raw_id))
    distinct = set(names)
    return SequencedRecords(scan.indexes, names, ids, names[0] if len(distinct) == 1 else None, strictly_rising(ids))


def _missing_or_twice(index: int, name: bytes | _Missing, sequence_id: bytes | _Missing) -> RecordBatchError:
    if name is TWICE or sequence_id is TWICE:
        return _bad(index, PRODUCER_NAME_HEADER if name is TWICE else SEQUENCE_ID_HEADER, "appears twice")
    if name is ABSENT:
        return _bad(index, SEQUENCE_ID_HEADER, f"comes without {PRODUCER_NAME_HEADER}")
    return _bad(index, PRODUCER_NAME_HEADER, f"comes without {SEQUENCE_ID_HEADER}")


def run_producer_name(raw: bytes) -> str:
    """The producer name of a run (`SequenceHeaderScan.run_read`); RecordBatchError naming its first record (all of
    them hold it) when it is not a valid one."""
    return _producer_name(0, raw)


def _valid_name(raw: bytes) -> str | None:
    if not raw or len(raw) > MAX_PRODUCER_NAME_BYTES:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


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


def _invalid(reason: str) -> RecordBatchError:
    return RecordBatchError(ErrorCode.INVALID_RECORD, reason)


def _bad(index: int, header: str, problem: str) -> RecordBatchError:
    return _invalid(f"record {index}: header {header} {problem}")
