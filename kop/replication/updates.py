"""PIP-33 UPDATE markers another cluster's replicator stored here: each moves the named group's committed offset on
the partition to the position it gives for this cluster, forward only, creating the group as a replicated one if
needed (Pulsar's receiveSubscriptionUpdated), through the group's coordinator wherever it is
(kop/replication/group_positions.py).

The UPDATEs stored on a partition are applied one after the other, in log order, and the cursor `pulsar.updates`
records the last one whose effect is durable. One that fails (its coordinator unreachable or loading, a failed
write) is tried again with a growing pause (0.1 s to 5 s), the later ones waiting behind it, until it is applied or
the partition leaves this broker. After a restart (or wherever the partition is loaded next) the UPDATEs stored
after the cursor are read back from the log and applied again first (moving a group is idempotent: never
backwards), so an UPDATE whose commit was lost to a crash is not lost with it: the group's last position may have no
other UPDATE coming (its source cluster is the one that went down).

A snapshot lists the clusters whose records its positions cover (`covered_clusters`): the group is moved only up to
its first record here, after its current position, from any other cluster, which it cannot have consumed where it
was (this cluster's own records when it does not replicate back to the source, a cluster that was down or that
does not replicate to the source). An UPDATE without the list (from an older kop) counts every cluster as covered.
"""
import asyncio
import logging
import weakref
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from kop.ledger import ManagedLedgerError, Position
from kop.ledger.position import BEFORE_FIRST
from kop.partition import PartitionLog
from kop.replication.group_positions import GroupPosition, GroupPositions
from kop.replication.coverage import FromTheStart, first_uncovered
from kop.replication.snapshots import REBUILD_BATCH, REBUILD_BYTES, offset_after
from proto.kop_pb2 import MarkerType, MessageMetadata, ReplicatedSubscriptionsUpdate
from protocol.errors import ErrorCode
from protocol.records import marker_payload

log = logging.getLogger(__name__)

UPDATES_CURSOR = "pulsar.updates"  # the last UPDATE stored here whose effect is durable (holds nothing back)
UPDATE = MarkerType.REPLICATED_SUBSCRIPTION_UPDATE
FIRST_PAUSE_S = 0.1  # after an UPDATE failed, doubled at each failure ...
MAX_PAUSE_S = 5.0  # ... up to this
MOVE_ATTEMPTS = 5  # the group moved by a commit of its own between reading where it is and moving it: read again
NEVER_APPLICABLE = frozenset({ErrorCode.INVALID_GROUP_ID})  # a name no group here can have: skipped, not retried


class UpdateFailed(Exception):
    """An UPDATE not applied now; tried again after a pause."""


class UpdateNeverApplicable(Exception):
    """An UPDATE no group here can take: skipped."""


EXPECTED = (UpdateFailed, OSError, ManagedLedgerError)  # failures that need no traceback in the log


@dataclass(frozen=True, slots=True)
class StoredUpdate:
    source: str
    payload: bytes
    position: Position


