"""PIP-33 UPDATE markers another cluster's replicator stored here: each moves the named group's committed offset on
the partition to the position it gives for this cluster, forward only, creating the group as a replicated one if
needed (Pulsar's receiveSubscriptionUpdated).

An UPDATE is applied only after the ones stored before it on the partition, and the cursor `pulsar.updates` records
the last one whose effect is durable. After a restart (or wherever the partition is loaded next) the UPDATEs stored
after it are read back from the log and applied again first (moving a group is idempotent: never backwards), so an
UPDATE whose commit was lost to a crash, or failed, is not lost with it: the group's last position may have no
other UPDATE coming (its source cluster is the one that went down).

A snapshot lists the clusters whose records its positions cover (`covered_clusters`): the group is moved only up to
its first record here, after its current position, from any other cluster, which it cannot have consumed where it
was (this cluster's own records when it does not replicate back to the source, a cluster that was down or that
does not replicate to the source). An UPDATE without the list (from an older kop) counts every cluster as covered.
"""
import asyncio
import logging
import weakref
from collections.abc import Callable

from kop.groups import GroupCoordinator
from kop.ledger import Position
from kop.ledger.position import BEFORE_FIRST
from kop.partition import PartitionLog
from kop.replication.snapshots import REBUILD_BATCH, REBUILD_BYTES, first_uncovered, offset_after
from proto.kop_pb2 import MarkerType, MessageMetadata, ReplicatedSubscriptionsUpdate
from protocol.errors import ErrorCode
from protocol.records import marker_payload

log = logging.getLogger(__name__)

UPDATES_CURSOR = "pulsar.updates"  # the last UPDATE stored here whose effect is durable (holds nothing back)
UPDATE = MarkerType.REPLICATED_SUBSCRIPTION_UPDATE


