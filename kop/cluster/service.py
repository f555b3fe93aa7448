"""Who serves what: one broker alone (the file engine), or a cluster of brokers on one PostgreSQL database.

ClusterService runs two loops every `broker.heartbeat.interval.ms`. One renews this broker's lease, and registers
again under a new session when the lease had run out; it never waits for anything else, so a long CreateTopics or
takeover cannot starve it. The other reads the live brokers and has the topic manager follow the stored topics and
the ownership they now give (kop/cluster/ownership.py), after dropping every partition and group shard it held when
the lease had run out (another broker may have taken them meanwhile). Handlers ask it
who leads a partition (Metadata) and answer NOT_LEADER_OR_FOLLOWER for partitions another broker owns.
"""
import asyncio
import contextlib
import logging
from typing import Protocol

from kop.cluster.groups import GroupShards
from kop.cluster.membership import Member, Membership, NodeIdInUse
from kop.cluster.ownership import owner_of
from kop.groups import GroupCoordinator
from kop.ledger.postgres import PgStore
from kop.topic_storage import PgTopicStorage, ledger_name
from kop.topics import TopicManager

log = logging.getLogger(__name__)


class Cluster(Protocol):
    async def join(self) -> None:
        """Before the topics load."""

    async def serve_groups(self, coordinator: GroupCoordinator) -> None:
        """Before the group coordinator starts: have it coordinate the groups this broker is given."""

    def start(self) -> None:
        """Once the broker serves."""

    async def stop(self) -> None:
        """Before the storage closes."""

    def owns(self, topic: str, partition: int) -> bool:
        """Whether this broker serves the partition."""

    def leader(self, topic: str, partition: int) -> int:
        """The node id that owns the partition, -1 when no broker is live."""

    def members(self) -> list[Member]:
        """The live brokers, by node id (this one included)."""


class SingleBroker:
    """One broker owns every partition (the file engine)."""

    def __init__(self, me: Member) -> None:
        self._me = me

    async def join(self) -> None:
        pass

    async def serve_groups(self, coordinator: GroupCoordinator) -> None:
        pass  # it coordinates every group

    def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    def owns(self, topic: str, partition: int) -> bool:
        return True

    def leader(self, topic: str, partition: int) -> int:
        return self._me.node_id

    def members(self) -> list[Member]:
        return [self._me]


class ClusterService:
    def __init__(self, store: PgStore, topics: TopicManager, me: Member, home: str, lease_ms: int,
                 heartbeat_ms: int) -> None:
        self._membership = Membership(store, me, home, lease_ms)
        self._topics = topics
        self._me = me
        self._heartbeat = heartbeat_ms / 1000
        self._members: list[Member] = [me]
        self._loops: list[asyncio.Task] = []
        self._groups: GroupShards | None = None
        self._lease_lost = False  # since the last follow: what this broker holds may have been taken

    async def join(self) -> None:
        """Register (NodeIdInUse, a StartupError, when another broker has this node id) and read the live brokers;
        before the topics load, so this broker opens only the partitions it owns."""
        session = await self._membership.register()
        self._members = await self._membership.live()
        log.info("joined the cluster as node %d (session %d); live brokers: %s", self._me.node_id, session,
                 [m.node_id for m in self._members])

    async def serve_groups(self, coordinator: GroupCoordinator) -> None:
        """Coordinate the groups of the `__consumer_offsets` shards this broker owns (kop/cluster/groups.py)."""
        storage = self._topics.storage
        assert isinstance(storage, PgTopicStorage)
        self._groups = GroupShards(storage, self._topics, coordinator, self.owns)
        await self._groups.follow()

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._loops = [loop.create_task(self._renew_loop()), loop.create_task(self._follow_loop())]

    def owns(self, topic: str, partition: int) -> bool:
        return self.leader(topic, partition) == self._me.node_id

    def leader(self, topic: str, partition: int) -> int:
        owner = owner_of(ledger_name(topic, partition), (m.node_id for m in self._members))
        return -1 if owner is None else owner

    def members(self) -> list[Member]:
        return self._members

    async def _renew_loop(self) -> None:
        while True:
            await asyncio.sleep(self._heartbeat)
            try:
                if not await self._membership.renew():
                    log.error("node %d: the lease ran out (paused or cut off for longer than "
                              "broker.session.timeout.ms); dropping every partition and joining again",
                              self._me.node_id)
                    self._lease_lost = True
                    await self._membership.register()
            except NodeIdInUse as exc:
                log.error("%s", exc)
            except Exception:  # noqa: BLE001 - the database unreachable: the lease runs on until it expires
                log.exception("cannot renew the lease; trying again")

    async def _follow_loop(self) -> None:
        while True:
            await asyncio.sleep(self._heartbeat)
            try:
                await self.follow()
            except Exception:  # noqa: BLE001 - the database unreachable: try again at the next beat
                log.exception("cannot follow the cluster's ownership; trying again")

    async def follow(self) -> None:
        """Read the live brokers and the topics and follow ownership, first dropping everything held when the lease
        had run out."""
        if self._lease_lost:
            self._lease_lost = False
            await self._topics.release_all()
            if self._groups is not None:
                self._groups.release_all()
        members = await self._membership.live()
        if [m.node_id for m in members] != [m.node_id for m in self._members]:
            log.info("live brokers now %s", [m.node_id for m in members])
        self._members = members
        await self._topics.sync(await self._topics.storage.load_metadata())
        if self._groups is not None:
            await self._groups.follow()

    async def stop(self) -> None:
        """Close this broker's partitions, then end the lease, so the others take them over at once."""
        for task in self._loops:
            task.cancel()
        for task in self._loops:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._topics.release_all()
        with contextlib.suppress(Exception):  # the database gone: the lease expires by itself
            await self._membership.leave()
