"""Runs the replicators this broker's topics need: for each partition of each topic, one per cluster in the topic's
`replication_clusters` policy (topic -> namespace) other than this one and known to the clusters registry. Checked
twice a second and after every admin change, so a policy or registry change takes effect without a restart. A
replicator that is no longer wanted (the cluster left the list) is stopped and its cursor deleted, as Pulsar
removes a replicator's; one whose topic was deleted goes with it.

It also runs a PIP-33 snapshot controller for each partition that replicates (kop/replication/snapshots.py), and
acts on the markers replicators of other clusters store here: a REQUEST is answered with a RESPONSE marker toward
its source (when this cluster replicates the topic back), a RESPONSE goes to the partition's controller, and an
UPDATE goes to the update applier (kop/replication/updates.py), which moves the named group's committed offset."""
import asyncio
import contextlib
import logging

from kop.config import BrokerConfig
from kop.groups import GroupCoordinator
from kop.ledger import CursorNotFoundError, Position
from kop.partition import REPLICATOR_CURSOR_PREFIX, PartitionLog
from kop.policies import PolicyBook
from kop.replication.clusters import ClusterRegistry
from kop.replication.link import RemoteLink
from kop.replication.replicator import Replicator, cursor_name
from kop.replication.snapshots import SnapshotController, SnapshotSettings, StoredRequests, message_id
from kop.replication.updates import UpdateApplier
from kop.topics import INTERNAL_PREFIX, TopicManager
from proto.kop_pb2 import (ClusterMessageId, MarkerType, MessageMetadata, ReplicatedSubscriptionsSnapshotRequest,
                           ReplicatedSubscriptionsSnapshotResponse, ReplicatedSubscriptionsUpdate)
from protocol.records import marker_payload

log = logging.getLogger(__name__)
CHECK_INTERVAL_S = 0.5

Key = tuple[str, int, str]  # topic, partition, remote cluster


