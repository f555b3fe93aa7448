"""What one partition knows of transactions: the first offset of each producer's open transaction (the last stable
offset is the oldest of them) and the aborted-transaction index of each ledger (ledger_indexes), which a
read_committed fetch lists from, so a fetch never scans the log.

Transactional batches open a transaction when they are handed to the ledger; control batches (COMMIT/ABORT markers)
close it once stored, and an abort is noted in the index of the ledger holding its marker. A ledger that comes to
hold max_aborted_per_ledger of them is rolled, so the index kept in memory stays small.

The state is snapshotted (index_snapshots) into the properties of the partition's `pulsar.transactions` cursor, at
the position of the entry it covers up to: the open transactions and the indexes not stored yet. A partition that
loads starts from the snapshot, reads only the entries after it (the whole log when there is none yet), as dedup
recovery does, then stores the indexes of the ledgers those entries are in: every ledger is closed at load, the engine
starts a new one. So after a kill -9 the index of the ledger that was being written, or closed, is rebuilt from the
snapshot and that ledger's entries after it. A stored index that has gone missing (the snapshot lists the ledgers
whose index was stored) or is found damaged is rebuilt from the log: its transactional batches from the log start
through that ledger, replayed into a scratch state."""
import asyncio
import logging
import sys
from collections.abc import Mapping

from kop.ledger import ManagedLedger, Position
from kop.transactions.aborted_index import AbortedTxn, LedgerAborts, Listed
from kop.transactions.index_cache import IndexCache
from kop.transactions.ledger_indexes import LedgerIndexes
from protocol.records import control_marker, iter_records, split_batches

log = logging.getLogger(__name__)

REBUILD_READ_BYTES = 4 << 20
DEFAULT_MAX_ABORTED_PER_LEDGER = 10_000
SNAPSHOT_VERSION = "2"  # version 1 (one list of every aborted transaction, no ledgers) is read too
ABORTED_KEY = "txn.aborted."  # + ledger id: that ledger's index, not stored yet
STORED_KEY = "txn.stored"  # the ledgers whose index was stored, joined by ","


