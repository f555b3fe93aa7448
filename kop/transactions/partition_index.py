"""What one partition knows of transactions: the first offset of each producer's open transaction (the last stable
offset is the oldest of them) and the index of aborted transactions a read_committed fetch lists, so a fetch never
scans the log.

Transactional batches open a transaction when they are handed to the ledger, control batches (COMMIT/ABORT markers)
close it once stored. An aborted transaction is listed as Kafka's transaction index lists it: (producer id, first
offset, marker offset, the last stable offset once it was aborted); the last is what lets a lookup stop early.

The state is snapshotted every SNAPSHOT_ENTRIES stored entries into the properties of the partition's
`pulsar.transactions` cursor, at the position of the entry it covers up to; a partition that loads starts from the
snapshot and reads only the entries after it, as dedup recovery does (the whole log when there is none yet)."""
import asyncio
import bisect
import logging
from collections.abc import Iterator
from dataclasses import dataclass

from kop.ledger import ManagedLedger, ManagedLedgerError, Position
from protocol.records import control_marker, iter_records, split_batches

log = logging.getLogger(__name__)

REBUILD_READ_BYTES = 4 << 20
SNAPSHOT_ENTRIES = 1000
SNAPSHOT_VERSION = "1"


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    producer_id: int
    first_offset: int
    last_offset: int  # the ABORT marker's offset
    last_stable_offset: int  # the partition's LSO right after the abort: no later abort starts before it


class PartitionTransactions:
    def __init__(self) -> None:
        self.open: dict[int, int] = {}  # producer id -> first offset of its open transaction
        self.aborted: list[AbortedTxn] = []  # in marker order
        self._aborted_ends: list[int] = []  # their last offsets, for bisect
        # producer id -> the highest coordinator epoch of its markers here: a marker from an earlier coordinator
        # (one that lost its shard, its request late) is refused, as Kafka refuses it
        self.coordinator_epochs: dict[int, int] = {}

    def stale_coordinator(self, producer_id: int, coordinator_epoch: int) -> bool:
        return coordinator_epoch < self.coordinator_epochs.get(producer_id, coordinator_epoch)

    def on_coordinator(self, producer_id: int, coordinator_epoch: int) -> None:
        if coordinator_epoch > self.coordinator_epochs.get(producer_id, -1):
            self.coordinator_epochs[producer_id] = coordinator_epoch

    def on_data(self, producer_id: int, base_offset: int) -> None:
        """A transactional batch was appended at base_offset."""
        self.open.setdefault(producer_id, base_offset)

    def on_marker(self, producer_id: int, offset: int, commit: bool, high_watermark: int) -> None:
        """A COMMIT or ABORT marker of producer_id was appended at offset."""
        first = self.open.pop(producer_id, None)
        if first is None or commit:
            return  # a marker for a transaction with no data here (or written again after a failure)
        self.aborted.append(AbortedTxn(producer_id, first, offset, self.last_stable_offset(max(high_watermark,
                                                                                               offset + 1))))
        self._aborted_ends.append(offset)

    def last_stable_offset(self, high_watermark: int) -> int:
        """The first offset of the oldest open transaction, else the high watermark."""
        return min(min(self.open.values(), default=high_watermark), high_watermark)

    def oldest_open_offset(self) -> int | None:
        return min(self.open.values(), default=None)

    def aborted_between(self, fetch_offset: int, upper: int) -> Iterator[AbortedTxn]:
        """Aborted transactions a fetch returning [fetch_offset, upper) must list: their marker at or after
        fetch_offset and their first offset below upper."""
        for txn in self.aborted[bisect.bisect_left(self._aborted_ends, fetch_offset):]:
            if txn.first_offset < upper:
                yield txn
            if txn.last_stable_offset >= upper:
                return

    def forget_before(self, offset: int) -> None:
        """Retention deleted everything below offset: aborted transactions that ended there are no longer needed."""
        cut = bisect.bisect_left(self._aborted_ends, offset)
        if cut:
            del self.aborted[:cut]
            del self._aborted_ends[:cut]

    def snapshot(self, end_offset: int) -> dict[str, str]:
        """The state as of the entries below end_offset (all stored): transactions opened by batches handed to the
        ledger since are left out. Aborted transactions as "pid:first:last:lso" joined by ";", open ones as
        "pid:first" joined by ",". """
        opened = ",".join(f"{pid}:{first}" for pid, first in self.open.items() if first < end_offset)
        aborted = ";".join(f"{t.producer_id}:{t.first_offset}:{t.last_offset}:{t.last_stable_offset}"
                           for t in self.aborted)
        coordinators = ",".join(f"{pid}:{epoch}" for pid, epoch in self.coordinator_epochs.items())
        return {"txn.version": SNAPSHOT_VERSION, "txn.end": str(end_offset), "txn.open": opened,
                "txn.aborted": aborted, "txn.coordinators": coordinators}

    def restore(self, snapshot: dict[str, str]) -> int | None:
        """Take the state of a snapshot; returns the offset the entries after it start at (None: not a snapshot of
        this version, and nothing was taken)."""
        if snapshot.get("txn.version") != SNAPSHOT_VERSION:
            return None
        try:
            opened = {int(pid): int(first) for pid, first in
                      (item.split(":") for item in snapshot["txn.open"].split(",") if item)}
            aborted = [AbortedTxn(*map(int, item.split(":"))) for item in snapshot["txn.aborted"].split(";") if item]
            end = int(snapshot["txn.end"])
            coordinators = {int(pid): int(epoch) for pid, epoch in  # absent from snapshots of older kops
                            (item.split(":") for item in snapshot.get("txn.coordinators", "").split(",") if item)}
        except (KeyError, ValueError, TypeError):
            return None  # damaged: the caller reads the whole log instead
        self.open, self.aborted, self._aborted_ends = opened, aborted, [t.last_offset for t in aborted]
        self.coordinator_epochs = coordinators
        return end

    def rebuild(self, ledger: ManagedLedger, snapshot: dict[str, str] | None = None) -> int:
        """Restore the snapshot, if any, then read the header of every stored batch after it (and each marker's one
        record); returns how many entries were read."""
        self.open, self.aborted, self._aborted_ends, self.coordinator_epochs = {}, [], [], {}
        start = self.restore(snapshot) if snapshot else None
        offset, end, read = max(ledger.start_index, start or 0), ledger.confirmed_end_index, 0
        self.forget_before(ledger.start_index)
        # A transaction open at the snapshot whose first batch retention has deleted since has ended (retention keeps
        # an open one's batches), and its marker may have gone with them: it must not come back open, for ever.
        self.open = {pid: first for pid, first in self.open.items() if first >= ledger.start_index}
        while offset < end:
            entries = ledger.read_from_index(offset, REBUILD_READ_BYTES)
            if not entries:
                break
            for entry in entries:
                for header, view in split_batches(entry.data):
                    if not header.is_transactional:
                        continue
                    if header.is_control:
                        marker = control_marker(next(iter_records(view)))
                        self.on_marker(header.producer_id, header.base_offset, marker.commit,
                                       header.base_offset + 1)
                        self.on_coordinator(header.producer_id, marker.coordinator_epoch)
                    else:
                        self.on_data(header.producer_id, header.base_offset)
                read += 1
            offset = entries[-1].first_index + entries[-1].span
        return read


