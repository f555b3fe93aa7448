"""Which records here a PIP-33 snapshot's positions cover: an UPDATE moves a group only up to its first record, after
the group's position here, from a cluster the snapshot does not cover (kop/replication/updates.py says why).

For a group that has a position here, that record is looked for between its position and the new one: a read as
long as the group's move. A group the UPDATE creates has none, and its first uncovered record may be anywhere from
the start of the partition. So, per partition and set of covered clusters, the first such record from the start (or
how far the partition was read without finding one) is kept, read on from where it stopped at the next UPDATE, and
stored in the properties of the `pulsar.updates` cursor with each UPDATE applied: each record is read for it at most
once, across restarts too, whatever the number of groups created. Once retention deletes that record, the reading
goes on after it."""
import asyncio
import weakref
from dataclasses import dataclass

from kop.ledger import Position
from kop.ledger.position import BEFORE_FIRST
from kop.partition import PartitionLog
from kop.replication.snapshots import REBUILD_BATCH, REBUILD_BYTES, scan_start
from proto.kop_pb2 import MessageMetadata

PROPERTY_PREFIX = "uncovered/"  # uncovered/<covered clusters, by ','>/<field>: the cursor property names
MAX_SETS = 8  # sets of covered clusters kept per partition (the ones used last)


def uncovered_source(metadata: MessageMetadata, covered: frozenset[str], local: str) -> bool:
    """Whether a data entry's records came from a cluster not in `covered` (this cluster's own count as `local`)."""
    return not metadata.is_control and (metadata.replicated_from or local) not in covered


async def first_uncovered(partition: PartitionLog, start: int, end: Position, covered: frozenset[str],
                          local: str) -> int | None:
    """The offset of the first record from `start` (an offset) up to, not including, the entry at `end` whose
    cluster is not in `covered`; None if there is none. Read in bounded steps, the event loop served in between."""
    position = scan_start(partition, start + 1)  # from the entry holding `start` on
    while entries := await partition.ledger.read_after_async(position, REBUILD_BATCH, REBUILD_BYTES):
        for entry in entries:
            if entry.position >= end:
                return None
            if not entry.span or entry.first_index + entry.span <= start:
                continue  # a marker, or before the group's position
            if uncovered_source(MessageMetadata.FromString(entry.metadata), covered, local):
                return max(entry.first_index, start)
        position = entries[-1].position
        await asyncio.sleep(0)
    return None


@dataclass
class _Reading:
    """How far the partition was read from its start for one set of covered clusters, and what it found."""
    read_to: Position = BEFORE_FIRST  # the last entry read
    found: Position | None = None  # the first uncovered record's entry ...
    found_offset: int = -1  # ... and its first offset


class FromTheStart:
    """first_uncovered from the start of the partition, kept per partition and set of covered clusters."""

    def __init__(self, local: str, cursor: str) -> None:
        """cursor: the name of the cursor whose properties keep what was read (`pulsar.updates`)."""
        self.local = local
        self.cursor = cursor
        self._readings: weakref.WeakKeyDictionary[PartitionLog, dict[frozenset[str], _Reading]] = \
            weakref.WeakKeyDictionary()
        self.entries_read = 0  # (tests)

    async def first_uncovered(self, partition: PartitionLog, end: Position, covered: frozenset[str]) -> int | None:
        reading = self._reading(partition, covered)
        if reading.found is not None and reading.found_offset < partition.log_start_offset:
            reading.found = None  # deleted by retention: read on after it
        while reading.found is None:
            entries = await partition.ledger.read_after_async(reading.read_to, REBUILD_BATCH, REBUILD_BYTES)
            if not entries:
                return None
            for entry in entries:
                if entry.position >= end:
                    return None
                reading.read_to = entry.position
                self.entries_read += 1
                if entry.span and uncovered_source(MessageMetadata.FromString(entry.metadata), covered, self.local):
                    reading.found, reading.found_offset = entry.position, entry.first_index
                    break
            await asyncio.sleep(0)
        if reading.found >= end:
            return None
        return max(reading.found_offset, partition.log_start_offset)

    def properties(self, partition: PartitionLog) -> dict[str, int]:
        """What was read, as properties of the partition's `pulsar.updates` cursor."""
        out = {}
        for covered, reading in self._readings.get(partition, {}).items():
            key = PROPERTY_PREFIX + ",".join(sorted(covered)) + "/"
            out[key + "read_to.ledger"], out[key + "read_to.entry"] = reading.read_to
            if reading.found is not None:
                out[key + "found.ledger"], out[key + "found.entry"] = reading.found
                out[key + "found.offset"] = reading.found_offset
        return out

    def _reading(self, partition: PartitionLog, covered: frozenset[str]) -> _Reading:
        readings = self._readings.get(partition)
        if readings is None:
            readings = self._readings[partition] = self._stored(partition)
        reading = readings.pop(covered, None) or _Reading()
        readings[covered] = reading  # the last used, last
        while len(readings) > MAX_SETS:
            del readings[next(iter(readings))]
        return reading

    def _stored(self, partition: PartitionLog) -> dict[frozenset[str], _Reading]:
        cursor = partition.ledger.cursors.get(self.cursor)
        props = cursor.properties if cursor is not None else {}
        names = {name[len(PROPERTY_PREFIX):].rpartition("/")[0] for name in props if name.startswith(PROPERTY_PREFIX)}
        readings = {}
        for clusters in names:
            key = PROPERTY_PREFIX + clusters + "/"
            reading = _Reading()
            if key + "read_to.ledger" in props and key + "read_to.entry" in props:
                reading.read_to = Position(props[key + "read_to.ledger"], props[key + "read_to.entry"])
            if all(key + field in props for field in ("found.ledger", "found.entry", "found.offset")):
                reading.found = Position(props[key + "found.ledger"], props[key + "found.entry"])
                reading.found_offset = props[key + "found.offset"]
            readings[frozenset(clusters.split(",")) if clusters else frozenset()] = reading
        return readings