class UpdateApplier:
    def __init__(self, local: str, positions: GroupPositions,
                 served: Callable[[PartitionLog], bool] = lambda partition: True) -> None:
        """served(partition): whether this broker still serves the partition (a worker stops retrying once not)."""
        self.local = local
        self.positions = positions
        self._served = served
        self._started: weakref.WeakSet[PartitionLog] = weakref.WeakSet()  # their stored UPDATEs read back
        self._queues: dict[PartitionLog, deque[StoredUpdate]] = {}  # handed over, not applied yet
        self._workers: dict[PartitionLog, asyncio.Task] = {}  # gone once its queue is empty
        self._held: dict[tuple[str, str], int] = {}  # (partition, group) -> the offset its updates hold it at
        self.from_the_start = FromTheStart(local, UPDATES_CURSOR)  # for the groups an UPDATE creates
        self.failures = 0  # attempts that failed and were retried (stats)

    def stored(self, partition: PartitionLog, source: str, payload: bytes, position: Position) -> None:
        """An UPDATE marker a replicator of `source` stored here, at `position`, is durable."""
        self._queues.setdefault(partition, deque()).append(StoredUpdate(source, payload, position))
        self._wake(partition)

    def recover(self, partition: PartitionLog) -> None:
        """Apply the UPDATEs a previous run stored here and did not apply (once per partition loaded)."""
        if partition not in self._started and UPDATES_CURSOR in partition.ledger.cursors:
            self._wake(partition)

    async def settled(self, partition: PartitionLog) -> None:
        """Until the partition's UPDATEs handed over so far are applied (tests)."""
        worker = self._workers.get(partition)
        if worker is not None:
            await asyncio.gather(worker, return_exceptions=True)

    async def stop(self) -> None:
        workers = list(self._workers.values())
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)

    def _wake(self, partition: PartitionLog) -> None:
        if partition not in self._workers:
            task = asyncio.ensure_future(self._work(partition))
            self._workers[partition] = task
            task.add_done_callback(lambda done: self._finished(partition, done))

    def _finished(self, partition: PartitionLog, task: asyncio.Task) -> None:
        if self._workers.get(partition) is task:
            del self._workers[partition]
        if not task.cancelled() and task.exception() is not None:
            log.error("%s: the updates of replicated groups stopped", partition.name, exc_info=task.exception())
        if partition in self._queues and self._served(partition) and not task.cancelled() \
                and task.exception() is None:
            self._wake(partition)  # handed over after the worker's last look at its queue

    async def _work(self, partition: PartitionLog) -> None:
        if partition not in self._started:
            self._started.add(partition)
            if not await self._retrying(partition, lambda: self._reapply_stored(partition)):
                return
        queue = self._queues.get(partition)
        while queue:
            update = queue[0]
            if not await self._retrying(partition, lambda: self._apply(partition, update)):
                return
            queue.popleft()
        self._queues.pop(partition, None)

    async def _retrying(self, partition: PartitionLog, attempt: Callable[[], Awaitable[None]]) -> bool:
        """Run `attempt` until it succeeds, pausing longer after each failure; False once this broker no longer
        serves the partition (whoever loads it next applies what is left, from the cursor)."""
        pause, failed = FIRST_PAUSE_S, 0
        while True:
            try:
                await attempt()
                if failed:
                    log.info("%s: an update of a replicated group applied after %d failed attempts", partition.name,
                             failed)
                return True
            except Exception as exc:  # noqa: BLE001 - a coordinator, a disk or a database that fails now
                if not self._served(partition):
                    self._queues.pop(partition, None)
                    return False
                failed += 1
                self.failures += 1
                if failed == 1:
                    log.warning("%s: an update of a replicated group failed: %s; trying again, in log order",
                                partition.name, exc, exc_info=not isinstance(exc, EXPECTED))
                await asyncio.sleep(pause)
                pause = min(MAX_PAUSE_S, pause * 2)

    async def _reapply_stored(self, partition: PartitionLog) -> None:
        cursor = partition.ledger.cursors.get(UPDATES_CURSOR)
        if cursor is None:
            return
        position, count = cursor.mark_delete_position, 0
        while entries := await partition.ledger.read_after_async(position, REBUILD_BATCH, REBUILD_BYTES):
            for entry in entries:
                if entry.span:
                    continue  # records: only markers cover no offset
                metadata = MessageMetadata.FromString(entry.metadata)
                if metadata.marker_type == UPDATE and metadata.replicated_from:
                    await self._apply(partition, StoredUpdate(metadata.replicated_from, marker_payload(entry.data)[1],
                                                              entry.position))
                    count += 1
            position = entries[-1].position
            await asyncio.sleep(0)
        if count:
            log.info("%s: %d stored updates applied again", partition.name, count)

    async def _apply(self, partition: PartitionLog, stored: StoredUpdate) -> None:
        if UPDATES_CURSOR not in partition.ledger.cursors:  # durable before the first UPDATE is acted on
            cursor = partition.ledger.open_cursor(UPDATES_CURSOR, initial=BEFORE_FIRST)
            await cursor.reset(BEFORE_FIRST, {})
        update = ReplicatedSubscriptionsUpdate.FromString(stored.payload)
        mine = next((c.message_id for c in update.clusters if c.cluster == self.local), None)
        if mine is not None:
            try:
                await self._move(partition, update.subscription_name, Position(mine.ledger_id, mine.entry_id),
                                 frozenset(update.covered_clusters), stored.source)
            except UpdateNeverApplicable as exc:
                log.warning("%s: an update from %s skipped: %s", partition.name, stored.source, exc)
        cursor = partition.ledger.cursors[UPDATES_CURSOR]
        if stored.position > cursor.mark_delete_position:
            await cursor.mark_delete(stored.position, {**cursor.properties,
                                                       **self.from_the_start.properties(partition)})

    async def _move(self, partition: PartitionLog, group: str, position: Position, covered: frozenset[str],
                    source: str) -> None:
        """Move the group toward `position`, not past a record the snapshot did not cover; raises UpdateFailed."""
        target = offset_after(partition, position)
        if target is None:
            return  # gone (retention)
        topic, index = partition.topic, partition.partition
        current = self._checked(group, await self.positions.where(group, topic, index), source)
        for _ in range(MOVE_ATTEMPTS):
            if current is not None and current >= target:
                return  # never backwards
            offset = target
            if covered:
                held = await self.from_the_start.first_uncovered(partition, position, covered) if current is None \
                    else await first_uncovered(partition, current, position, covered, self.local)
                self._log_held(partition, group, held, target, source)
                offset = target if held is None else held
                if current is not None and current >= offset:
                    return
            found = await self.positions.move(group, topic, index, offset, current)
            self._checked(group, found, source)
            if found.moved:
                log.info("%s: group %s moved to offset %d by an update from %s", partition.name, group, offset,
                         source)
                return
            current = found.offset  # it committed meanwhile: again from where it is now
        raise UpdateFailed(f"group {group} kept moving while an update from {source} was applied")

    @staticmethod
    def _checked(group: str, found: GroupPosition, source: str) -> int | None:
        if found.error in NEVER_APPLICABLE:
            raise UpdateNeverApplicable(f"group {group!r}: {found.error.name}")
        if found.error != ErrorCode.NONE:
            raise UpdateFailed(f"group {group} not moved by an update from {source}: {found.error.name}")
        return found.offset

    def _log_held(self, partition: PartitionLog, group: str, held: int | None, target: int, source: str) -> None:
        key = (partition.name, group)
        if held is None:
            self._held.pop(key, None)
        elif self._held.get(key) != held:  # once per place it is held at, not every update
            self._held[key] = held
            log.info("%s: group %s held at offset %d (not %d): a record from a cluster %s's snapshot did not cover",
                     partition.name, group, held, target, source)