class IndexSnapshots:
    """Writes a partition's transaction state into its `pulsar.transactions` cursor every SNAPSHOT_ENTRIES stored
    entries, once the partition may hold transactions (one write at a time; a failed one waits for the next)."""

    def __init__(self, index: PartitionTransactions, log_name: str) -> None:
        self._index = index
        self._log_name = log_name
        self._cursor = None
        self._stored = 0
        self._writing: asyncio.Task | None = None

    def enable(self, cursor) -> None:
        self._cursor = cursor

    def on_stored(self, position: Position, end_offset: int) -> None:
        """The entry at `position`, ending below end_offset, is stored, and the index has taken it (call in log
        order, after the index: a marker closes its transaction before its entry counts here)."""
        if self._cursor is None:
            return
        self._stored += 1
        if self._stored < SNAPSHOT_ENTRIES or self._writing is not None:
            return
        self._stored = 0
        self._writing = asyncio.ensure_future(self._write(position, self._index.snapshot(end_offset)))

    async def _write(self, position: Position, snapshot: dict[str, str]) -> None:
        try:
            await self._cursor.mark_delete(position, string_properties=snapshot)
        except (ManagedLedgerError, OSError) as exc:
            log.warning("%s: transaction index snapshot not written (%s); the next one will be", self._log_name, exc)
        finally:
            self._writing = None

    async def close(self) -> None:
        if self._writing is not None:
            await asyncio.wait([self._writing])