class ReplicationService:
    def __init__(self, config: BrokerConfig, topics: TopicManager, policies: PolicyBook,
                 clusters: ClusterRegistry, groups: GroupCoordinator) -> None:
        self.local = config.cluster_name
        self.topics = topics
        self.policies = policies
        self.clusters = clusters
        self.groups = groups
        self.snapshots_enabled = config.enable_replicated_subscriptions
        self.settings = SnapshotSettings(config.replicated_subscriptions_snapshot_frequency_millis / 1000,
                                         config.replicated_subscriptions_snapshot_timeout_seconds,
                                         config.replicated_subscriptions_snapshot_max_cached_per_subscription)
        self.replicators: dict[Key, Replicator] = {}
        self.controllers: dict[tuple[str, int], SnapshotController] = {}
        self.stored_requests = StoredRequests()  # REQUESTs answered in ReplicateEntries responses
        self._snapshot_task: asyncio.Task | None = None
        self._ticks: set[asyncio.Task] = set()  # snapshot ticks running
        self.updates = UpdateApplier(self.local, groups)  # UPDATE markers stored here
        self._links: dict[str, RemoteLink] = {}
        self._task: asyncio.Task | None = None
        self._lock = asyncio.Lock()
        # Set on every partition as it is opened: a marker stored before the first check of the replicators (a
        # topic created by replication, a partition moved here) is acted on too; an UPDATE dropped is lost.
        topics.marker_listener = self._on_marker

    def start(self) -> None:
        self._share_producer_ids()
        self._task = asyncio.create_task(self._loop())
        if self.snapshots_enabled:
            self._snapshot_task = asyncio.create_task(self._snapshot_loop())

    async def _snapshot_loop(self) -> None:
        """Every period, a tick of every partition's controller, all at once: each waits for its own markers'
        fsync, and one after the other the period would grow with the number of partitions. A controller whose
        last tick is still running skips this one."""
        loop = asyncio.get_running_loop()
        due = loop.time()
        while True:
            due += self.settings.frequency_s
            await asyncio.sleep(max(0.0, due - loop.time()))
            due = max(due, loop.time() - self.settings.frequency_s)  # after a stall: no burst of ticks to catch up
            for controller in list(self.controllers.values()):
                task = asyncio.ensure_future(self._tick(controller))
                self._ticks.add(task)
                task.add_done_callback(self._ticks.discard)

    @staticmethod
    async def _tick(controller: SnapshotController) -> None:
        try:
            await controller.tick()
        except Exception:
            log.exception("%s: snapshot tick failed", controller.partition.name)

    async def _loop(self) -> None:
        while True:
            try:
                await self.reconcile()
            except Exception:
                log.exception("replication: checking the replicators failed")
            await asyncio.sleep(CHECK_INTERVAL_S)

    def remotes(self, topic: str) -> list[str]:
        """The clusters this topic's partitions replicate to."""
        if topic.startswith(INTERNAL_PREFIX):
            return []
        return [name for name in self.policies.resolve(topic).replication_clusters
                if name != self.local and name in self.clusters.clusters]

    def replicators_of(self, partition: PartitionLog) -> dict[str, Replicator]:
        return {remote: r for (topic, index, remote), r in self.replicators.items()
                if topic == partition.topic and index == partition.partition and r.partition is partition}

    async def reconcile(self) -> None:
        async with self._lock:
            self._share_producer_ids()
            self._refresh_links()
            wanted: dict[Key, PartitionLog] = {}
            controlled: dict[tuple[str, int], PartitionLog] = {}
            topic_ids: dict[str, bytes] = {}
            for topic in list(self.topics.topics.values()):
                remotes = self.remotes(topic.name)
                topic_ids[topic.name] = topic.topic_id
                for partition in topic.partitions:
                    if self.snapshots_enabled:
                        self.updates.recover(partition)
                    if remotes:
                        controlled[(topic.name, partition.partition)] = partition
                    for remote in remotes:
                        wanted[(topic.name, partition.partition, remote)] = partition
            self._place_controllers(controlled)
            for key, replicator in list(self.replicators.items()):
                if wanted.get(key) is not replicator.partition:
                    del self.replicators[key]
                    await self._retire(key, replicator)
            await self._delete_stale_cursors(wanted)
            for key, partition in wanted.items():
                if key not in self.replicators:
                    self._start(key, partition, topic_ids[key[0]])

    def _start(self, key: Key, partition: PartitionLog, topic_id: bytes) -> None:
        name, _, remote = key

        def partition_count() -> int:
            topic = self.topics.get(name)
            return topic.count if topic is not None else partition.partition + 1

        replicator = Replicator(partition, topic_id, partition_count, self.local, remote,
                                lambda: self._links.get(remote),
                                lambda *answer: self._snapshot_answer(partition, *answer, in_band=True),
                                lambda: self.policies.resolve(name).message_ttl_seconds)
        self.replicators[key] = replicator
        replicator.start()
        log.info("replicator %s -> %s started at %s", partition.name, remote, replicator.cursor.mark_delete_position)

    async def _retire(self, key: Key, replicator: Replicator) -> None:
        await replicator.stop()
        partition = replicator.partition
        topic = self.topics.get(partition.topic)
        if topic is not None and topic.partition(partition.partition) is partition:  # only the policy changed
            with contextlib.suppress(CursorNotFoundError):
                await partition.ledger.delete_cursor(cursor_name(key[2]))
        log.info("replicator %s -> %s stopped", partition.name, key[2])

    async def _delete_stale_cursors(self, wanted: dict[Key, PartitionLog]) -> None:
        """Delete the replicator cursors no replicator is wanted for: left by a broker killed while it retired one,
        or found by a broker whose registry or policies lack the remote (a PostgreSQL engine's partitions opened
        from another data directory). Pulsar deletes them when it loads a topic: they hold retention back."""
        for topic in list(self.topics.topics.values()):
            for partition in topic.partitions:
                for name in [name for name in partition.ledger.cursors if name.startswith(REPLICATOR_CURSOR_PREFIX)]:
                    if (topic.name, partition.partition, name.removeprefix(REPLICATOR_CURSOR_PREFIX)) not in wanted:
                        with contextlib.suppress(CursorNotFoundError):
                            await partition.ledger.delete_cursor(name)
                        log.info("%s: cursor %s deleted: no replicator is wanted for it", partition.name, name)

    def _place_controllers(self, wanted: dict[tuple[str, int], PartitionLog]) -> None:
        for key, controller in list(self.controllers.items()):
            if wanted.get(key) is not controller.partition:
                del self.controllers[key]
        for key, partition in wanted.items():
            if key not in self.controllers:
                self.controllers[key] = SnapshotController(
                    partition, self.local, lambda topic=key[0]: self.remotes(topic),
                    lambda remote, p=partition: self._replicating(p, remote), self.settings,
                    lambda topic=key[0], index=key[1]: self.groups.replicated_on(
                        topic, index, self.policies.resolve(topic).replicated_subscriptions))

    def _replicating(self, partition: PartitionLog, remote: str) -> bool:
        """Not failing: an idle replicator has no connection yet, and its first request (the snapshot's) opens it."""
        replicator = self.replicators_of(partition).get(remote)
        return replicator is not None and replicator.stats.last_error is None

    def controller_of(self, partition: PartitionLog) -> SnapshotController | None:
        controller = self.controllers.get((partition.topic, partition.partition))
        return controller if controller is not None and controller.partition is partition else None

    def _snapshot_answer(self, partition: PartitionLog, snapshot_id: str, remote: str, at_remote: Position,
                         here: Position, in_band: bool = False) -> None:
        controller = self.controller_of(partition)
        if controller is not None:
            controller.received_response(snapshot_id, remote, at_remote, here, in_band)

    # ---- markers other clusters' replicators stored here

    def _on_marker(self, partition: PartitionLog, metadata: MessageMetadata, batch: bytes, position: Position) -> None:
        kind = metadata.marker_type
        handler = {MarkerType.REPLICATED_SUBSCRIPTION_SNAPSHOT_REQUEST: self._on_request,
                   MarkerType.REPLICATED_SUBSCRIPTION_SNAPSHOT_RESPONSE: self._on_response,
                   MarkerType.REPLICATED_SUBSCRIPTION_UPDATE: self._on_update}.get(kind)
        if handler is None or not self.snapshots_enabled:
            return
        try:
            handler(partition, metadata, marker_payload(batch)[1], position)
        except Exception:
            log.exception("%s: marker %d at %s not handled", partition.name, kind, position)

    def _on_request(self, partition: PartitionLog, metadata: MessageMetadata, payload: bytes,
                    position: Position) -> None:
        source = metadata.replicated_from
        if source not in self.remotes(partition.topic):
            return  # answered in the ReplicateEntries response (kop/handlers/replication.py)
        request = ReplicatedSubscriptionsSnapshotRequest.FromString(payload)
        response = ReplicatedSubscriptionsSnapshotResponse(
            snapshot_id=request.snapshot_id,
            cluster=ClusterMessageId(cluster=self.local, message_id=message_id(position)))
        asyncio.ensure_future(partition.publish_marker(MarkerType.REPLICATED_SUBSCRIPTION_SNAPSHOT_RESPONSE,
                                                       response.SerializeToString(), replicate_to=(source,)))

    def _on_response(self, partition: PartitionLog, metadata: MessageMetadata, payload: bytes,
                     position: Position) -> None:
        response = ReplicatedSubscriptionsSnapshotResponse.FromString(payload)
        at_remote = Position(response.cluster.message_id.ledger_id, response.cluster.message_id.entry_id)
        self._snapshot_answer(partition, response.snapshot_id, response.cluster.cluster, at_remote, position)

    def _on_update(self, partition: PartitionLog, metadata: MessageMetadata, payload: bytes,
                   position: Position) -> None:
        self.updates.stored(partition, metadata.replicated_from, payload, position)

    def _share_producer_ids(self) -> None:
        """Producer ids are the same producer's in every cluster of the registry while their tags all differ."""
        self.topics.shared_producer_ids.update([self.local, *self.clusters.clusters])

    def _refresh_links(self) -> None:
        """One link per registered remote cluster; a cluster whose address changed gets a new one."""
        for name, link in list(self._links.items()):
            if self.clusters.get(name) != link.cluster:
                del self._links[name]
                asyncio.ensure_future(link.close())
        for name, cluster in self.clusters.clusters.items():
            if name != self.local and name not in self._links:
                self._links[name] = RemoteLink(cluster, self.local)

    async def stop(self) -> None:
        await self.updates.stop()
        for task in (self._task, self._snapshot_task, *self._ticks):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        async with self._lock:
            for replicator in self.replicators.values():
                await replicator.stop()
            self.replicators.clear()
            for link in self._links.values():
                await link.close()
