"""The group generation log: each group's latest generation and its members, as Kafka keeps them in
__consumer_offsets.

Without it a restarted broker would count generations from 0 again (a member of a pre-crash generation N could not be
told apart from a member of the new generation N), and would forget who the members are: each would learn it is
unknown only at its next heartbeat, while a member that rejoined first is handed partitions the others still
consume. With the members stored (ids, timeouts, protocols, assignments), a restarted coordinator restores the group
Stable in its generation: members heartbeat on as if nothing happened, and those gone expire after their session
timeout.

GenerationLog: an append-only file of framed `GroupGeneration` records, the last record of a group wins. It is
written when a generation becomes stable (the leader's SyncGroup, as Kafka stores the group there) and fsynced before
any member learns its assignment, and when the group becomes empty. It is rewritten without dead records once they
outnumber the live ones.
StoredGenerations: the same records as rows of a record store (the PostgreSQL engine's), one per group; in a cluster
each write checks, in its transaction, the fencing epoch of the group's shard (kop/cluster/groups.py): a coordinator
that lost the shard can no longer store a generation, so it cannot overwrite its successor's.
"""
import asyncio
import contextlib
import os
from collections.abc import Callable
from typing import Protocol

from kop.groups.group import Group, GroupState, Member
from kop.ledger.postgres.store import LedgerFencedOut
from kop.ledger.framed_file import HEADER_SIZE, frame, replace_atomically, scan_records, write_all
from proto.kop_pb2 import GroupGeneration, GroupMemberRecord, GroupProtocolRecord

MAX_RECORD = 16 << 20  # a group's members with their subscriptions and assignments
COMPACT_MIN_RECORDS = 1024


def generation_record(group: Group, assignments: dict[str, bytes]) -> GroupGeneration:
    """The group at its current generation: its members (none when empty) with the assignments handed out."""
    return GroupGeneration(
        group_id=group.group_id, generation_id=group.generation_id, protocol_type=group.protocol_type or "",
        protocol_name=group.protocol_name or "", leader_id=group.leader_id or "",
        members=[GroupMemberRecord(
            member_id=m.member_id, group_instance_id=m.group_instance_id, client_id=m.client_id,
            client_host=m.client_host, session_timeout_ms=m.session_timeout_ms,
            rebalance_timeout_ms=m.rebalance_timeout_ms, assignment=assignments.get(m.member_id, b""),
            protocols=[GroupProtocolRecord(name=name, metadata=metadata) for name, metadata in m.protocols])
            for m in group.members.values()])


def restore_group(group: Group, record: GroupGeneration) -> None:
    """Put a loaded group back where the record left it: its generation, and if it had members, Stable with them
    (the caller arms their sessions)."""
    group.generation_id = record.generation_id  # the next rebalance moves past every generation handed out before
    if not record.members or not record.protocol_name:
        return
    group.protocol_type = record.protocol_type or None
    for m in record.members:
        group.add(Member(m.member_id, m.group_instance_id if m.HasField("group_instance_id") else None, m.client_id,
                         m.client_host, m.session_timeout_ms, m.rebalance_timeout_ms, record.protocol_type,
                         [(p.name, p.metadata) for p in m.protocols], m.assignment))
    group.protocol_name = record.protocol_name
    group.leader_id = record.leader_id if record.leader_id in group.members else next(iter(group.members))
    group.subscribed_topics = group.compute_subscribed_topics()
    group.state = GroupState.STABLE  # loaded, not a transition: the generation was stable when stored


