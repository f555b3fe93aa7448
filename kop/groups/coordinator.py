"""The group coordinator: every group this broker coordinates (all of them: one broker), their membership
protocol, their committed offsets, and the admin operations on both.

Groups with committed offsets are found at start-up by looking at the cursors of every partition; they exist in
state Empty until members join. Until that scan is done the group APIs answer COORDINATOR_LOAD_IN_PROGRESS (the
broker opens its listener only after the scan, so clients meet it only while the broker stops).
Consumer-protocol groups (KIP-848, `kop.groups.consumer`) live beside the classic ones: a group id is one kind or
the other. An empty classic group becomes a consumer-protocol group when a consumer-protocol member joins, and an
empty consumer-protocol group a classic one when a classic member joins (Kafka's offline upgrade and downgrade).
Groups with members change kind as `group.consumer.migration.policy` allows (kop.groups.consumer.migration), and
classic members of a consumer group are served by it (kop.groups.consumer.classic). Every change of a consumer
group is stored in the generation log before the member that caused it is answered, and restored at start.
Committed offsets are the same group cursors for both.
Offsets are never expired by time (Pulsar keeps a subscription until it is deleted). A group exists while it has
members or offsets: one whose last offset goes (OffsetDelete, DeleteGroups, its topics deleted) is forgotten at
once, as Kafka does, and the periodic sweep catches the rest (e.g. the last member left a group that never
committed).
"""
import asyncio
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kop.config import BrokerConfig
from kop.groups.consumer.classic import ClassicMembers
from kop.groups.consumer.embedded import EmbeddedProtocolError, encode_assignment, encode_subscription, version_of
from kop.groups.consumer.group import CONSUMER_GROUP_TYPE, CONSUMER_PROTOCOL_TYPE, ConsumerGroup, ConsumerGroupState
from kop.groups.consumer.heartbeat import ConsumerGroups, Heartbeat, HeartbeatResult
from kop.groups.consumer.member import JOIN_EPOCH, ConsumerMember
from kop.groups.consumer.migration import MigrationPolicy, MigrationRefused, to_classic_group, to_consumer_group
from kop.groups.consumer.records import consumer_group_record, restore_consumer_group
from kop.groups.generations import generation_record, restore_group
from kop.groups.group import Group, GroupState, JoinResult, SyncResult
from kop.groups.membership import JoinRequest, Membership, resolved
from kop.groups.offsets import SYSTEM_CURSOR_PREFIX, CommittedOffset, OffsetStore
from kop.groups.txn_offsets import TxnHeldOffsets
from kop.groups.writes import GroupWrites
from protocol.errors import ErrorCode

if TYPE_CHECKING:  # kop.topics imports kop.groups (generations) for the storage engines
    from kop.topics import TopicManager
    from proto.kop_pb2 import GroupGeneration

log = logging.getLogger(__name__)

CLASSIC_GROUP_TYPE = "classic"


@dataclass(frozen=True, slots=True)
class GroupListing:
    group_id: str
    protocol_type: str
    state: str
    group_type: str = CLASSIC_GROUP_TYPE


@dataclass(frozen=True, slots=True)
class MemberDescription:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupDescription:
    error: ErrorCode
    group_id: str
    state: str = GroupState.DEAD.value
    protocol_type: str = ""
    protocol_data: str = ""
    members: tuple[MemberDescription, ...] = ()


