"""The group generation log: each group's latest stable generation, so generation ids never repeat after a restart.

Kafka keeps a group's generation in __consumer_offsets; without it a restarted broker would count generations from 0
again, and a member of a pre-crash generation N could not be told apart from a member of the new generation N.
Membership itself stays in memory (members rejoin after a restart); only the generation number is durable.

GenerationLog: an append-only file of framed `GroupGeneration` records, the last record of a group wins. It is
written when a generation becomes stable (the leader's SyncGroup, as Kafka stores the group there) and fsynced before
any member learns its assignment. It is rewritten without dead records once they outnumber the live ones.
StoredGenerations: the same records as rows of a record store (the PostgreSQL engine's), one per group.
"""
import asyncio
import os
from typing import Protocol

from kop.ledger.framed_file import HEADER_SIZE, frame, replace_atomically, scan_records, write_all
from proto.kop_pb2 import GroupGeneration

MAX_RECORD = 1 << 16
COMPACT_MIN_RECORDS = 1024


class GenerationLog:
    def __init__(self, path: str, durable: bool = True) -> None:
        self._path = path
        self._durable = durable
        self._lock = asyncio.Lock()
        self.generations: dict[str, tuple[int, str]] = {}  # group id -> (generation, protocol type)
        self._records = 0
        self._fd = -1

    async def load(self) -> dict[str, tuple[int, str]]:
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
            self.generations[record.group_id] = (record.generation_id, record.protocol_type)

    async def record(self, group_id: str, generation_id: int, protocol_type: str | None) -> None:
        """Durably note that the group reached this generation."""
        await self._append(GroupGeneration(group_id=group_id, generation_id=generation_id,
                                           protocol_type=protocol_type or ""))

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
        live = b"".join(frame(GroupGeneration(group_id=g, generation_id=gen, protocol_type=ptype).SerializeToString())
                        for g, (gen, ptype) in self.generations.items())
        replace_atomically(self._path, live, self._durable)
        os.close(self._fd)
        self._fd = os.open(self._path, os.O_RDWR | os.O_APPEND)
        self._records = len(self.generations)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


GENERATION_RECORD = "group-generation"


class RecordStore(Protocol):
    async def records(self, kind: str) -> dict[str, bytes]: ...

    async def put_record(self, kind: str, key: str, value: bytes) -> None: ...

    async def delete_record(self, kind: str, key: str) -> None: ...


class StoredGenerations:
    """Each group's latest generation as one record (kind `group-generation`, keyed by group id) of a store."""

    def __init__(self, store: RecordStore) -> None:
        self._store = store
        self._lock = asyncio.Lock()  # one write at a time: a later generation is never overwritten by an earlier one
        self.generations: dict[str, tuple[int, str]] = {}

    async def load(self) -> dict[str, tuple[int, str]]:
        for group_id, value in (await self._store.records(GENERATION_RECORD)).items():
            record = GroupGeneration.FromString(value)
            self.generations[group_id] = (record.generation_id, record.protocol_type)
        return dict(self.generations)

    async def record(self, group_id: str, generation_id: int, protocol_type: str | None) -> None:
        record = GroupGeneration(group_id=group_id, generation_id=generation_id, protocol_type=protocol_type or "")
        async with self._lock:
            await self._store.put_record(GENERATION_RECORD, group_id, record.SerializeToString())
            self.generations[group_id] = (generation_id, record.protocol_type)

    async def delete(self, group_id: str) -> None:
        async with self._lock:
            if group_id in self.generations:
                await self._store.delete_record(GENERATION_RECORD, group_id)
                self.generations.pop(group_id, None)

    def close(self) -> None:
        """Nothing to release: the store is the broker's."""
