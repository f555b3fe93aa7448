"""The aborted transactions whose ABORT markers one ledger holds, in marker order: Kafka's transaction index of a
segment (its .txnindex). Each is listed as Kafka lists it: (producer id, first offset, the marker's offset, the
partition's last stable offset once it was aborted); the last is what lets a lookup stop early.

Kept as four arrays of int64 (32 bytes a transaction). Stored with the ledger as those arrays, big-endian, after a
header and before a CRC32C of everything in front of it; written into snapshots as text."""
import struct
import sys
from array import array
from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass

import crc32c

from kop.ledger import ManagedLedgerError

HEADER = struct.Struct(">4sBI")  # magic, format version, count
MAGIC = b"KTXI"
FORMAT_VERSION = 1
CRC = struct.Struct(">I")
NO_OFFSET = -1
INT64_MAX = (1 << 63) - 1


# (producer id, first offset): an aborted transaction as a fetch response lists it
Listed = tuple[int, int]


class DamagedIndex(ManagedLedgerError):
    """A stored transaction index that is not one: wrong magic, version or length, or a CRC that does not match."""


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    producer_id: int
    first_offset: int
    last_offset: int  # the ABORT marker's offset
    last_stable_offset: int  # the partition's LSO right after the abort: no later abort starts before it


@dataclass(frozen=True, slots=True)
class IndexSummary:
    """What a lookup needs to know of a ledger's index to pass it by without reading it."""

    first_marker: int  # offset of its first ABORT marker
    last_marker: int
    min_first_offset: int  # the earliest first offset of its transactions
    max_stable_offset: int


class LedgerAborts:
    __slots__ = ("producer_ids", "first_offsets", "last_offsets", "stable_offsets", "_min_first", "_max_stable")

    def __init__(self) -> None:
        self.producer_ids = array("q")
        self.first_offsets = array("q")
        self.last_offsets = array("q")  # ascending: the markers' offsets, for bisect
        self.stable_offsets = array("q")
        self._min_first = INT64_MAX
        self._max_stable = NO_OFFSET

    def __len__(self) -> int:
        return len(self.last_offsets)

    def __iter__(self) -> Iterator[AbortedTxn]:
        for fields in zip(self.producer_ids, self.first_offsets, self.last_offsets, self.stable_offsets):
            yield AbortedTxn(*fields)

    @property
    def nbytes(self) -> int:
        return 32 * len(self)

    def append(self, txn: AbortedTxn) -> None:
        self.producer_ids.append(txn.producer_id)
        self.first_offsets.append(txn.first_offset)
        self.last_offsets.append(txn.last_offset)
        self.stable_offsets.append(txn.last_stable_offset)
        self._min_first = min(self._min_first, txn.first_offset)
        self._max_stable = max(self._max_stable, txn.last_stable_offset)

    @property
    def last_marker(self) -> int:
        return self.last_offsets[-1] if self.last_offsets else NO_OFFSET

    def summary(self) -> IndexSummary:
        first = self.last_offsets[0] if self.last_offsets else NO_OFFSET
        return IndexSummary(first, self.last_marker, self._min_first, self._max_stable)

    def collect(self, fetch_offset: int, upper: int, out: list[Listed]) -> bool:
        """Append to out, in marker order, the transactions a fetch returning [fetch_offset, upper) must list: their
        marker at or after fetch_offset and their first offset below upper. True once one of them was aborted with
        the last stable offset at or past upper: no later abort can start below upper, the lookup is over."""
        producer_ids, firsts, stables = self.producer_ids, self.first_offsets, self.stable_offsets
        for i in range(bisect_left(self.last_offsets, fetch_offset), len(self)):
            if firsts[i] < upper:
                out.append((producer_ids[i], firsts[i]))
            if stables[i] >= upper:
                return True
        return False

    # ---- stored with the ledger

    def encode(self) -> bytes:
        body = HEADER.pack(MAGIC, FORMAT_VERSION, len(self)) + b"".join(
            _big_endian(column) for column in self._columns())
        return body + CRC.pack(crc32c.crc32c(body))

    @classmethod
    def decode(cls, data: bytes) -> "LedgerAborts":
        if len(data) < HEADER.size + CRC.size:
            raise DamagedIndex(f"transaction index of {len(data)} bytes is too short")
        magic, version, count = HEADER.unpack_from(data, 0)
        if magic != MAGIC or version != FORMAT_VERSION:
            raise DamagedIndex(f"not a transaction index of format {FORMAT_VERSION} ({magic!r}, {version})")
        body_end = HEADER.size + 32 * count
        if len(data) != body_end + CRC.size or CRC.unpack_from(data, body_end)[0] != crc32c.crc32c(data[:body_end]):
            raise DamagedIndex("transaction index fails its length or CRC check")
        aborts = cls()
        view = memoryview(data)
        for i, column in enumerate(aborts._columns()):
            column.frombytes(view[HEADER.size + 8 * count * i: HEADER.size + 8 * count * (i + 1)])
            if sys.byteorder == "little":
                column.byteswap()
        if count:
            aborts._min_first, aborts._max_stable = min(aborts.first_offsets), max(aborts.stable_offsets)
        return aborts

    # ---- in snapshots: "pid:first:last:lso" joined by ";"

    def to_text(self) -> str:
        return ";".join(f"{p}:{f}:{m}:{s}" for p, f, m, s in zip(*self._columns()))

    @classmethod
    def from_text(cls, text: str) -> "LedgerAborts":
        """Raises ValueError when text is not what to_text writes."""
        aborts = cls()
        for item in text.split(";") if text else ():
            aborts.append(AbortedTxn(*map(int, item.split(":"))))
        return aborts

    def _columns(self) -> tuple[array, array, array, array]:
        return self.producer_ids, self.first_offsets, self.last_offsets, self.stable_offsets


def _big_endian(column: array) -> bytes:
    if sys.byteorder == "big":
        return column.tobytes()
    swapped = array("q", column)
    swapped.byteswap()
    return swapped.tobytes()