class PartitionTransactions:
    def __init__(self, ledger: ManagedLedger, cache: IndexCache | None = None,
                 max_aborted_per_ledger: int = DEFAULT_MAX_ABORTED_PER_LEDGER, log_name: str = "") -> None:
        self._ledger = ledger
        self.open: dict[int, int] = {}  # producer id -> first offset of its open transaction
        self.indexes = LedgerIndexes(ledger, cache if cache is not None else IndexCache(), log_name or ledger.name,
                                     self.rebuild_indexes)
        self.max_aborted_per_ledger = max_aborted_per_ledger
        # producer id -> the highest coordinator epoch of its markers here: a marker from an earlier coordinator
        # (one that lost its shard, its request late) is refused, as Kafka refuses it
        self.coordinator_epochs: dict[int, int] = {}
        # producer id -> (epoch, commit) of its last marker stored here, while none of its transactional batches
        # came after it: the same marker again (a coordinator resending one whose acknowledgement a crash or a
        # failed flush lost, though it reached the log) closes nothing and is not stored twice
        self.ended: dict[int, tuple[int, bool]] = {}

    def repeats_last_marker(self, producer_id: int, producer_epoch: int, commit: bool,
                            coordinator_epoch: int) -> bool:
        """Whether this marker is the producer's last one here again, with nothing of it written since, from no later
        coordinator (a later one's marker is stored: it is what fences the earlier coordinator after a restart)."""
        return producer_id not in self.open and self.ended.get(producer_id) == (producer_epoch, commit) \
            and coordinator_epoch <= self.coordinator_epochs.get(producer_id, coordinator_epoch)

    def stale_coordinator(self, producer_id: int, coordinator_epoch: int) -> bool:
        return coordinator_epoch < self.coordinator_epochs.get(producer_id, coordinator_epoch)

    def on_coordinator(self, producer_id: int, coordinator_epoch: int) -> None:
        if coordinator_epoch > self.coordinator_epochs.get(producer_id, -1):
            self.coordinator_epochs[producer_id] = coordinator_epoch

    def on_data(self, producer_id: int, base_offset: int) -> None:
        """A transactional batch was appended at base_offset."""
        self.open.setdefault(producer_id, base_offset)
        self.ended.pop(producer_id, None)

    def on_marker(self, producer_id: int, producer_epoch: int, position: Position, offset: int, commit: bool,
                  high_watermark: int) -> None:
        """A COMMIT or ABORT marker of producer_id was stored at offset, in the entry at position."""
        first = self.open.pop(producer_id, None)
        self.ended[producer_id] = (producer_epoch, commit)
        if first is None or commit:
            return  # a marker for a transaction with no data here (or written again after a failure)
        stable = self.last_stable_offset(max(high_watermark, offset + 1))
        held = self.indexes.add(position.ledger_id, AbortedTxn(producer_id, first, offset, stable))
        if held >= self.max_aborted_per_ledger:
            self._ledger.request_roll()  # no-op at load: the current ledger is new and empty then

    def on_stored(self, position: Position) -> None:
        """The entry at position is stored (after on_marker for a marker): the ledgers before its own are complete,
        and their indexes can be stored."""
        self.indexes.store_closed(position.ledger_id)

    def last_stable_offset(self, high_watermark: int) -> int:
        """The first offset of the oldest open transaction, else the high watermark."""
        return min(min(self.open.values(), default=high_watermark), high_watermark)

    def oldest_open_offset(self) -> int | None:
        return min(self.open.values(), default=None)

    async def aborted_between(self, first_ledger_id: int, fetch_offset: int, upper: int) -> list[Listed]:
        """Aborted transactions a fetch returning [fetch_offset, upper) must list, as (producer id, first offset):
        their marker at or after fetch_offset (held by ledger first_ledger_id or a later one) and their first offset
        below upper."""
        return await self.indexes.collect(first_ledger_id, fetch_offset, upper)

    def forget_before(self, offset: int) -> None:
        """Retention deleted everything below offset: the indexes of the ledgers before it are no longer needed."""
        position = self._ledger.position_of_index(offset)
        self.indexes.forget_before(offset, None if position is None else position.ledger_id)

    # ---- snapshots

    def snapshot(self, end_offset: int) -> dict[str, str]:
        """The state as of the entries below end_offset (all stored): transactions opened by batches handed to the
        ledger since are left out. Open transactions as "pid:first" joined by ","; each index not stored yet under
        its ledger's key (LedgerAborts.to_text)."""
        opened = ",".join(f"{pid}:{first}" for pid, first in self.open.items() if first < end_offset)
        coordinators = ",".join(f"{pid}:{epoch}" for pid, epoch in self.coordinator_epochs.items())
        ended = ",".join(f"{pid}:{epoch}:{int(commit)}" for pid, (epoch, commit) in self.ended.items())
        properties = {"txn.version": SNAPSHOT_VERSION, "txn.end": str(end_offset), "txn.open": opened,
                      "txn.coordinators": coordinators, "txn.ended": ended,
                      STORED_KEY: ",".join(map(str, self.indexes.stored_ids()))}
        for ledger_id, aborts in self.indexes.in_memory().items():
            properties[f"{ABORTED_KEY}{ledger_id}"] = aborts.to_text()
        return properties

    def restore(self, snapshot: Mapping[str, str]) -> int | None:
        """Take the state of a snapshot (an index it holds for a ledger whose index is stored is passed by); returns
        the offset the entries after it start at (None: not a snapshot this version reads, and nothing was taken)."""
        try:
            version = snapshot.get("txn.version")
            if version == SNAPSHOT_VERSION:
                aborted = {int(key[len(ABORTED_KEY):]): LedgerAborts.from_text(text)
                           for key, text in snapshot.items() if key.startswith(ABORTED_KEY)}
            elif version == "1":
                aborted = self._by_ledger(LedgerAborts.from_text(snapshot["txn.aborted"]))
            else:
                return None
            opened = {int(pid): int(first) for pid, first in
                      (item.split(":") for item in snapshot["txn.open"].split(",") if item)}
            end = int(snapshot["txn.end"])
            coordinators = {int(pid): int(epoch) for pid, epoch in  # absent from snapshots of older kops
                            (item.split(":") for item in snapshot.get("txn.coordinators", "").split(",") if item)}
            ended = {int(pid): (int(epoch), commit == "1") for pid, epoch, commit in  # likewise
                     (item.split(":") for item in snapshot.get("txn.ended", "").split(",") if item)}
        except (KeyError, ValueError, TypeError):
            return None  # damaged: the caller reads the whole log instead
        self.open, self.coordinator_epochs, self.ended = opened, coordinators, ended
        for ledger_id in sorted(aborted):
            self.indexes.adopt(ledger_id, aborted[ledger_id])
        return end

    def _by_ledger(self, aborted: LedgerAborts) -> dict[int, LedgerAborts]:
        """A version-1 snapshot's aborted transactions, by the ledger holding each marker (those whose ledger is
        gone were deleted by retention)."""
        by_ledger: dict[int, LedgerAborts] = {}
        for txn in aborted:
            position = self._ledger.position_of_index(txn.last_offset)
            if position is not None:
                by_ledger.setdefault(position.ledger_id, LedgerAborts()).append(txn)
        return by_ledger

    async def load(self, snapshot: Mapping[str, str] | None = None) -> int:
        """Restore the snapshot, if any, then read the header of every stored batch after it (and each marker's one
        record), and store the indexes of the ledgers read (all closed now); returns how many entries were read.
        Call before the partition takes writes."""
        ledger = self._ledger
        self.open, self.coordinator_epochs, self.ended = {}, {}, {}
        self.indexes.reset(ledger.txn_indexed_ledgers())
        start = self.restore(snapshot) if snapshot else None
        if start is not None and start < ledger.start_index:
            # Entries after the snapshot are gone (DeleteRecords past it: retention keeps them). A transaction open
            # at the snapshot whose first batch went may have ended among them: it must not come back open, for ever.
            self.open = {pid: first for pid, first in self.open.items() if first >= ledger.start_index}
        read = await self._replay(max(ledger.start_index, start or 0))
        self.forget_before(ledger.start_index)
        if snapshot and start is not None:
            await self._rebuild_missing(snapshot.get(STORED_KEY, ""))
        await self.indexes.store_all_closed(ledger.internal_stats().current_ledger_id)
        return read

    async def _replay(self, offset: int, through_ledger_id: int = sys.maxsize) -> int:
        """Take the transactional batches of the stored entries from offset on, up to the end of ledger
        through_ledger_id: the header of each batch, and each marker's one record. Returns how many entries were
        read."""
        ledger, read = self._ledger, 0
        end = ledger.confirmed_end_index
        while offset < end:
            entries = await ledger.read_from_index_async(offset, REBUILD_READ_BYTES)
            if not entries:
                break
            for entry in entries:
                if entry.position.ledger_id > through_ledger_id:
                    return read
                for header, view in split_batches(entry.data):
                    if not header.is_transactional:
                        continue
                    if header.is_control:
                        marker = control_marker(next(iter_records(view)))
                        self.on_marker(header.producer_id, header.producer_epoch, entry.position, header.base_offset,
                                       marker.commit, header.base_offset + 1)
                        self.on_coordinator(header.producer_id, marker.coordinator_epoch)
                    else:
                        self.on_data(header.producer_id, header.base_offset)
                read += 1
            offset = entries[-1].first_index + entries[-1].span
            await asyncio.sleep(0)  # a long log: other partitions' work goes on between reads
        return read

    async def rebuild_indexes(self, ledger_ids: list[int]) -> dict[int, LedgerAborts]:
        """The indexes of these ledgers rebuilt from the log (their stored ones are missing or damaged), in one
        replay from the log start. Each transaction is listed with its producer, first offset and marker as
        before; its last stable offset may be lower than the one noted live (at most the marker's offset + 1),
        which only lets a lookup stop later, listing the same ones."""
        scratch = PartitionTransactions(self._ledger, IndexCache(0), sys.maxsize, f"{self.indexes.log_name} rebuild")
        await scratch._replay(self._ledger.start_index, max(ledger_ids))
        return {ledger_id: scratch.indexes.in_memory().get(ledger_id, LedgerAborts()) for ledger_id in ledger_ids}

    async def _rebuild_missing(self, listed: str) -> None:
        """Rebuild the indexes a snapshot lists as stored whose ledger is still there but whose index is not."""
        held = {stats.ledger_id for stats in self._ledger.internal_stats().ledgers}
        present = set(self._ledger.txn_indexed_ledgers()) | set(self.indexes.in_memory())
        try:
            missing = sorted({int(i) for i in listed.split(",") if i} & held - present)
        except ValueError:
            log.warning("%s: the transaction snapshot's list of stored indexes is damaged", self.indexes.log_name)
            return
        if missing:
            log.warning("%s: the aborted-transaction indexes of ledgers %s are missing; rebuilding them from the log",
                        self.indexes.log_name, missing)
            for ledger_id, aborts in (await self.rebuild_indexes(missing)).items():
                self.indexes.adopt(ledger_id, aborts)

    async def close(self) -> None:
        await self.indexes.close()
