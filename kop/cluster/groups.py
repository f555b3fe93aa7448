"""Group coordinators in a cluster: a group is coordinated by the owner of its shard, as in Kafka.

Group ids are spread over the 50 partitions of `__consumer_offsets` by Kafka's own rule (the Java hash of the id,
modulo 50), and shard k is owned like any partition, by rendezvous hashing of `__consumer_offsets-partition-k` over
the live brokers: FindCoordinator and Metadata name the same broker. Taking a shard over raises the epoch of a small
managed-ledger row of its own (fencing out the previous coordinator's offset and generation writes), then reads the
shard's groups' latest generation records and committed offsets from the database, as Kafka's new coordinator loads
a group from `__consumer_offsets`: a classic group comes back Stable in its generation with its members and their
assignments, a consumer group (KIP-848) with its members' epochs and assignments, each member with a session from
then, so members that find the new coordinator heartbeat on without a rebalance; and which of the groups' partitions
open transactions hold offsets for (kop/groups/txn_offsets.py), so OffsetFetch with require_stable answers as the old
one did. Losing a shard drops its groups; their members are answered NOT_COORDINATOR and look the coordinator up
again.

What a broker loaded holds only while no other broker can have coordinated the shard since. Another broker takes a
shard over only under a view that does not give it to this one: once this one's lease ran out (its session over), or
while this one saw a broker it does not own the shard under. So a shard is dropped in the very step that installs such
a view or finds the lease run out, not at the next follow: a broker that regained a shard before it followed again
answered OffsetFetch from its earlier tenure's cache, behind what the other coordinator had committed meanwhile, and a
member that resumed from that offset committed the group backwards. And a broker whose view was already outdated
when it took a shard over fenced out the shard's coordinator, which kept answering NOT_COORDINATOR to every commit
while its own view gave it the shard: each follow step drops the shards whose stored epoch rose past this broker's
(kop/cluster/service.py) and loads again those it still owns; a load takes a shard only while the view is fresh and
still gives it here.
"""
import logging
from collections.abc import Callable

from kop import internal_topics
from kop.bounded import each_bounded
from kop.cluster.offsets import ClusterOffsetStore
from kop.cluster.ownership import java_hash_shard, taken_over
from kop.groups import GroupCoordinator
from kop.groups.generations import StoredGenerations
from kop.groups.offsets import SYSTEM_CURSOR_PREFIX
from kop.ledger.postgres.store import POOL_SIZE
from kop.topic_storage import PgTopicStorage
from kop.topics import TopicManager
from protocol.errors import ErrorCode

log = logging.getLogger(__name__)

SHARDS = internal_topics.CONSUMER_OFFSETS_PARTITIONS
SHARD_TOPIC = internal_topics.CONSUMER_OFFSETS


def shard_of(group_id: str) -> int:
    return java_hash_shard(group_id, SHARDS)


def shard_ledger(shard: int) -> str:
    """The managed-ledger row whose epoch fences a shard's coordinator (no topic's: never an orphan to remove)."""
    return f"kop.coordinator/{SHARD_TOPIC}-{shard}"