class UpdateApplier:
    def __init__(self, local: str, groups: GroupCoordinator) -> None:
        self.local = local
        self.groups = groups
        self._started: weakref.WeakSet[PartitionLog] = weakref.WeakSet()  # their stored UPDATEs read back
        # partition -> the last step of its chain of UPDATEs being applied (the first re-reads those stored and not
        # applied); gone once it is done, so a deleted partition is not kept
        self._tails: dict[PartitionLog, asyncio.Task] = {}
        self._behind: weakref.WeakSet[PartitionLog] = weakref.WeakSet()  # an UPDATE failed: re-read at next load
        self._held: dict[tuple[str, str], int] = {}  # (partition, group) -> the offset its updates hold it at

    def stored(self, partition: PartitionLog, source: str, payload: bytes, position: Position) -> None:
        """An UPDATE marker a replicator of `source` stored here, at `position`, is durable."""
        self._chain(partition, lambda: self._apply(partition, source, payload, position))

    def recover(self, partition: PartitionLog) -> None:
        """Apply the UPDATEs a previous run stored here and did not apply (once per partition loaded)."""
        if partition not in self._started and UPDATES_CURSOR in partition.ledger.cursors:
            self._chain(partition, None)

    async def settled(self, partition: PartitionLog) -> None:
        """Until the partition's UPDATEs handed over so far are applied (tests)."""
        tail = self._tails.get(partition)
        if tail is not None:
            await asyncio.gather(tail, return_exceptions=True)

    async def stop(self) -> None:
        tails = list(self._tails.values())
        for task in tails:
            task.cancel()
        await asyncio.gather(*tails, return_exceptions=True)

    def _chain(self, partition: PartitionLog, step: Callable | None) -> None:
        first = partition not in self._started
        self._started.add(partition)
        previous = self._tails.get(partition)
        task = asyncio.ensure_future(self._after(partition, previous, first, step))
        self._tails[partition] = task
        task.add_done_callback(lambda done: self._done(partition, done))

    async def _after(self, partition: PartitionLog, previous: asyncio.Task | None, first: bool,
                     step: Callable | None) -> None:
        if previous is not None:
            await asyncio.gather(previous, return_exceptions=True)
        if first:
            await self._reapply_stored(partition)
        if step is not None:
            await step()

    def _done(self, partition: PartitionLog, task: asyncio.Task) -> None:
        if self._tails.get(partition) is task:
            del self._tails[partition]
        if not task.cancelled() and task.exception() is not None:
            self._behind.add(partition)
            log.error("%s: an update of a replicated group failed", partition.name, exc_info=task.exception())

    async def _reapply_stored(self, partition: PartitionLog) -> None:
        cursor = partition.ledger.cursors.get(UPDATES_CURSOR)
        if cursor is None:
            return
        position, count = cursor.mark_delete_position, 0
        while entries := partition.ledger.read_after(position, REBUILD_BATCH, REBUILD_BYTES):
            for entry in entries:
                if entry.span:
                    continue  # records: only markers cover no offset
                metadata = MessageMetadata.FromString(entry.metadata)
                if metadata.marker_type == UPDATE and metadata.replicated_from:
                    await self._apply(partition, metadata.replicated_from, marker_payload(entry.data)[1],
                                      entry.position)
                    count += 1
            position = entries[-1].position
            await asyncio.sleep(0)
        if count:
            log.info("%s: %d stored updates applied again", partition.name, count)

    async def _apply(self, partition: PartitionLog, source: str, payload: bytes, position: Position) -> None:
        if UPDATES_CURSOR not in partition.ledger.cursors:  # durable before the first UPDATE is acted on
            cursor = partition.ledger.open_cursor(UPDATES_CURSOR, initial=BEFORE_FIRST)
            await cursor.reset(BEFORE_FIRST, {})
        update = ReplicatedSubscriptionsUpdate.FromString(payload)
        mine = next((c.message_id for c in update.clusters if c.cluster == self.local), None)
        if mine is not None:
            outcome = await self._move(partition, update.subscription_name, Position(mine.ledger_id, mine.entry_id),
                                       frozenset(update.covered_clusters), source)
            if outcome != ErrorCode.NONE:
                self._behind.add(partition)  # applied again when the partition is loaded next
        await self._applied(partition, position)

    async def _move(self, partition: PartitionLog, group: str, position: Position, covered: frozenset[str],
                    source: str) -> ErrorCode:
        """Move the group toward `position`, not past a record the snapshot did not cover; NONE when done or when
        there was nothing to do."""
        target = offset_after(partition, position)
        current = self.groups.newest_offset(group, partition.topic, partition.partition)
        if target is None or (current is not None and current >= target):
            return ErrorCode.NONE  # gone (retention), or never backwards
        offset = target
        if covered:
            start = partition.log_start_offset if current is None else current
            held = await first_uncovered(partition, start, position, covered, self.local)
            self._log_held(partition, group, held, target, source)
            offset = target if held is None else held
            current = self.groups.newest_offset(group, partition.topic, partition.partition)  # read again
            if current is not None and current >= offset:
                return ErrorCode.NONE
        self.groups.offsets.replicated.add(group)  # created here as a replicated group, as Pulsar does
        outcome = await self.groups.commit(group, partition.topic, partition.partition, offset)
        if outcome == ErrorCode.NONE:
            log.info("%s: group %s moved to offset %d by an update from %s", partition.name, group, offset, source)
        else:  # applied again at the next load; in a cluster of brokers, only the group's coordinator can
            log.warning("%s: group %s not moved to offset %d by an update from %s: %s", partition.name, group,
                        offset, source, outcome.name)
        return outcome

    def _log_held(self, partition: PartitionLog, group: str, held: int | None, target: int, source: str) -> None:
        key = (partition.name, group)
        if held is None:
            self._held.pop(key, None)
        elif self._held.get(key) != held:  # once per place it is held at, not every update
            self._held[key] = held
            log.info("%s: group %s held at offset %d (not %d): a record from a cluster %s's snapshot did not cover",
                     partition.name, group, held, target, source)

    async def _applied(self, partition: PartitionLog, position: Position) -> None:
        """Every UPDATE stored up to `position` is applied durably (unless one failed in this run: then they are all
        read again at the next load)."""
        if partition in self._behind:
            return
        cursor = partition.ledger.cursors[UPDATES_CURSOR]
        if position > cursor.mark_delete_position:
            await cursor.mark_delete(position)
