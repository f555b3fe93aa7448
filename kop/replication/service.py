"""Runs the replicators this broker's topics need: for each partition of each topic, one per cluster in the topic's
`replication_clusters` policy (topic -> namespace) other than this one and known to the clusters registry. Checked
twice a second and after every admin change, so a policy or registry change takes effect without a restart. A
replicator that is no longer wanted (the cluster left the list) is stopped and its cursor deleted, as Pulsar
removes a replicator's; one whose topic was deleted goes with it."""
import asyncio
import contextlib
import logging

from kop.config import BrokerConfig
from kop.ledger import CursorNotFoundError
from kop.partition import PartitionLog
from kop.policies import PolicyBook
from kop.replication.clusters import ClusterRegistry
from kop.replication.link import RemoteLink
from kop.replication.replicator import Replicator, cursor_name
from kop.topics import INTERNAL_PREFIX, TopicManager

log = logging.getLogger(__name__)
CHECK_INTERVAL_S = 0.5

Key = tuple[str, int, str]  # topic, partition, remote cluster


class ReplicationService:
    def __init__(self, config: BrokerConfig, topics: TopicManager, policies: PolicyBook,
                 clusters: ClusterRegistry) -> None:
        self.local = config.cluster_name
        self.topics = topics
        self.policies = policies
        self.clusters = clusters
        self.replicators: dict[Key, Replicator] = {}
        self._links: dict[str, RemoteLink] = {}
        self._task: asyncio.Task | None = None
        self._lock = asyncio.Lock()

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

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
            self._refresh_links()
            wanted: dict[Key, PartitionLog] = {}
            for topic in list(self.topics.topics.values()):
                for remote in self.remotes(topic.name):
                    for partition in topic.partitions:
                        wanted[(topic.name, partition.partition, remote)] = partition
            for key, replicator in list(self.replicators.items()):
                if wanted.get(key) is not replicator.partition:
                    del self.replicators[key]
                    await self._retire(key, replicator)
            for key, partition in wanted.items():
                if key not in self.replicators:
                    self._start(key, partition)

    def _start(self, key: Key, partition: PartitionLog) -> None:
        name, _, remote = key

        def partition_count() -> int:
            topic = self.topics.get(name)
            return len(topic.partitions) if topic is not None else partition.partition + 1

        replicator = Replicator(partition, partition_count, self.local, remote, lambda: self._links.get(remote))
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
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        async with self._lock:
            for replicator in self.replicators.values():
                await replicator.stop()
            self.replicators.clear()
            for link in self._links.values():
                await link.close()
