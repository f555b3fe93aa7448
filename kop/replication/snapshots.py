"""PIP-33 for Kafka consumer groups, per partition: snapshots of where the other clusters are, and the updates that
move a replicated group's committed offsets there.

Every `replicatedSubscriptionsSnapshotFrequencyMillis`, a partition that replicates, holds a replicated group and
got new data since the last snapshot started writes a REQUEST marker. The replicators carry it to every remote. A
remote that replicates this topic back answers with a RESPONSE marker addressed to this cluster alone (Pulsar's
way): it travels behind everything that remote wrote before it, so the position where it lands here covers all of
that remote's data the remote position covers. A remote that does not replicate back (a one-way standby) answers in
the ReplicateEntries response itself, with where it stored the REQUEST: nothing of its own flows here, so the
REQUEST's local position is the one to pair it with (Pulsar cannot snapshot one-way setups, #9341). With more than
one remote a second round follows, as in Pulsar. The SNAPSHOT marker records the first round's remote positions and
the local position of the last answer; it stays here.

A group's committed offset passing a snapshot's local position writes an UPDATE naming the group and the remote
positions; the remote moves the group's committed offset there (never backwards), creating it if needed. The check
runs on every tick rather than on each commit, so a group that stopped committing still gets its last position
replicated once a snapshot behind it completes (Pulsar #19551). A snapshot that times out (an answer lost) is taken
again at the next tick, with or without new data, so the data it covered still gets a snapshot once traffic stops.

Completed snapshots are kept per group, as Pulsar keeps them per subscription: those the group has not passed yet,
at most `max_cached`, thinned evenly over the range between its committed offset and the head when there are more.
A group far behind the newest data thus still passes snapshots and gets its position replicated as it catches up.

After a restart (or wherever the partition is loaded next) the cache is rebuilt before anything else is done: the
SNAPSHOT markers stored here from the oldest replicated group's position on are read back, as Pulsar's
subscriptions find them again when they read past them. A group that commits after a restart, with no new data to
snapshot, thus still gets its position replicated.

Markers cover no Kafka offset (partition.publish_marker), so snapshots never disturb offsets, lag or fetches."""
import asyncio
import bisect
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from kop.groups.offsets import replicated_offsets
from kop.ledger import Position
from kop.ledger.position import BEFORE_FIRST
from kop.partition import PartitionLog
from proto.kop_pb2 import (ClusterMessageId, MarkersMessageIdData, MarkerType, MessageMetadata,
                           ReplicatedSubscriptionsSnapshot, ReplicatedSubscriptionsSnapshotRequest,
                           ReplicatedSubscriptionsUpdate)
from protocol.records import marker_payload

log = logging.getLogger(__name__)
REBUILD_BATCH = 1000  # entries read at a time when the cache is rebuilt ...
REBUILD_BYTES = 1 << 20  # ... and bytes (the first entry whatever its size), the event loop served in between


def offset_after(partition: PartitionLog, position: Position) -> int | None:
    """The Kafka offset that follows the entry at `position` (a marker's own first index: it covers none)."""
    found = partition.ledger.offsets_of(position)
    return None if found is None else found[0] + found[1]


def scan_start(partition: PartitionLog, offset: int) -> Position:
    """Where to look for the snapshots a group at `offset` may not have passed, or passed last: after the entry
    before the one holding the offset before it (from the first entry when there is none)."""
    index = min(offset, partition.high_watermark) - 1
    found = partition.ledger.position_of_index(index) if index >= partition.log_start_offset else None
    return BEFORE_FIRST if found is None else Position(found.ledger_id, found.entry_id - 1)


def message_id(position: Position) -> MarkersMessageIdData:
    return MarkersMessageIdData(ledger_id=position.ledger_id, entry_id=position.entry_id)


class StoredRequests:
    """Where this cluster stored the REQUEST markers it answered in ReplicateEntries responses (as a one-way
    standby), the newest `limit`: a REQUEST sent again because the response was lost is found stored by its source
    position, and is answered from here rather than not at all. After a restart, the requester's timeout retakes
    the snapshot instead."""

    def __init__(self, limit: int = 4096) -> None:
        self._limit = limit
        self._positions: OrderedDict[tuple[str, str], Position] = OrderedDict()

    def remember(self, partition: str, snapshot_id: str, position: Position) -> None:
        self._positions[(partition, snapshot_id)] = position
        if len(self._positions) > self._limit:
            self._positions.popitem(last=False)

    def position(self, partition: str, snapshot_id: str) -> Position | None:
        return self._positions.get((partition, snapshot_id))


@dataclass
class PendingSnapshot:
    snapshot_id: str
    remotes: frozenset[str]
    rounds: int
    started: float
    end: int  # the partition's high watermark when it was requested
    round: int = 1
    missing: set[str] = field(default_factory=set)
    clusters: dict[str, Position] = field(default_factory=dict)  # first-round answers win
    local: Position | None = None  # local position of the latest answer
    covered: set[str] = field(default_factory=set)  # clusters whose records the positions cover


