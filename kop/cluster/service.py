"""Who serves what: one broker alone (the file engine), or a cluster of brokers on one PostgreSQL database.

ClusterService runs two loops every `broker.heartbeat.interval.ms`. One, from the moment the broker registers,
renews its lease and then reads the live brokers, and registers again under a new session when the lease had run
out; it never waits for anything else, so a long load, CreateTopics or takeover cannot starve it. The other has the topic manager follow the stored topics
and the ownership the live brokers now give (kop/cluster/ownership.py), the policies another broker may have
changed (kop/policies.py), the dynamic broker configs (kop/dynamic), the settings the brokers share (users,
ACLs, quotas, geo clusters: kop/shared_book.py), and the group and transaction coordinators their shards, after dropping every partition and shard it held when the lease had run out (another broker may have
taken them meanwhile). Handlers ask it who leads a partition (Metadata) and answer NOT_LEADER_OR_FOLLOWER for
partitions another broker owns.

Reads after a move. Writes are fenced in the database, reads are not: a broker that has not yet seen that a partition
moved could serve a read the new owner's writes have made stale. So a broker serves reads only while its view of
the live brokers is fresh (read, right after a renewal that succeeded, less than three heartbeats ago and less than
the lease), and a broker that joins while others are live waits that long before it takes any partition over: by
then every earlier owner has either seen it join or stopped serving reads. Partitions move between live brokers only
when one joins (a broker that leaves or dies gives its partitions up), so no other move needs the wait. A broker
that lost its lease, or went as long without a view, serves no read until the follow step has dropped what others
may have taken meanwhile: its next view may give it the same partitions again.

Taken over behind its back. A broker acting on a view already outdated (or paused mid-load) can open a partition or
coordinator shard its rightful owner holds, fencing that one out, and give it back at its next view. So each follow
step compares the epochs of what this broker holds with the stored ones and drops what moved on; what it still owns
it opens again under a new epoch, instead of refusing every write until the live brokers change.
"""
import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from kafka.protocol.api_message import ApiMessage

from kop.cluster.groups import GroupShards
from kop.cluster.membership import Member, Membership, NodeIdInUse
from kop.cluster.ownership import owner_of
from kop.cluster.peers import PeerSecurity, PeerUnreachable, Peers
from kop.cluster.replicated_groups import ViaCoordinators
from kop.cluster.transactions import TxnShards, shard_ledger_config
from kop.groups import GroupCoordinator
from kop.ledger.postgres import PgStore
from kop.replication.group_positions import Coordinators
from kop.shared_book import SharedBook
from kop.topic_storage import PgTopicStorage, ledger_name
from kop.topics import TopicManager
from kop.transactions.coordinator import TransactionCoordinator

log = logging.getLogger(__name__)
_RENEW_RETRY_S = 0.25  # after a failed renewal
_RENEW_FAILURES_LOGGED_EVERY = 8  # failed retries in a row: one line every ~2 s, the first with its traceback


class Cluster(Protocol):
    async def join(self) -> None:
        """Before the topics load."""

    async def serve_groups(self, coordinator: GroupCoordinator) -> None:
        """Before the group coordinator starts: have it coordinate the groups this broker is given."""

    async def serve_transactions(self, coordinator: TransactionCoordinator) -> None:
        """Before the transaction coordinator starts: have it coordinate the transactional ids this broker is
        given."""

    def start(self) -> None:
        """Once the broker serves."""

    async def stop_following(self) -> None:
        """First thing when the broker stops: no renewal or follow step runs any more, so none opens or drops
        partitions and coordinator shards while the broker closes them."""

    async def stop(self) -> None:
        """Before the storage closes."""

    def owns(self, topic: str, partition: int) -> bool:
        """Whether this broker serves the partition."""

    def serves_reads(self, topic: str, partition: int) -> bool:
        """Whether this broker owns the partition by a view recent enough to answer reads from it."""

    def leader(self, topic: str, partition: int) -> int:
        """The node id that owns the partition, -1 when no broker is live."""

    def members(self) -> list[Member]:
        """The live brokers, by node id (this one included)."""

    def coordinators(self) -> Coordinators | None:
        """The other brokers as group coordinators, for PIP-33 (None: this broker coordinates every group)."""

    async def call_peer(self, node: int, request: ApiMessage, response_class: type[ApiMessage]) -> ApiMessage:
        """A request to another broker of the cluster and its answer; raises PeerUnreachable."""


