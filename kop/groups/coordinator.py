"""The group coordinator: every group this broker coordinates (all of them: one broker), their membership
protocol, their committed offsets, and the admin operations on both.

Groups with committed offsets are found at start-up by looking at the cursors of every partition; they exist in
state Empty until members join. Until that scan is done the group APIs answer COORDINATOR_LOAD_IN_PROGRESS (the
broker opens its listener only after the scan, so clients meet it only while the broker stops).
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
from kop.groups.generations import generation_record, restore_group
from kop.groups.group import Group, GroupState, JoinResult, SyncResult
from kop.groups.membership import JoinRequest, Membership, resolved
from kop.groups.offsets import SYSTEM_CURSOR_PREFIX, CommittedOffset, OffsetStore
from protocol.errors import ErrorCode

if TYPE_CHECKING:  # kop.topics imports kop.groups (generations) for the storage engines
    from kop.topics import TopicManager

log = logging.getLogger(__name__)

CLASSIC_GROUP_TYPE = "classic"


@dataclass(frozen=True, slots=True)
class GroupListing:
    group_id: str
    protocol_type: str
    state: str


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
        self.membership = Membership(self.groups, config.group_initial_rebalance_delay_ms,
                                     config.group_min_session_timeout_ms, config.group_max_session_timeout_ms,
                                     config.group_max_size, self._store_generation)
        self.sweep_interval_ms = config.offsets_retention_check_interval_ms
        self.loaded = False
        self._sweeper: asyncio.Task | None = None
        self._forgetting: set[asyncio.Task] = set()  # generation-log deletions in flight
        self._clustered = False  # a cluster's coordinator: groups come and go with its shards (kop/cluster/groups.py)
        self._serves: Callable[[str], ErrorCode | None] = lambda group_id: None

    def join_cluster(self, offsets: "OffsetStore", serves: Callable[[str], ErrorCode | None]) -> None:
        """Coordinate only the groups of the shards this broker owns in a cluster (kop/cluster/groups.py adopts and
        drops them); serves(group_id): why this broker may not serve the group now, None when it may."""
        self.offsets = offsets
        self._serves = serves
        self._clustered = True

    def adopt(self, group_id: str, generation: int, protocol_type: str | None) -> None:
        """A group of a shard this broker took over: known, Empty, past every generation handed out before."""
        group = self.groups.setdefault(group_id, Group(group_id, protocol_type=protocol_type or None))
        group.generation_id = max(group.generation_id, generation)

    def drop(self, group_id: str) -> None:
        """A group of a shard that moved to another broker: its members, waiting or not, are let go."""
        group = self.groups.pop(group_id, None)
        if group is not None:
            self.membership.forget(group)

    # ---- lifecycle

    async def start(self) -> None:
        """Find the groups that have committed offsets (topics must be loaded), then serve. In a cluster the
        groups come with the shards instead."""
        if not self._clustered:
            for group_id, protocol_type in self.offsets.load().items():
                self.groups.setdefault(group_id, Group(group_id, protocol_type=protocol_type))
            for group_id, record in (await self.generations.load()).items():
                group = self.groups.setdefault(group_id, Group(group_id, protocol_type=record.protocol_type or None))
                restore_group(group, record)
                self.membership.restored(group)
        self.loaded = True
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep_loop())
        log.info("group coordinator loaded %d groups with committed offsets", len(self.groups))

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        self.membership.close()
        await self.membership.settle()
        await self.settle()
        self.generations.close()
        self.loaded = False

    async def settle(self) -> None:
        """Wait for the generation-log deletions of discarded groups."""
        if self._forgetting:
            await asyncio.gather(*self._forgetting, return_exceptions=True)

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(max(1.0, self.sweep_interval_ms / 1000))
            self.sweep()

    def sweep(self) -> None:
        """Forget Empty groups that have no committed offsets left."""
        for group in list(self.groups.values()):
            if self._idle_without_offsets(group):
                self._discard(group)

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
        if group.group_id in self.generations.generations:
            task = asyncio.get_running_loop().create_task(self.generations.delete(group.group_id))
            self._forgetting.add(task)
            task.add_done_callback(self._forgetting.discard)

    async def _store_generation(self, group: Group, assignments: dict[str, bytes]) -> None:
        await self.generations.record(generation_record(group, assignments))

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
        return self.membership.join(req)

    def sync(self, group_id: str, generation_id: int, member_id: str, instance_id: str | None,
             protocol_type: str | None, protocol_name: str | None, assignments: dict[str, bytes]) -> asyncio.Future:
        error = self.check(group_id)
        if error is not None:
            return resolved(SyncResult(error))
        return self.membership.sync(group_id, generation_id, member_id, instance_id, protocol_type, protocol_name,
                                    assignments)

    def heartbeat(self, group_id: str, generation_id: int, member_id: str, instance_id: str | None) -> ErrorCode:
        return self.check(group_id) or self.membership.heartbeat(group_id, generation_id, member_id, instance_id)

    def leave(self, group_id: str, leaving: list[tuple[str, str | None]]) -> tuple[ErrorCode, list[ErrorCode]]:
        error = self.check(group_id)
        if error is not None:
            return error, []
        return self.membership.leave(group_id, leaving)

    # ---- offsets

    def validate_commit(self, group_id: str, generation_id: int, member_id: str,
                        instance_id: str | None) -> ErrorCode:
        """May this request commit? Generation -1 with no members is a simple (assign-only) commit."""
        error = self.check(group_id, allow_empty=True)
        if error is not None:
            return error
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
        if group.is_(GroupState.COMPLETING_REBALANCE):
            return ErrorCode.REBALANCE_IN_PROGRESS
        if not group.has(member_id):
            return ErrorCode.UNKNOWN_MEMBER_ID
        if generation_id != group.generation_id:
            return ErrorCode.ILLEGAL_GENERATION
        # PreparingRebalance is fine: eager members commit before they rejoin.
        self.membership.touch(group, member_id)
        return ErrorCode.NONE

    def commit(self, group_id: str, topic: str, partition: int, offset: int, leader_epoch: int = -1,
               metadata: str | None = "", commit_timestamp: int = -1, keep_newer: bool = False) -> asyncio.Future:
        """Store one offset after validate_commit said yes; resolves to its ErrorCode once durable. keep_newer:
        not if a commit with a later timestamp was made (a transaction's offsets on completion)."""
        group = self.groups.get(group_id)
        result = self.offsets.commit(group_id, topic, partition, offset, leader_epoch, metadata, commit_timestamp,
                                     group.protocol_type if group is not None else None, keep_newer)
        if group is None and self.offsets.has_offsets(group_id):
            # Only a commit that is being stored makes a group: one refused (unknown topic, metadata too large)
            # leaves none behind, as in Kafka.
            self.groups[group_id] = Group(group_id)
        return result

    def _being_deleted(self, group_id: str) -> bool:
        group = self.groups.get(group_id)
        return group is not None and group.is_(GroupState.DEAD)

    def fetch_offset(self, group_id: str, topic: str, partition: int) -> CommittedOffset | None:
        return None if self._being_deleted(group_id) else self.offsets.fetch(group_id, topic, partition)

    def committed_on(self, topic: str, partition: int) -> dict[str, CommittedOffset]:
        """The committed offset of every group this broker coordinates that has one on the partition."""
        found = {group_id: self.fetch_offset(group_id, topic, partition) for group_id in sorted(self.groups)}
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
        group = self.groups.get(group_id)
        if group is None or group.is_(GroupState.DEAD):
            return ErrorCode.GROUP_ID_NOT_FOUND, {}
        if not group.is_(GroupState.EMPTY) and group.protocol_type != "consumer":
            return ErrorCode.NON_EMPTY_GROUP, {}
        results = {}
        for topic, partition in partitions:
            known = self.topics.get(topic)  # wherever it is served: a cluster's coordinator owns few of them
            if known is None or not 0 <= partition < known.count:
                results[(topic, partition)] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            elif not group.is_(GroupState.EMPTY) and group.is_subscribed_to(topic):
                results[(topic, partition)] = ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC
            else:
                await self.offsets.delete(group_id, topic, partition)
                results[(topic, partition)] = ErrorCode.NONE
        if self.groups.get(group_id) is group and self._idle_without_offsets(group):
            self._discard(group)  # its last offset went: Kafka drops the group at once
        return ErrorCode.NONE, results

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
        if types and CLASSIC_GROUP_TYPE not in {t.lower() for t in types}:
            return []
        wanted = {s.lower() for s in states} if states else None
        out = []
        for group in list(self.groups.values()):
            if not self._alive(group):
                continue
            if wanted is not None and group.state.value.lower() not in wanted:
                continue
            out.append(GroupListing(group.group_id, group.protocol_type or "", group.state.value))
        return out

    def describe(self, group_id: str) -> GroupDescription:
        error = self.check(group_id, allow_empty=True)
        if error is not None:
            return GroupDescription(error, group_id)
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
            group = self.groups.get(group_id) if error is None else None
            if error is None and (group is None or not self._alive(group)):
                error = ErrorCode.GROUP_ID_NOT_FOUND
            elif error is None and not group.is_(GroupState.EMPTY):
                error = ErrorCode.NON_EMPTY_GROUP
            if error is None:
                error = await self._delete(group)
            results.append((group_id, error or ErrorCode.NONE))
        return results

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