@dataclass(frozen=True, slots=True)
class Snapshot:
    snapshot_id: str
    local_offset: int  # a group whose committed offset reaches it has consumed everything the snapshot covers
    clusters: tuple[tuple[str, Position], ...]
    # The clusters whose records the remote positions cover: this one, and those that answered with a RESPONSE
    # marker (their records travelled here ahead of it). A remote that answered in its ReplicateEntries response (a
    # one-way standby) or was not asked (down) is not: its own records there were never here. None: all (a
    # snapshot stored before kop kept this).
    covered: frozenset[str] | None = None


def add_thinned(cache: list[Snapshot], snapshot: Snapshot, limit: int) -> None:
    """Add a snapshot to a group's cache (ordered by local offset); past `limit` (3 at least, the setting's
    minimum), drop the inner snapshot whose neighbours are closest, so what is kept spreads evenly from the group's
    position to the newest."""
    bisect.insort(cache, snapshot, key=lambda s: s.local_offset)
    while len(cache) > limit:
        inner = min(range(1, len(cache) - 1), key=lambda i: cache[i + 1].local_offset - cache[i - 1].local_offset)
        del cache[inner]


@dataclass(frozen=True, slots=True)
class SnapshotSettings:
    frequency_s: float
    timeout_s: float
    max_cached: int