class GroupShards:
    def __init__(self, storage: PgTopicStorage, topics: TopicManager, coordinator: GroupCoordinator,
                 owns: Callable[[str, int], bool], fresh: Callable[[], bool] = lambda: True) -> None:
        """owns(topic, partition): whether this broker owns that partition now (the cluster's view); fresh():
        whether that view is recent enough to act on (a broker woken from a pause answers from an old one)."""
        self._store = storage.store
        self._coordinator = coordinator
        self._owns = owns
        self._fresh = fresh
        self.epochs: dict[int, int] = {}  # shard -> this broker's coordinator epoch, for the shards it has loaded
        self._releases = 0  # shards dropped so far: a load that saw one dropped meanwhile installs nothing
        self.offsets = ClusterOffsetStore(storage.store, topics, storage, coordinator.config.offset_metadata_max_bytes,
                                          self.fence_of)
        coordinator.join_cluster(self.offsets, self.error_for)
        if isinstance(coordinator.generations, StoredGenerations):
            coordinator.generations.fence_of = self.fence_of  # a stale coordinator's generations are refused
        coordinator.txn_offsets.persist_in(storage.store, self.fence_of)

    def error_for(self, group_id: str) -> ErrorCode | None:
        """Why this broker may not serve the group now (None: it may)."""
        shard = shard_of(group_id)
        if not self._owns(SHARD_TOPIC, shard) or not self._fresh():
            return ErrorCode.NOT_COORDINATOR
        if shard not in self.epochs:
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        return None

    def fence_of(self, group_id: str) -> tuple[str, int] | None:
        shard = shard_of(group_id)
        epoch = self.epochs.get(shard)
        return None if epoch is None else (shard_ledger(shard), epoch)

    def release_all(self) -> None:
        """This broker's lease ran out: whatever it loaded may be stale, load again once it owns shards again."""
        for shard in sorted(self.epochs):
            self._release(shard)

    def release_unowned(self) -> None:
        """A new view of the live brokers: drop the shards it gives to another broker, at once (the broker that
        takes one over may commit before this one follows again, and this one may regain it before then)."""
        for shard in sorted(self.epochs):
            if not self._owns(SHARD_TOPIC, shard):
                self._release(shard)
                log.info("group coordinator shard %d moved to another broker", shard)

    def held(self) -> dict[str, int]:
        """The fencing ledger of each shard this broker has loaded, with the epoch it took the shard over with."""
        return {shard_ledger(shard): epoch for shard, epoch in self.epochs.items()}

    def release_taken(self, stored: dict[str, int]) -> None:
        """Drop the shards whose stored epoch rose past this broker's (`stored`: ledger name -> epoch, read since
        `held()`): another broker took them over since, from a view that was already outdated, and every write of
        this one is refused from then on. Dropped, a shard this broker still owns is loaded again at the next follow,
        under a new epoch, instead of answering NOT_COORDINATOR to every commit until the view changes."""
        for shard in taken_over(self.epochs, shard_ledger, stored):
            self._release(shard)
            log.warning("group coordinator shard %d was taken over by another broker: loading it again if this "
                        "broker still owns it", shard)

    def _release(self, shard: int) -> None:
        self._releases += 1
        del self.epochs[shard]
        for group_id in [g for g in self._coordinator.group_ids() if shard_of(g) == shard]:
            self._coordinator.drop(group_id)
            self.offsets.drop(group_id)
        self._coordinator.txn_offsets.drop(lambda group_id: shard_of(group_id) == shard)

    async def follow(self) -> None:
        """Load the shards this broker owns now and has not loaded; drop those it no longer owns."""
        self.release_unowned()
        owned = {shard for shard in range(SHARDS) if self._owns(SHARD_TOPIC, shard)}
        new = owned - set(self.epochs)
        if not new:
            return
        session, releases = self._store.session, self._releases
        epochs: dict[int, int] = {}

        async def take(shard: int) -> None:
            # Each take fences out whoever coordinates the shard: only while this broker's view still gives it here.
            if self._fresh() and self._owns(SHARD_TOPIC, shard):
                epochs[shard] = (await self._store.take_ownership(shard_ledger(shard), 0)).row.epoch

        # Each take is a transaction on the shard's own row: as many at once as the pool has connections, rather than
        # one after another (50 of them when one broker starts alone).
        await each_bounded(sorted(new), take, POOL_SIZE)
        new = set(epochs)
        if not new:
            return
        # Read after the fencing: the previous coordinator's every write is in, and no later one can be.
        rows = await self._store.group_cursors(SYSTEM_CURSOR_PREFIX)
        generations = await self._coordinator.generations.load()
        flagged = await self.offsets.read_flags()
        loading = set(new)
        await self._coordinator.txn_offsets.load(lambda group_id: shard_of(group_id) in loading)
        if session != self._store.session or releases != self._releases:
            # the lease ran out or the view moved meanwhile: what was read may be stale, follow again
            self._coordinator.txn_offsets.drop(lambda group_id: shard_of(group_id) in loading)
            return
        new = {shard for shard in new if self._owns(SHARD_TOPIC, shard)}
        self._coordinator.txn_offsets.drop(lambda group_id: shard_of(group_id) in loading - new)
        if not new:
            return
        epochs = {shard: epochs[shard] for shard in new}
        protocols = self.offsets.adopt(rows, lambda group_id: shard_of(group_id) in new, flagged)
        for group_id, protocol_type in protocols.items():
            self._coordinator.adopt(group_id, protocol_type)
        for group_id, record in generations.items():  # the members go on heartbeating here, as before the move
            if shard_of(group_id) in new:
                self._coordinator.restore(group_id, record)
        self.epochs.update(epochs)
        log.info("group coordinator shards %s loaded", sorted(new))
