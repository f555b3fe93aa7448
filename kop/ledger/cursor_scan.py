"""Reading a cursor log back, damaged or not: every intact record, each cursor's last two states, and whether records
of unknown cursors may have been lost.

A stretch of bytes that is not an intact record (wrong length, failed CRC, undecodable) is damage: at the end of the
file it is usually a torn tail (a write cut short by a crash), in the middle a corrupted sector. Intact records
after it are other cursors' states (or newer states of the same ones) and are kept: the scan resynchronises on the
next offset where an intact record starts and is followed by another intact record or by the end of the file (so a
record-shaped string inside a damaged record's payload is not taken for a record).

Damage hides the names of the records it destroyed, so after it any cursor without a record may have existed. The
owner records that fact in the log itself (a marker record, see `MARKER_NAME`) before it truncates a damaged tail or
compacts, so the fact outlives the damaged bytes; a tombstone written after the damage proves a cursor was deleted,
not lost.
"""
from dataclasses import dataclass, field

import crc32c

from kop.ledger.framed_file import HEADER_SIZE, RECORD_HEADER, frame
from kop.ledger.position import Position
from proto.kop_pb2 import ManagedCursorInfo

MAX_CURSOR_RECORD = 64 * 1024 * 1024
# A record that is neither a cursor state nor a deletion: "records before this point may have been lost". The name
# cannot collide with a consumer group's (the coordinator refuses group ids starting with "pulsar.").
MARKER_NAME = "pulsar.cursor-log.damaged"
# Every record's payload starts with the tag of `name` (field 100, length-delimited): the encoder writes fields in
# number order and kop sets none below 100. Resynchronisation looks for it instead of trying every byte.
_NAME_TAG = b"\xa2\x06"


def marker_record() -> bytes:
    return frame(ManagedCursorInfo(name=MARKER_NAME).SerializeToString())


def is_marker(info: ManagedCursorInfo) -> bool:
    return info.name == MARKER_NAME and not info.deleted and not info.HasField("position")


def position_of(info: ManagedCursorInfo) -> Position:
    return Position(info.position.ledgerId, info.position.entryId)


@dataclass(frozen=True, slots=True)
class KeptRecord:
    """One durable state of a cursor: its position, and the framed record exactly as it is (re)written."""

    position: Position
    info: ManagedCursorInfo
    raw: bytes


@dataclass(slots=True)
class Recovered:
    kept: dict[str, tuple[KeptRecord, ...]] = field(default_factory=dict)  # live cursors: last two states, oldest first
    damaged: bool = False  # records of unknown cursors may have been lost (damage seen, or a marker)
    known_deleted: set[str] = field(default_factory=set)  # cursors whose deletion was written after the last damage
    intact_end: int = 0  # where the last intact record ends; bytes after it are a damaged tail


def recover(data: bytes) -> Recovered:
    """Fold a cursor log's content into the durable state: the latest intact record of each cursor wins."""
    out = Recovered()
    last_damage = -1
    deleted_at: dict[str, int] = {}
    pos, size = 0, len(data)
    while pos < size:
        hit = _record_at(data, pos)
        if hit is None:
            last_damage = pos
            pos = _resync(data, pos)
            continue
        info, end = hit
        if is_marker(info):
            last_damage = pos
        elif info.deleted:
            out.kept.pop(info.name, None)
            deleted_at[info.name] = pos
        else:
            kept = KeptRecord(position_of(info), info, data[pos:end])
            out.kept[info.name] = out.kept.get(info.name, ())[-1:] + (kept,)
            deleted_at.pop(info.name, None)
        pos = out.intact_end = end
    out.damaged = last_damage >= 0
    out.known_deleted = {name for name, at in deleted_at.items() if at > last_damage}
    return out


def _record_at(data: bytes, pos: int) -> tuple[ManagedCursorInfo, int] | None:
    """The intact record at pos and the offset after it, or None."""
    if pos + HEADER_SIZE > len(data):
        return None
    length, crc = RECORD_HEADER.unpack_from(data, pos)
    end = pos + HEADER_SIZE + length
    if length > MAX_CURSOR_RECORD or end > len(data):
        return None
    info = parse_record(data[pos + HEADER_SIZE:end], crc)
    return (info, end) if info is not None else None


def _resync(data: bytes, damaged_at: int) -> int:
    """The first offset after damaged_at where an intact record starts and is followed by another intact record or
    the end of the file; the end of the file if there is none."""
    search = damaged_at + 1 + HEADER_SIZE
    while True:
        tag = data.find(_NAME_TAG, search)
        if tag < 0:
            return len(data)
        candidate = tag - HEADER_SIZE
        hit = _record_at(data, candidate)
        if hit is not None and (hit[1] == len(data) or _record_at(data, hit[1]) is not None):
            return candidate
        search = tag + 1


def parse_record(payload: bytes | memoryview, crc: int) -> ManagedCursorInfo | None:
    """The record if its CRC matches and it decodes to a cursor state, a deletion or a marker; else None."""
    if crc32c.crc32c(payload) != crc:
        return None
    info = ManagedCursorInfo()
    try:
        info.ParseFromString(bytes(payload))
    except Exception:  # a CRC-valid but undecodable record: treat as corrupt
        return None
    if info.deleted or info.HasField("position") or is_marker(info):
        return info
    return None