class SnapshotController:
    def __init__(self, partition: PartitionLog, local: str, remotes: Callable[[], list[str]],
                 connected: Callable[[str], bool], settings: SnapshotSettings,
                 replicated: Callable[[], dict[str, int]] | None = None) -> None:
        """connected(remote): whether the replicator toward that remote is working; replicated(): the committed
        offsets of the partition's replicated groups, as their coordinator knows them (by default, read from the
        flagged group cursors of the partition's ledger)."""
        self.partition = partition
        self.replicated_groups = replicated or (lambda: replicated_offsets(partition.ledger, every=False))
        self.local = local
        self._remotes = remotes
        self._connected = connected
        self.settings = settings
        self.pending: dict[str, PendingSnapshot] = {}
        self.recent: list[Snapshot] = []  # completed ones spread over the partition's history, for a new group
        self.cached: dict[str, list[Snapshot]] = {}  # group -> the snapshots it has not passed yet
        self.completed_count = self.timed_out_count = self.updates_written = 0
        self._end_at_last_request = -1
        self._rebuilt = False  # the cache holds the snapshots stored before this controller started
        self._busy = False
        self._writes: set[asyncio.Task] = set()  # markers written from an answer, held until done

    async def tick(self, now: float | None = None) -> None:
        if self._busy:
            return
        self._busy = True
        try:
            await self._tick(time.monotonic() if now is None else now)
        finally:
            self._busy = False

    async def _tick(self, now: float) -> None:
        for snapshot_id, pending in list(self.pending.items()):
            if now - pending.started > self.settings.timeout_s:
                del self.pending[snapshot_id]
                self.timed_out_count += 1
                if pending.end == self._end_at_last_request:  # taken again, even with no new data
                    self._end_at_last_request = -1
                log.info("%s: snapshot %s timed out waiting for %s", self.partition.name, snapshot_id,
                         sorted(pending.missing))
        remotes = self._remotes()
        groups = self.replicated_groups()
        if not remotes or not groups:
            return
        if not self._rebuilt:
            await self._rebuild(min(groups.values()))
        await self._send_updates(groups)
        end = self.partition.high_watermark  # markers do not move it: no new data, no new snapshot
        # Beyond Pulsar, which stops every snapshot while one cluster is down: the clusters that are up keep
        # snapshotting among themselves (docs/geo-replication.md says what that trades).
        reachable = [remote for remote in remotes if self._connected(remote)]
        if end == self._end_at_last_request or not reachable:
            return
        if self.pending and not self.completed_count:
            return  # none ever completed: retry at the timeout's pace, not every tick (Pulsar #23839)
        pending = PendingSnapshot(uuid.uuid4().hex, frozenset(reachable), 2 if len(reachable) > 1 else 1, now, end)
        pending.missing = set(pending.remotes)
        pending.covered = {self.local}
        self.pending[pending.snapshot_id] = pending
        self._end_at_last_request = end
        await self._request(pending)

    async def _rebuild(self, oldest_group_offset: int) -> None:
        """Cache the snapshots whose SNAPSHOT markers are stored here from the oldest group's position on."""
        position, found = scan_start(self.partition, oldest_group_offset), 0
        while entries := await self.partition.ledger.read_after_async(position, REBUILD_BATCH, REBUILD_BYTES):
            for entry in entries:
                if entry.span:
                    continue  # records: only markers cover no offset
                metadata = MessageMetadata.FromString(entry.metadata)
                if metadata.marker_type == MarkerType.REPLICATED_SUBSCRIPTION_SNAPSHOT and \
                        not metadata.replicated_from:
                    found += self._cache_stored(ReplicatedSubscriptionsSnapshot.FromString(
                        marker_payload(entry.data)[1]))
            position = entries[-1].position
            await asyncio.sleep(0)  # let the broker serve others during a long scan
        self._rebuilt = True
        if found:
            log.info("%s: %d stored snapshots cached again", self.partition.name, found)

    def _cache_stored(self, stored: ReplicatedSubscriptionsSnapshot) -> bool:
        local = stored.local_message_id
        local_offset = offset_after(self.partition, Position(local.ledger_id, local.entry_id))
        if local_offset is None:
            return False  # its local entry is gone (retention)
        clusters = tuple((c.cluster, Position(c.message_id.ledger_id, c.message_id.entry_id))
                         for c in stored.clusters)
        snapshot = Snapshot(stored.snapshot_id, local_offset, clusters, frozenset(stored.covered_clusters) or None)
        add_thinned(self.recent, snapshot, self.settings.max_cached)
        return True

    async def _request(self, pending: PendingSnapshot) -> None:
        payload = ReplicatedSubscriptionsSnapshotRequest(snapshot_id=pending.snapshot_id, source_cluster=self.local)
        result = await self.partition.publish_marker(MarkerType.REPLICATED_SUBSCRIPTION_SNAPSHOT_REQUEST,
                                                     payload.SerializeToString())
        if result.error:
            log.warning("%s: snapshot request not written: %s", self.partition.name, result.message)

    def received_response(self, snapshot_id: str, cluster: str, remote: Position, local: Position,
                          in_band: bool = False) -> None:
        """An answer to a REQUEST: `remote` is where `cluster` stored it, `local` the local position it pairs with;
        `in_band`: given in a ReplicateEntries response (a cluster that does not replicate back), not a marker."""
        pending = self.pending.get(snapshot_id)
        if pending is None or cluster not in pending.missing:
            return  # late (timed out) or repeated
        pending.missing.discard(cluster)
        if pending.round == 1 and not in_band:
            pending.covered.add(cluster)
        pending.clusters.setdefault(cluster, remote)
        pending.local = max(pending.local or local, local)
        if pending.missing:
            return
        if pending.round < pending.rounds:
            pending.round += 1
            pending.missing = set(pending.remotes)
            self._spawn(self._request(pending))
        else:
            self._spawn(self._complete(pending))

    def _spawn(self, work) -> None:
        task = asyncio.ensure_future(work)
        self._writes.add(task)
        task.add_done_callback(self._written)

    def _written(self, task: asyncio.Task) -> None:
        self._writes.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s: snapshot marker not written: %s", self.partition.name, task.exception())

    async def _complete(self, pending: PendingSnapshot) -> None:
        clusters = sorted(pending.clusters.items())
        payload = ReplicatedSubscriptionsSnapshot(
            snapshot_id=pending.snapshot_id, local_message_id=message_id(pending.local),
            clusters=[ClusterMessageId(cluster=name, message_id=message_id(p)) for name, p in clusters],
            covered_clusters=sorted(pending.covered))
        result = await self.partition.publish_marker(MarkerType.REPLICATED_SUBSCRIPTION_SNAPSHOT,
                                                     payload.SerializeToString(), replicate_to=(self.local,))
        local_offset = offset_after(self.partition, pending.local)
        if result.error or local_offset is None:
            return  # complete only once its marker is durable (Pulsar #26119); retried after the timeout
        self.pending.pop(pending.snapshot_id, None)
        snapshot = Snapshot(pending.snapshot_id, local_offset, tuple(clusters), frozenset(pending.covered))
        add_thinned(self.recent, snapshot, self.settings.max_cached)
        for cache in self.cached.values():
            add_thinned(cache, snapshot, self.settings.max_cached)
        self.completed_count += 1
        await self._send_updates(self.replicated_groups())

    async def _send_updates(self, groups: dict[str, int]) -> None:
        """An UPDATE for every group that passed a cached snapshot, written together (one fsync for them all)."""
        for gone in self.cached.keys() - groups.keys():
            del self.cached[gone]
        sent: list[tuple[list[Snapshot], Snapshot, asyncio.Future]] = []
        for group, committed in groups.items():
            cache = self.cached.setdefault(group, list(self.recent))
            passed = bisect.bisect_right(cache, committed, key=lambda s: s.local_offset)
            if not passed:
                continue
            snapshot = cache[passed - 1]
            payload = ReplicatedSubscriptionsUpdate(subscription_name=group, clusters=[
                ClusterMessageId(cluster=name, message_id=message_id(p)) for name, p in snapshot.clusters],
                covered_clusters=sorted(snapshot.covered or ()))
            sent.append((cache, snapshot, self.partition.publish_marker(MarkerType.REPLICATED_SUBSCRIPTION_UPDATE,
                                                                        payload.SerializeToString())))
        for cache, snapshot, written in sent:
            if not (await written).error:  # otherwise tried again at the next tick
                # By value: a snapshot may have completed meanwhile.
                cache[:] = [s for s in cache if s.local_offset > snapshot.local_offset]
                self.updates_written += 1

    def to_json(self) -> dict:
        return {"pendingSnapshots": len(self.pending), "completedSnapshots": self.completed_count,
                "timedOutSnapshots": self.timed_out_count, "updatesWritten": self.updates_written,
                "cachedSnapshots": len({s.snapshot_id for cache in self.cached.values() for s in cache})}