class SingleBroker:
    """One broker owns every partition (the file engine)."""

    def __init__(self, me: Member) -> None:
        self._me = me

    async def join(self) -> None:
        pass

    async def serve_groups(self, coordinator: GroupCoordinator) -> None:
        pass  # it coordinates every group

    async def serve_transactions(self, coordinator: TransactionCoordinator) -> None:
        pass  # every transactional id, from its data directory

    def start(self) -> None:
        pass

    async def stop_following(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    def owns(self, topic: str, partition: int) -> bool:
        return True

    def serves_reads(self, topic: str, partition: int) -> bool:
        return True

    def leader(self, topic: str, partition: int) -> int:
        return self._me.node_id

    def members(self) -> list[Member]:
        return [self._me]

    def coordinators(self) -> Coordinators | None:
        return None

    async def call_peer(self, node: int, request: ApiMessage, response_class: type[ApiMessage]) -> ApiMessage:
        raise PeerUnreachable("this broker is alone")


class ClusterService:
    def __init__(self, store: PgStore, topics: TopicManager, me: Member, home: str, lease_ms: int,
                 heartbeat_ms: int, peer_security: PeerSecurity, fsync: bool,
                 books: list[SharedBook] = (),
                 reload_settings: Callable[[], Awaitable[None]] | None = None) -> None:
        """peer_security: how the other brokers are reached (kop/cluster/peers.py); books: the settings the brokers
        share, read again when another broker changed them; reload_settings: reads the dynamic broker configs
        again (kop/dynamic), which other brokers may change."""
        self._store = store
        self._books = list(books)
        self._reload_settings = reload_settings
        self._membership = Membership(store, me, home, lease_ms)
        self._topics = topics
        self._me = me
        self._heartbeat = heartbeat_ms / 1000
        # How old a view may be to serve reads by: a few heartbeats, so a slow renewal does not stop reads, and less
        # than the lease, so a broker whose lease may have run out stops first.
        self._fresh_for = min(3 * self._heartbeat, lease_ms / 1000 - self._heartbeat)
        self._fsync = fsync
        self._members: list[Member] = [me]
        self._owners: dict[tuple[str, int], int] = {}  # (topic, partition) -> its owner by `_owners_of`
        self._owners_of: list[Member] = self._members
        self._viewed_at = float("-inf")  # monotonic time of the renewal that preceded the view of `_members`
        self._takeovers_from = 0.0  # monotonic time before which this broker takes no partition over
        self._loops: list[asyncio.Task] = []
        self._groups: GroupShards | None = None
        self._transactions: TxnShards | None = None
        self.peers = Peers(me.node_id, peer_security, self.members)
        self._lease_lost = False  # since the last follow: what this broker holds may have been taken
        # Lease losses and gaps between views so far, and how many of them the follow step has dealt with (dropped
        # what another broker may have taken meanwhile): no reads are served from what it holds until then.
        self._gaps = 0
        self._gaps_checked = 0
        self._moved = asyncio.Event()  # the live brokers changed since the last follow

    async def join(self) -> None:
        """Register (NodeIdInUse, a StartupError, when another broker has this node id) and read the live brokers;
        before the topics load, so this broker opens only the partitions it owns."""
        session = await self._register()
        # Renewed from now on, however long loading takes (a lease shorter than the load must not run out).
        self._loops.append(asyncio.get_running_loop().create_task(self._renew_loop()))
        await self._takeover_grace()
        log.info("joined the cluster as node %d (session %d); live brokers: %s", self._me.node_id, session,
                 [m.node_id for m in self._members])

    async def _register(self) -> int:
        started = time.monotonic()
        session = await self._membership.register()
        self._see(await self._membership.live(), started)
        if any(m.node_id != self._me.node_id for m in self._members):
            self._takeovers_from = started + self._fresh_for
        return session

    def _see(self, members: list[Member], viewed_at: float) -> None:
        """Install a view of the live brokers (read after a renewal or registration started at `viewed_at`); the
        group shards it gives to another broker are dropped in the same step (kop/cluster/groups.py), and every
        shard after a gap between views as long as a joining broker waits before it takes over (a broker paused
        meanwhile may have missed one that joined, coordinated its shards and left again)."""
        unseen = viewed_at - self._viewed_at >= self._fresh_for  # paused or cut off: moves it never saw
        if unseen and self._viewed_at != float("-inf"):  # not at the first view: nothing is held then
            self._gaps += 1
            self._moved.set()  # followed now: reads wait for it
        self._members, self._viewed_at = members, viewed_at
        if self._groups is not None:
            self._groups.release_all() if unseen else self._groups.release_unowned()

    async def _takeover_grace(self) -> None:
        """Wait until the brokers that were live when this one registered have seen it, or stopped serving reads."""
        wait = self._takeovers_from - time.monotonic()
        if wait > 0:
            log.info("taking partitions over in %.1f s, once the other brokers have seen this one join", wait)
            await asyncio.sleep(wait)

    @property
    def fresh(self) -> bool:
        """Whether this broker's view of the live brokers is recent enough to serve reads and coordinate by, and
        what it holds was checked since it last lost its lease or missed views."""
        return time.monotonic() - self._viewed_at < self._fresh_for and self._gaps_checked == self._gaps

    async def serve_groups(self, coordinator: GroupCoordinator) -> None:
        """Coordinate the groups of the `__consumer_offsets` shards this broker owns (kop/cluster/groups.py)."""
        storage = self._topics.storage
        assert isinstance(storage, PgTopicStorage)
        self._groups = GroupShards(storage, self._topics, coordinator, self.owns, lambda: self.fresh)
        await self._groups.follow()

    async def serve_transactions(self, coordinator: TransactionCoordinator) -> None:
        """Coordinate the transactional ids of the transaction state log shards this broker owns
        (kop/cluster/transactions.py)."""
        self._transactions = TxnShards(self._store, shard_ledger_config(self._fsync), coordinator, self.owns,
                                       lambda: self.fresh, self.leader, self.peers)
        await self._transactions.follow()

    def start(self) -> None:
        self._loops.append(asyncio.get_running_loop().create_task(self._follow_loop()))

    def owns(self, topic: str, partition: int) -> bool:
        return self.leader(topic, partition) == self._me.node_id

    def serves_reads(self, topic: str, partition: int) -> bool:
        return self.fresh and self.owns(topic, partition)

    def leader(self, topic: str, partition: int) -> int:
        members = self._members
        if members is not self._owners_of:  # a new view: owners are computed again, once per partition asked
            self._owners, self._owners_of = {}, members
        owner = self._owners.get((topic, partition))
        if owner is None:
            found = owner_of(ledger_name(topic, partition), (m.node_id for m in members))
            owner = self._owners[(topic, partition)] = -1 if found is None else found
        return owner

    def members(self) -> list[Member]:
        return self._members

    def coordinators(self) -> Coordinators | None:
        return ViaCoordinators(self.peers, self._me.node_id, self.members, self.leader, lambda: self.fresh)

    async def call_peer(self, node: int, request: ApiMessage, response_class: type[ApiMessage]) -> ApiMessage:
        if node == self._me.node_id or not self.fresh:
            raise PeerUnreachable(f"broker {node} is this one, or this broker's view of the cluster is too old")
        return await self.peers.call(node, request, response_class)

    async def _renew_loop(self) -> None:
        delay = self._heartbeat
        failures = 0
        while True:
            await asyncio.sleep(delay)
            delay = self._heartbeat
            try:
                await self.renew()
                failures = 0
            except NodeIdInUse as exc:
                log.error("%s", exc)
            except Exception as exc:  # noqa: BLE001 - the database unreachable: the lease runs on until it expires
                if failures == 0:
                    log.exception("cannot renew the lease; trying again")
                elif failures % _RENEW_FAILURES_LOGGED_EVERY == 0:
                    log.error("cannot renew the lease (%d failures in a row): %s", failures + 1, exc)
                # Soon, not a whole heartbeat later, however long the database has been away: reads wait for a fresh
                # view, and a restarted database can give one within a second (one statement per retry).
                delay = min(self._heartbeat, _RENEW_RETRY_S)
                failures += 1

    async def renew(self) -> None:
        """Renew the lease and read the live brokers; register again under a new session when the lease had run
        out (NodeIdInUse when another broker took the node id meanwhile)."""
        started = time.monotonic()
        if await self._membership.renew():
            members = await self._membership.live()
            if [m.node_id for m in members] != [m.node_id for m in self._members]:
                log.info("live brokers now %s", [m.node_id for m in members])
                self._moved.set()  # partitions moved: followed now, not at the next beat
            self._see(members, started)
            return
        log.error("node %d: the lease ran out (paused or cut off for longer than broker.session.timeout.ms); "
                  "dropping every partition and joining again", self._me.node_id)
        self._lease_lost = True
        # No reads from what it holds, even under the view it registers again with, until the follow step dropped it:
        # another broker may have written to its partitions meanwhile.
        self._gaps += 1
        if self._groups is not None:  # before a new view can name this broker the coordinator again
            self._groups.release_all()
        self._moved.set()
        await self._register()

    async def _follow_loop(self) -> None:
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._moved.wait(), self._heartbeat)
            self._moved.clear()
            try:
                await self.follow()
            except Exception:  # noqa: BLE001 - the database unreachable: try again at the next beat
                log.exception("cannot follow the cluster's ownership; trying again")

    async def follow(self) -> None:
        """Read the topics and follow the ownership the live brokers give, first dropping everything held when the
        lease had run out, and then what another broker took over meanwhile."""
        gaps = self._gaps
        if self._lease_lost:
            self._lease_lost = False
            await self._topics.release_all()
            if self._groups is not None:
                self._groups.release_all()
            if self._transactions is not None:
                await self._transactions.release_all()
        await self._release_taken()
        self._gaps_checked = gaps
        await self._takeover_grace()
        if not self.fresh:
            return  # the lease may be gone: ownership is followed again once it is renewed
        await self._topics.sync()
        if await self._topics.policies.reload():  # changed through another broker
            await self._topics.apply_policies()
        if self._reload_settings is not None:
            await self._reload_settings()
        versions = await self._store.record_versions()
        for book in self._books:
            if await book.reload(versions):
                log.info("%s records changed through another broker: read again", book.kind)
        if self._groups is not None:
            await self._groups.follow()
        if self._transactions is not None:
            await self._transactions.follow()

    async def _release_taken(self) -> None:
        """Drop the partitions and coordinator shards another broker took over since this one opened them (their
        stored epoch rose): taken from a view that was already outdated, or while this broker was paused. This one
        can no longer write them and may be behind on them; those it still owns are opened again below, under a new
        epoch, rather than failing every write (and answering reads from stale state) until the view changes."""
        held = self._topics.held_ledgers()
        if self._groups is not None:
            held |= self._groups.held()
        if self._transactions is not None:
            held |= self._transactions.held()
        if not held:
            return
        stored = await self._store.epochs(sorted(held))
        await self._topics.release_taken(stored)
        if self._groups is not None:
            self._groups.release_taken(stored)
        if self._transactions is not None:
            await self._transactions.release_taken(stored)

    async def stop_following(self) -> None:
        for task in self._loops:
            task.cancel()
        for task in self._loops:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._loops.clear()

    async def stop(self) -> None:
        """Close this broker's partitions, then end the lease, so the others take them over at once."""
        await self.stop_following()
        await self._topics.release_all()
        await self.peers.close()
        with contextlib.suppress(Exception):  # the database gone: the lease expires by itself
            await self._membership.leave()