class GenerationLog:
    def __init__(self, path: str, durable: bool = True) -> None:
        self._path = path
        self._durable = durable
        self._lock = asyncio.Lock()
        self.generations: dict[str, GroupGeneration] = {}  # group id -> its latest record
        self._records = 0
        self._fd = -1

    async def load(self) -> dict[str, GroupGeneration]:
        """Read the log (truncating a torn tail) and open it for appends."""
        os.makedirs(os.path.dirname(self._path), exist_ok=True)
        self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        size = os.fstat(self._fd).st_size
        end = 0
        for pos, payload in scan_records(self._fd, 0, size, MAX_RECORD):
            end = pos + HEADER_SIZE + len(payload)
            self._apply(GroupGeneration.FromString(payload))
            self._records += 1
        if end < size:
            os.ftruncate(self._fd, end)
        return dict(self.generations)

    def _apply(self, record: GroupGeneration) -> None:
        if record.deleted:
            self.generations.pop(record.group_id, None)
        else:
            self.generations[record.group_id] = record

    async def record(self, record: GroupGeneration) -> None:
        """Durably note that the group reached this generation, with these members."""
        await self._append(record)

    async def delete(self, group_id: str) -> None:
        if group_id in self.generations:
            await self._append(GroupGeneration(group_id=group_id, deleted=True))

    async def _append(self, record: GroupGeneration) -> None:
        async with self._lock:
            if self._fd < 0:
                raise RuntimeError("generation log is closed")
            data = frame(record.SerializeToString())
            await asyncio.to_thread(self._write, data)
            self._apply(record)
            self._records += 1
            if self._records >= COMPACT_MIN_RECORDS and self._records > 2 * len(self.generations):
                await asyncio.to_thread(self._compact)

    def _write(self, data: bytes) -> None:
        write_all(self._fd, data)
        if self._durable:
            os.fsync(self._fd)

    def _compact(self) -> None:
        live = b"".join(frame(record.SerializeToString()) for record in self.generations.values())
        replace_atomically(self._path, live, self._durable)
        os.close(self._fd)
        self._fd = os.open(self._path, os.O_RDWR | os.O_APPEND)
        self._records = len(self.generations)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


GENERATION_RECORD = "group-generation"


Fence = tuple[str, int]  # (managed ledger name, epoch) that must still be current for a write to happen


class RecordStore(Protocol):
    async def records(self, kind: str) -> dict[str, bytes]: ...

    async def put_record(self, kind: str, key: str, value: bytes, fence: Fence | None = None) -> None: ...

    async def delete_record(self, kind: str, key: str, fence: Fence | None = None) -> None: ...


class CoordinatorMoved(Exception):
    """This broker does not coordinate the group now: it may not write its records."""


@contextlib.asynccontextmanager
async def _moved_when_fenced():
    try:
        yield
    except LedgerFencedOut as exc:  # the store refused the fence: another broker took the shard over
        raise CoordinatorMoved(str(exc)) from None


class StoredGenerations:
    """Each group's latest generation as one record (kind `group-generation`, keyed by group id) of a store."""

    def __init__(self, store: RecordStore) -> None:
        self._store = store
        self._lock = asyncio.Lock()  # one write at a time: a later generation is never overwritten by an earlier one
        self.generations: dict[str, GroupGeneration] = {}
        # In a cluster: group id -> the fence of its shard while this broker coordinates it (None: it does not)
        self.fence_of: Callable[[str], Fence | None] | None = None

    def _fence(self, group_id: str) -> Fence | None:
        if self.fence_of is None:
            return None
        fence = self.fence_of(group_id)
        if fence is None:
            raise CoordinatorMoved(f"group {group_id}: coordinated by another broker now")
        return fence

    async def load(self) -> dict[str, GroupGeneration]:
        for group_id, value in (await self._store.records(GENERATION_RECORD)).items():
            self.generations[group_id] = GroupGeneration.FromString(value)
        return dict(self.generations)

    async def record(self, record: GroupGeneration) -> None:
        async with self._lock, _moved_when_fenced():
            await self._store.put_record(GENERATION_RECORD, record.group_id, record.SerializeToString(),
                                         self._fence(record.group_id))
            self.generations[record.group_id] = record

    async def delete(self, group_id: str) -> None:
        async with self._lock, _moved_when_fenced():
            if group_id in self.generations:
                await self._store.delete_record(GENERATION_RECORD, group_id, self._fence(group_id))
                self.generations.pop(group_id, None)

    def close(self) -> None:
        """Nothing to release: the store is the broker's."""