class GroupCoordinator:
    def __init__(self, config: BrokerConfig, topics: "TopicManager") -> None:
        self.config = config
        self.topics = topics
        self.groups: dict[str, Group] = {}
        self.offsets = OffsetStore(topics, config.offset_metadata_max_bytes,
                                   os.path.join(config.data_dir, "groups", "replicated-pending"), config.fsync)
        self.generations = topics.storage.group_generations()
        self.txn_offsets = TxnHeldOffsets()  # the offsets open transactions hold for these groups (require_stable)
        self.membership = Membership(self.groups, config.group_initial_rebalance_delay_ms,
                                     config.group_min_session_timeout_ms, config.group_max_session_timeout_ms,
                                     config.group_max_size, self._store_generation)
        self.consumer = ConsumerGroups(config.group_consumer_session_timeout_ms,
                                       config.group_consumer_heartbeat_interval_ms, config.group_max_size,
                                       self._partition_counts, lambda: list(topics.topics),
                                       config.consumer_assignors, self._consumer_changed, self._maybe_downgrade)
        self.classic_members = ClassicMembers(self.consumer)
        self.migration = MigrationPolicy.parse(config.group_consumer_migration_policy)
        self.writes = GroupWrites(self.generations.record)
        self.sweep_interval_ms = config.offsets_retention_check_interval_ms
        self.loaded = False
        self._sweeper: asyncio.Task | None = None
        self._forgetting: set[asyncio.Task] = set()  # generation-log deletions in flight
        self._clustered = False  # a cluster's coordinator: groups come and go with its shards (kop/cluster/groups.py)
        self._serves: Callable[[str], ErrorCode | None] = lambda group_id: None

    def reconfigure(self, config: BrokerConfig) -> None:
        """The broker's settings changed at run time (kop/dynamic): limits apply to the next request that meets
        them (a join, a commit), timeouts to the next timer armed (a heartbeat, a first rebalance)."""
        self.config = config
        self.offsets.metadata_max_bytes = config.offset_metadata_max_bytes
        membership = self.membership
        membership.initial_rebalance_delay_ms = config.group_initial_rebalance_delay_ms
        membership.min_session_timeout_ms = config.group_min_session_timeout_ms
        membership.max_session_timeout_ms = config.group_max_session_timeout_ms
        membership.max_group_size = config.group_max_size
        self.consumer.session_timeout_ms = config.group_consumer_session_timeout_ms
        self.consumer.heartbeat_interval_ms = config.group_consumer_heartbeat_interval_ms
        self.consumer.max_size = config.group_max_size

    def join_cluster(self, offsets: "OffsetStore", serves: Callable[[str], ErrorCode | None]) -> None:
        """Coordinate only the groups of the shards this broker owns in a cluster (kop/cluster/groups.py adopts and
        drops them); serves(group_id): why this broker may not serve the group now, None when it may."""
        self.offsets = offsets
        self._serves = serves
        self._clustered = True

    def adopt(self, group_id: str, protocol_type: str | None) -> None:
        """A group known by its committed offsets (a shard this broker took over, or a start): Empty until a
        generation record says more (restore) or members join."""
        self.groups.setdefault(group_id, Group(group_id, protocol_type=protocol_type or None))

    def restore(self, group_id: str, record: "GroupGeneration") -> None:
        """A group as its latest generation record left it, with its members (a classic group Stable in its
        generation with their assignments, a consumer group with their epochs and assignments) and a session for
        each from now: its members heartbeat on, after a restart or after their coordinator moved here."""
        if record.HasField("consumer"):
            self.groups.pop(group_id, None)  # its offsets made it known as an empty classic group
            consumer_group = self.consumer.groups[group_id] = restore_consumer_group(record)
            self.consumer.arm_restored(consumer_group)
            return
        group = self.groups.setdefault(group_id, Group(group_id, protocol_type=record.protocol_type or None))
        restore_group(group, record)
        self.membership.restored(group)

    def drop(self, group_id: str) -> None:
        """A group of a shard that moved to another broker: its members, waiting or not, are let go."""
        group = self.groups.pop(group_id, None)
        if group is not None:
            self.membership.forget(group)
        self.consumer.forget(group_id)

    def group_ids(self) -> list[str]:
        """Every group this broker coordinates, of both kinds."""
        return [*self.groups, *self.consumer.groups]

    # ---- lifecycle

    async def start(self) -> None:
        """Find the groups that have committed offsets (topics must be loaded), then serve. In a cluster the
        groups come with the shards instead."""
        if not self._clustered:
            for group_id, protocol_type in self.offsets.load().items():
                self.adopt(group_id, protocol_type)
            for group_id, record in (await self.generations.load()).items():
                self.restore(group_id, record)
        self.loaded = True
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep_loop())
        log.info("group coordinator loaded %d classic and %d consumer groups", len(self.groups),
                 len(self.consumer.groups))

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        self.membership.close()
        await self.membership.settle()
        self.consumer.close()
        await self.settle()
        self.generations.close()
        self.loaded = False

    async def settle(self) -> None:
        """Wait for the generation-log writes in flight and the deletions of discarded groups."""
        pending = [*self.writes.pending(), *self._forgetting]
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(max(1.0, self.sweep_interval_ms / 1000))
            self.sweep()

    def sweep(self) -> None:
        """Forget Empty groups that have no committed offsets left."""
        for group in list(self.groups.values()):
            if self._idle_without_offsets(group):
                self._discard(group)
        for group_id, consumer_group in list(self.consumer.groups.items()):
            if not consumer_group.members and not self.offsets.has_offsets(group_id):
                self.consumer.forget(group_id)
                self._delete_generation(group_id)

    def _idle_without_offsets(self, group: Group) -> bool:
        return group.is_(GroupState.EMPTY) and not group.pending_members \
            and not self.offsets.has_offsets(group.group_id)

    def _discard(self, group: Group) -> None:
        if group.state is not GroupState.DEAD:
            group.transition(GroupState.DEAD)
        self.membership.forget(group)
        if self.groups.get(group.group_id) is group:
            del self.groups[group.group_id]
        self.offsets.forget(group.group_id)
        self._delete_generation(group.group_id)

    def _delete_generation(self, group_id: str) -> None:
        if group_id in self.generations.generations:
            task = asyncio.get_running_loop().create_task(self.generations.delete(group_id))
            self._forgetting.add(task)
            task.add_done_callback(self._forgetting.discard)

    async def _store_generation(self, group: Group, assignments: dict[str, bytes]) -> None:
        await self.generations.record(generation_record(group, assignments))

    # ---- consumer groups' writes (kop/groups/writes.py): each answer after a write that holds its change

    def _consumer_changed(self, group: ConsumerGroup) -> None:
        if not group.dead:
            self.writes.write(group.group_id, lambda: None if group.dead else consumer_group_record(group))

    async def stored(self, group_id: str) -> bool:
        """Wait until what the group's latest change wrote is durable; False if that write failed."""
        await self.membership.emptied_stored(group_id)
        return await self.writes.stored(group_id)

    # ---- validation

    def check(self, group_id: str | None, allow_empty: bool = False) -> ErrorCode | None:
        """Kafka allows an empty group id only where old clients sent one (offsets, describe, delete)."""
        if group_id is None or (group_id == "" and not allow_empty) or group_id.startswith(SYSTEM_CURSOR_PREFIX):
            return ErrorCode.INVALID_GROUP_ID
        if not self.loaded:
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        return self._serves(group_id)

    # ---- membership

    def join(self, req: JoinRequest) -> asyncio.Future:
        error = self.check(req.group_id)
        if error is not None:
            return resolved(JoinResult(error, req.member_id))
        consumer_group = self.consumer.groups.get(req.group_id)
        if consumer_group is not None:
            if consumer_group.members:
                return self._join_consumer_group(consumer_group, req)
            self.consumer.forget(req.group_id)  # an empty consumer-protocol group becomes a classic one
        return self.membership.join(req)

    def _join_consumer_group(self, group: ConsumerGroup, req: JoinRequest) -> asyncio.Future:
        """A classic member joins a consumer group (kop.groups.consumer.classic). If it is a static member taking
        the place of the group's last consumer-protocol member, the group becomes a classic group (Kafka's
        downgrade on replacement) with it as a member."""
        if not self.membership.valid_session_timeout(req.session_timeout_ms):
            return resolved(JoinResult(ErrorCode.INVALID_SESSION_TIMEOUT, req.member_id))
        replaced = group.static_members.get(req.group_instance_id) \
            if req.group_instance_id is not None and not req.member_id else None
        last_consumer_member = replaced is not None and group.all_classic_except(replaced)
        result = self.classic_members.join(group, req)
        if result.error == ErrorCode.NONE and last_consumer_member and self.migration.downgrades \
                and len(group.members) <= self.config.group_max_size:
            # Kafka hands each member its target at once; kop rebalances, so that no member starts on partitions
            # another has not yet given up (the joiner's SyncGroup is told to rejoin).
            self._downgrade(group, None)
        failed = JoinResult(ErrorCode.COORDINATOR_NOT_AVAILABLE, req.member_id)
        return self.writes.when_stored(req.group_id, result, failed)

    def sync(self, group_id: str, generation_id: int, member_id: str, instance_id: str | None,
             protocol_type: str | None, protocol_name: str | None, assignments: dict[str, bytes]) -> asyncio.Future:
        error = self.check(group_id)
        if error is not None:
            return resolved(SyncResult(error))
        consumer_group = self.consumer.groups.get(group_id)
        if consumer_group is not None:
            result = self.classic_members.sync(consumer_group, generation_id, member_id, instance_id, protocol_type,
                                               protocol_name)
            return self.writes.when_stored(group_id, result, SyncResult(ErrorCode.COORDINATOR_NOT_AVAILABLE))
        return self.membership.sync(group_id, generation_id, member_id, instance_id, protocol_type, protocol_name,
                                    assignments)

    def heartbeat(self, group_id: str, generation_id: int, member_id: str, instance_id: str | None) -> ErrorCode:
        error = self.check(group_id)
        if error == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:
            # As Kafka's coordinators answer it: clients do not expect this error on a heartbeat (aiokafka's consumer
            # dies of it); once loaded, the member's next heartbeat tells it what it must do.
            return ErrorCode.NONE
        if error is not None:
            return error
        consumer_group = self.consumer.groups.get(group_id)
        if consumer_group is not None:
            return self.classic_members.heartbeat(consumer_group, generation_id, member_id, instance_id)
        return self.membership.heartbeat(group_id, generation_id, member_id, instance_id)

    def leave(self, group_id: str, leaving: list[tuple[str, str | None]]) -> tuple[ErrorCode, list[ErrorCode]]:
        """The caller answers after stored(group_id)."""
        error = self.check(group_id)
        if error is not None:
            return error, []
        consumer_group = self.consumer.groups.get(group_id)
        if consumer_group is not None:
            return ErrorCode.NONE, self.classic_members.leave(consumer_group, leaving)
        return self.membership.leave(group_id, leaving)

    # ---- online migration (kop.groups.consumer.migration)

    def _upgrade(self, classic: Group, hb: Heartbeat) -> tuple[ErrorCode, str] | None:
        """Turn a classic group with members into a consumer group for the member joining; None if done, else the
        error and why (the group then stays as it was: nothing is changed unless the member can join)."""
        group_id = classic.group_id
        if not self.migration.upgrades:
            return ErrorCode.GROUP_ID_NOT_FOUND, \
                f"Cannot upgrade classic group {group_id} to consumer group because the online upgrade is disabled."
        if classic.protocol_type != CONSUMER_PROTOCOL_TYPE:
            return ErrorCode.GROUP_ID_NOT_FOUND, f"Group {group_id} is not a consumer group."
        max_size = self.config.group_max_size
        if len(classic.members) > max_size:
            return ErrorCode.GROUP_ID_NOT_FOUND, \
                f"Cannot upgrade classic group {group_id}: it has more members than a consumer group may have."
        takes_a_place = hb.instance_id is not None and hb.instance_id in classic.static_members
        if len(classic.members) == max_size and not takes_a_place:
            return ErrorCode.GROUP_MAX_SIZE_REACHED, \
                f"The consumer group has reached its maximum capacity of {max_size} members."
        try:
            group = to_consumer_group(classic)
        except MigrationRefused as exc:
            return ErrorCode.GROUP_ID_NOT_FOUND, \
                f"Cannot upgrade the classic group {group_id} to consumer group: {exc}."
        self.membership.hand_over(classic)
        del self.groups[group_id]
        self.consumer.groups[group_id] = group
        self.consumer.arm_restored(group)
        self._consumer_changed(group)
        log.info("classic group %s with %d members became a consumer group at epoch %d (online upgrade)", group_id,
                 len(group.members), group.epoch)
        return None

    def _maybe_downgrade(self, group: ConsumerGroup, member_id: str, why: str) -> bool:
        """A member is fenced out: if it was the last consumer-protocol member and classic members remain, the
        group becomes a classic group instead (Kafka's online downgrade)."""
        if not group.all_classic_except(member_id) or len(group.members) <= 1 or not self.migration.downgrades \
                or len(group.members) - 1 > self.config.group_max_size:
            return False
        log.info("consumer group %s: its last consumer-protocol member %s is out (%s)", group.group_id, member_id,
                 why)
        return self._downgrade(group, member_id)

    def _downgrade(self, group: ConsumerGroup, leaving: str | None) -> bool:
        try:
            classic = to_classic_group(group, leaving)
        except MigrationRefused as exc:
            log.warning("consumer group %s stays a consumer group: %s", group.group_id, exc)
            return False
        self.consumer.forget(group.group_id)
        self.groups[group.group_id] = classic
        self.membership.restored(classic)
        record = generation_record(classic, {m.member_id: m.assignment for m in classic.members.values()})
        self.writes.write(group.group_id, lambda: record)
        log.info("consumer group %s with %d classic members became a classic group at generation %d (online "
                 "downgrade)", group.group_id, len(classic.members), classic.generation_id)
        self.membership.rebalance(classic, "the group became a classic group")
        return True

    # ---- the consumer group protocol (KIP-848)

    def _partition_counts(self, names: frozenset[str]) -> dict[str, int]:
        out = {}
        for name in names:
            topic = self.topics.get(name)
            if topic is not None:
                out[name] = topic.count  # every partition, wherever it is served
        return out

    async def consumer_heartbeat(self, hb: Heartbeat, describable: Callable[[str], bool]) -> HeartbeatResult:
        """Answered once what it changed is stored."""
        if not hb.group_id:
            return HeartbeatResult(ErrorCode.INVALID_REQUEST, "GroupId can't be empty.", hb.member_id or None,
                                   hb.member_epoch)
        refused = self.consumer.refusal(hb)
        if refused is not None:
            return refused
        error, message = self.check(hb.group_id), None
        classic = self.groups.get(hb.group_id) if error is None else None
        if classic is not None:
            if self._idle(classic):
                if hb.member_epoch != JOIN_EPOCH:
                    error = ErrorCode.UNKNOWN_MEMBER_ID
                else:  # an empty classic group becomes a consumer-protocol group; its offsets stay
                    self.membership.forget(classic)
                    del self.groups[hb.group_id]
            elif hb.member_epoch != JOIN_EPOCH:
                error, message = ErrorCode.GROUP_ID_NOT_FOUND, f"Group {hb.group_id} is not a consumer group."
            else:
                error, message = self._upgrade(classic, hb) or (None, None)
        if error is not None:
            return HeartbeatResult(error, message, hb.member_id or None, hb.member_epoch)
        result = self.consumer.heartbeat(hb, describable)
        if not await self.stored(hb.group_id):
            return HeartbeatResult(ErrorCode.COORDINATOR_NOT_AVAILABLE, "the group's state could not be stored",
                                   hb.member_id or None, hb.member_epoch)
        return result

    def consumer_group(self, group_id: str) -> ConsumerGroup | None:
        return self.consumer.groups.get(group_id)

    @staticmethod
    def _idle(group: Group) -> bool:
        return group.is_(GroupState.EMPTY) and not group.pending_members

    # ---- offsets

    def validate_commit(self, group_id: str, generation_id: int, member_id: str,
                        instance_id: str | None, commit_version: int | None = None) -> ErrorCode:
        """May this request commit? Generation -1 with no members is a simple (assign-only) commit.
        commit_version: OffsetCommit's version (None: TxnOffsetCommit)."""
        error = self.check(group_id, allow_empty=True)
        if error is not None:
            return error
        consumer_group = self.consumer.groups.get(group_id)
        if consumer_group is not None:
            member = consumer_group.members.get(member_id)
            if member is not None and member.classic is None and commit_version is not None and commit_version < 9:
                return ErrorCode.UNSUPPORTED_VERSION  # Kafka: a consumer-protocol member commits with v9+
            return self._validate_member_epoch(consumer_group, member_id, generation_id)
        group = self.groups.get(group_id)
        if group is None:
            # generation -1: a group that only stores offsets, created by its first commit that gets stored
            return ErrorCode.NONE if generation_id < 0 else ErrorCode.ILLEGAL_GENERATION
        if group.is_(GroupState.DEAD):
            return ErrorCode.COORDINATOR_NOT_AVAILABLE  # being deleted; the client retries
        if group.is_static_member_fenced(instance_id, member_id):
            return ErrorCode.FENCED_INSTANCE_ID
        if generation_id < 0 and group.is_(GroupState.EMPTY):
            return ErrorCode.NONE
        # The member and its generation first, as Kafka checks them: a member the group no longer has must learn
        # that it lost its partitions. Told REBALANCE_IN_PROGRESS it only rejoins, and kafka-python then keeps its
        # old positions for the partitions it is given again, behind what other members committed meanwhile.
        if not group.has(member_id):
            return ErrorCode.UNKNOWN_MEMBER_ID
        if generation_id != group.generation_id:
            return ErrorCode.ILLEGAL_GENERATION
        if group.is_(GroupState.COMPLETING_REBALANCE):
            return ErrorCode.REBALANCE_IN_PROGRESS
        # PreparingRebalance is fine: eager members commit before they rejoin.
        self.membership.touch(group, member_id)
        return ErrorCode.NONE

    def validate_fetch(self, group_id: str, member_id: str | None, member_epoch: int) -> ErrorCode:
        """OffsetFetch v9+ from a member of a consumer-protocol group names its epoch; others (admin clients, classic
        groups) send none, or Kafka ignores it."""
        consumer_group = self.consumer.groups.get(group_id)
        if consumer_group is None or (member_id is None and member_epoch < 0):
            return ErrorCode.NONE
        return self._validate_member_epoch(consumer_group, member_id or "", member_epoch, for_fetch=True)

    @staticmethod
    def _validate_member_epoch(group: ConsumerGroup, member_id: str, epoch: int, for_fetch: bool = False) -> ErrorCode:
        if epoch < 0 and not for_fetch and not group.members:
            return ErrorCode.NONE  # a commit from outside the group (an admin client) while it is empty
        member = group.members.get(member_id)
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if epoch == member.epoch:
            return ErrorCode.NONE
        # a classic member names its epoch as its generation
        return ErrorCode.ILLEGAL_GENERATION if member.classic is not None else ErrorCode.STALE_MEMBER_EPOCH

    def commit(self, group_id: str, topic: str, partition: int, offset: int, leader_epoch: int = -1,
               metadata: str | None = "", commit_timestamp: int = -1, keep_newer: bool = False) -> asyncio.Future:
        """Store one offset after validate_commit said yes; resolves to its ErrorCode once durable. keep_newer:
        not if a commit with a later timestamp was made (a transaction's offsets on completion)."""
        group = self.groups.get(group_id)
        consumer_group = group is None and group_id in self.consumer.groups
        protocol_type = CONSUMER_PROTOCOL_TYPE if consumer_group else group.protocol_type if group is not None else None
        result = self.offsets.commit(group_id, topic, partition, offset, leader_epoch, metadata, commit_timestamp,
                                     protocol_type, keep_newer)
        if group is None and not consumer_group and self.offsets.has_offsets(group_id):
            # Only a commit that is being stored makes a group: one refused (unknown topic, metadata too large)
            # leaves none behind, as in Kafka.
            self.groups[group_id] = Group(group_id)
        return result

    def _being_deleted(self, group_id: str) -> bool:
        group = self.groups.get(group_id)
        return group is not None and group.is_(GroupState.DEAD)

    def fetch_offset(self, group_id: str, topic: str, partition: int) -> CommittedOffset | None:
        return None if self._being_deleted(group_id) else self.offsets.fetch(group_id, topic, partition)

    def newest_offset(self, group_id: str, topic: str, partition: int) -> int | None:
        """The offset of the group's latest commit on the partition, durable or still being written."""
        return None if self._being_deleted(group_id) else self.offsets.newest_offset(group_id, topic, partition)

    def replicated_on(self, topic: str, partition: int, every: bool) -> dict[str, int]:
        """The committed offsets on the partition of the replicated groups this broker coordinates (of every group
        when `every`), for the PIP-33 snapshot controller."""
        found = self.offsets.replicated_on(topic, partition, every)
        return {group: offset for group, offset in found.items() if not self._being_deleted(group)}

    def committed_on(self, topic: str, partition: int) -> dict[str, CommittedOffset]:
        """The committed offset of every group this broker coordinates that has one on the partition."""
        found = {group_id: self.fetch_offset(group_id, topic, partition) for group_id in sorted(set(self.group_ids()))}
        return {group_id: committed for group_id, committed in found.items() if committed is not None}

    def fetch_all_offsets(self, group_id: str) -> dict[tuple[str, int], CommittedOffset]:
        return {} if self._being_deleted(group_id) else self.offsets.fetch_all(group_id)

    async def delete_offsets(self, group_id: str,
                             partitions: list[tuple[str, int]]) -> tuple[ErrorCode, dict[tuple[str, int], ErrorCode]]:
        """OffsetDelete: an Empty group loses any offsets; a live consumer group only those of topics it does not
        subscribe to."""
        error = self.check(group_id)
        if error is not None:
            return error, {}
        consumer_group = self.consumer.groups.get(group_id)
        if consumer_group is not None:
            return ErrorCode.NONE, await self._delete_offsets(group_id, partitions, consumer_group.subscribed_topics())
        group = self.groups.get(group_id)
        if group is None or group.is_(GroupState.DEAD):
            return ErrorCode.GROUP_ID_NOT_FOUND, {}
        if not group.is_(GroupState.EMPTY) and group.protocol_type != "consumer":
            return ErrorCode.NON_EMPTY_GROUP, {}
        subscribed = frozenset() if group.is_(GroupState.EMPTY) else \
            frozenset(topic for topic, _ in partitions if group.is_subscribed_to(topic))
        results = await self._delete_offsets(group_id, partitions, subscribed)
        if self.groups.get(group_id) is group and self._idle_without_offsets(group):
            self._discard(group)  # its last offset went: Kafka drops the group at once
        return ErrorCode.NONE, results

    async def _delete_offsets(self, group_id: str, partitions: list[tuple[str, int]],
                              subscribed: frozenset[str]) -> dict[tuple[str, int], ErrorCode]:
        results = {}
        for topic, partition in partitions:
            known = self.topics.get(topic)  # wherever it is served: a cluster's coordinator owns few of them
            if known is None or not 0 <= partition < known.count:
                results[(topic, partition)] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            elif topic in subscribed:
                results[(topic, partition)] = ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC
            else:
                await self.offsets.delete(group_id, topic, partition)
                results[(topic, partition)] = ErrorCode.NONE
        return results

    # ---- admin

    def _alive(self, group: Group) -> bool:
        """False for an Empty group whose every offset went with deleted topics (Kafka drops it at once)."""
        if not group.is_(GroupState.EMPTY) or group.pending_members:
            return not group.is_(GroupState.DEAD)
        if self.offsets.ever_had_offsets(group.group_id) and not self.offsets.has_offsets(group.group_id):
            self._discard(group)
            return False
        return True

    def list_groups(self, states: list[str] | None = None, types: list[str] | None = None) -> list[GroupListing]:
        kinds = {t.lower() for t in types} if types else {CLASSIC_GROUP_TYPE, CONSUMER_GROUP_TYPE}
        listed = []
        if CLASSIC_GROUP_TYPE in kinds:
            listed += [GroupListing(g.group_id, g.protocol_type or "", g.state.value)
                       for g in list(self.groups.values()) if self._alive(g)]
        if CONSUMER_GROUP_TYPE in kinds:
            listed += [GroupListing(g.group_id, CONSUMER_PROTOCOL_TYPE, g.state.value, CONSUMER_GROUP_TYPE)
                       for g in self.consumer.groups.values()]
        wanted = {s.lower() for s in states} if states else None
        return [g for g in listed if wanted is None or g.state.lower() in wanted]

    def describe(self, group_id: str) -> GroupDescription:
        error = self.check(group_id, allow_empty=True)
        if error is not None:
            return GroupDescription(error, group_id)
        consumer_group = self.consumer.groups.get(group_id)
        if consumer_group is not None:
            return _describe_consumer_group(consumer_group)
        group = self.groups.get(group_id)
        if group is None or not self._alive(group):
            return GroupDescription(ErrorCode.GROUP_ID_NOT_FOUND, group_id)
        stable = group.is_(GroupState.STABLE)
        members = tuple(
            MemberDescription(m.member_id, m.group_instance_id, m.client_id, m.client_host,
                              m.metadata_for(group.protocol_name) if stable else b"",
                              m.assignment if stable else b"")
            for m in group.members.values())
        return GroupDescription(ErrorCode.NONE, group_id, group.state.value, group.protocol_type or "",
                                group.protocol_name or "" if stable else "", members)

    async def delete_groups(self, group_ids: list[str]) -> list[tuple[str, ErrorCode]]:
        results = []
        for group_id in group_ids:
            error = self.check(group_id, allow_empty=True)
            if error is None and group_id in self.consumer.groups:
                results.append((group_id, await self._delete_consumer_group(group_id)))
                continue
            group = self.groups.get(group_id) if error is None else None
            if error is None and (group is None or not self._alive(group)):
                error = ErrorCode.GROUP_ID_NOT_FOUND
            elif error is None and not group.is_(GroupState.EMPTY):
                error = ErrorCode.NON_EMPTY_GROUP
            if error is None:
                error = await self._delete(group)
            results.append((group_id, error or ErrorCode.NONE))
        return results

    async def _delete_consumer_group(self, group_id: str) -> ErrorCode:
        group = self.consumer.groups[group_id]
        if group.members:
            return ErrorCode.NON_EMPTY_GROUP
        self.consumer.forget(group_id)
        await self.stored(group_id)  # its last change first: a write landing after the deletion would bring it back
        try:
            await self.generations.delete(group_id)
            await self.offsets.delete_group(group_id)
        except (OSError, RuntimeError) as exc:  # RuntimeError: the generation log closed (shutting down)
            log.error("could not delete the offsets of group %s: %s", group_id, exc)
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        log.info("deleted consumer group %s and its offsets", group_id)
        return ErrorCode.NONE

    async def _delete(self, group: Group) -> ErrorCode | None:
        """Delete a group and answer once it is gone for good. Until then it stays in the table as Dead, so joins and
        commits get COORDINATOR_NOT_AVAILABLE (clients retry, and the retry lands after the deletion, in a new
        group) and nothing is written between the cursor deletions."""
        group_id = group.group_id
        group.transition(GroupState.DEAD)
        self.membership.forget(group)
        try:
            await self.generations.delete(group_id)
            await self.offsets.delete_group(group_id)
        except (OSError, RuntimeError) as exc:  # RuntimeError: the generation log closed (shutting down)
            log.error("could not delete group %s: %s", group_id, exc)
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        finally:
            if self.groups.get(group_id) is group:
                del self.groups[group_id]
                if self.offsets.has_offsets(group_id):
                    self.groups[group_id] = Group(group_id)  # a failed deletion left offsets: keep them listed
        log.info("deleted group %s and its offsets", group_id)
        return None


def _described_member(m: ConsumerMember) -> MemberDescription:
    """A classic member shows the subscription it joined with; a consumer-protocol member one made from its
    subscribed topics; both their partitions in the classic consumer protocol's encoding."""
    if m.classic is not None:
        metadata = m.classic.protocols[0][1]
        try:
            version = version_of(metadata)
        except EmbeddedProtocolError:
            version = 0
    else:
        metadata, version = encode_subscription(m.subscribed_topics), 0
    return MemberDescription(m.member_id, m.instance_id, m.client_id, m.client_host, metadata,
                             encode_assignment(m.assigned, version))


def _describe_consumer_group(group: ConsumerGroup) -> GroupDescription:
    """A consumer-protocol group as DescribeGroups shows it (as Kafka does): protocol type "consumer", the assignor
    as the protocol, and each member's subscription and partitions in the classic consumer protocol's encoding."""
    state = group.state
    return GroupDescription(ErrorCode.NONE, group.group_id, state.value, CONSUMER_PROTOCOL_TYPE,
                            group.assignor if state is not ConsumerGroupState.EMPTY else "",
                            tuple(_described_member(m) for m in group.members.values()))
