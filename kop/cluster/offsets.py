"""Committed offsets in a cluster: kept by each group's coordinator, stored in the partitions' cursor rows.

The coordinator of a group (kop/cluster/groups.py) may not own the partitions the group consumes, so it writes each
commit straight into the partition's `kop_cursor` row (the same ManagedCursorInfo a partition's own cursor writes:
the position of the last consumed entry, the offset and its metadata in the properties), in a transaction that checks
its coordinator epoch first (the one it accepted the commit under): a coordinator that lost its shard can never write
again, not even a commit it accepted before and took the shard over again since. It keeps its groups' offsets in
memory, read from the rows when it takes their shard over, so OffsetFetch never waits for the database. Commits that
arrive while one write is in flight share the next transaction, as appends do.
"""
import asyncio
import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from kop import clock
from kop.groups.offsets import (COMMIT_TS_KEY, LEADER_EPOCH_KEY, METADATA_KEY, OFFSET_KEY, PROTOCOL_TYPE_KEY,
                                REPLICATED_KEY, CommittedOffset, NotCoordinated, _done, java_length)
from kop.ledger.position import BEFORE_FIRST, Position
from kop.ledger.postgres.batcher import Batcher
from kop.ledger.postgres.cursors import encode_cursor
from kop.ledger.postgres.store import DATABASE_ERRORS, LedgerFencedOut, PgStore
from kop.topic_storage import PgTopicStorage
from kop.topics import TopicManager
from proto.kop_pb2 import ManagedCursorInfo
from protocol.errors import ErrorCode

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
# A group flagged for PIP-33 by the admin API, a record of its own (also before its first commit). Its cursor rows
# carry the flag too, as Pulsar stores it, and a group an UPDATE created has it there only.
REPLICATED_RECORD = "replicated-group"


@dataclass(slots=True)
class _Commit:
    group: str
    tp: TopicPartition
    committed: CommittedOffset
    protocol_type: str | None
    future: asyncio.Future
    fence: tuple[str, int]  # the coordinator epoch it was accepted under: written under that one only


@dataclass(frozen=True, slots=True)
class GroupRow:
    group: str
    committed: CommittedOffset
    protocol_type: str | None
    replicated: bool  # the row carries the PIP-33 flag


def decode_committed(info: bytes) -> GroupRow | None:
    """A group cursor row's committed offset; None for a cursor without one."""
    cursor = ManagedCursorInfo.FromString(info)
    longs = {p.name: p.value for p in cursor.position.properties}
    strings = {p.name: p.value for p in cursor.position.string_properties}
    if OFFSET_KEY not in longs:
        return None
    return GroupRow(cursor.name, CommittedOffset(longs[OFFSET_KEY], longs.get(LEADER_EPOCH_KEY, -1),
                                                 strings.get(METADATA_KEY, ""), longs.get(COMMIT_TS_KEY, -1)),
                    strings.get(PROTOCOL_TYPE_KEY), bool(longs.get(REPLICATED_KEY)))


def _resolve(future: asyncio.Future, code: ErrorCode) -> None:
    if not future.done():
        future.set_result(code)


class ClusterOffsetStore:
    """The offsets of the groups this broker coordinates; OffsetStore's interface as the group coordinator uses it."""

    def __init__(self, store: PgStore, topics: TopicManager, storage: PgTopicStorage, metadata_max_bytes: int,
                 fence_of: Callable[[str], tuple[str, int] | None]) -> None:
        """fence_of(group): (coordinator ledger name, epoch) while this broker coordinates the group, else None."""
        self._store = store
        self._topics = topics
        self._storage = storage
        self.metadata_max_bytes = metadata_max_bytes
        self._fence_of = fence_of
        # group -> partition -> (the topic's id then, the offset): a topic deleted and created again has none
        self._offsets: dict[str, dict[TopicPartition, tuple[bytes, CommittedOffset]]] = {}
        self._inflight: defaultdict[str, int] = defaultdict(int)
        self._newest: dict[tuple[str, TopicPartition], _Commit] = {}  # the latest commit handed, until it lands
        self._ever: set[str] = set()
        self._batcher = Batcher(self._flush)
        self.replicated: set[str] = set()  # PIP-33: groups whose rows carry REPLICATED_KEY (each new one gets it)
        self._protocols: dict[str, str] = {}  # group -> the protocol type its rows carry

    # ---- shards coming and going (kop/cluster/groups.py)

    async def read_flags(self) -> set[str]:
        """The groups flagged for PIP-33 by the admin API (read with the rows when shards are taken over)."""
        return set(await self._store.records(REPLICATED_RECORD))

    def adopt(self, rows: list[tuple[str, bytes]], wanted: Callable[[str], bool],
              flagged: set[str] = frozenset()) -> dict[str, str | None]:
        """Take the offsets of the groups `wanted` from (ledger name, cursor info) rows, and their PIP-33 flags
        (a row's, or `flagged`); their protocol types."""
        found: dict[str, str | None] = {}
        self.replicated |= {group for group in flagged if wanted(group)}
        for ledger, info in rows:
            tp = self._storage.partition_of(ledger)
            row = decode_committed(info) if tp is not None else None
            if row is None or not wanted(row.group):
                continue
            self._keep(row.group, tp, row.committed)
            self._ever.add(row.group)
            if row.replicated:
                self.replicated.add(row.group)
            found[row.group] = found.get(row.group) or row.protocol_type
            if row.protocol_type:
                self._protocols[row.group] = row.protocol_type
        return found

    def _keep(self, group: str, tp: TopicPartition, committed: CommittedOffset) -> None:
        topic = self._topics.get(tp[0])
        if topic is not None:
            self._offsets.setdefault(group, {})[tp] = (topic.topic_id, committed)

    def drop(self, group: str) -> None:
        self._offsets.pop(group, None)
        self._ever.discard(group)
        self.replicated.discard(group)
        self._protocols.pop(group, None)

    # ---- reading

    def load(self) -> dict[str, str | None]:
        return {}  # groups come with the shards this broker takes over

    def fetch(self, group: str, topic: str, index: int) -> CommittedOffset | None:
        kept, known = self._offsets.get(group, {}).get((topic, index)), self._topics.get(topic)
        return kept[1] if kept is not None and known is not None and kept[0] == known.topic_id else None

    def newest_offset(self, group: str, topic: str, index: int) -> int | None:
        """The offset of the group's latest commit on the partition, durable or still being written."""
        handed = self._newest.get((group, (topic, index)))
        if handed is not None:
            return handed.committed.offset
        committed = self.fetch(group, topic, index)
        return committed.offset if committed is not None else None

    def replicated_on(self, topic: str, index: int, every: bool) -> dict[str, int]:
        """The committed offsets on the partition of the replicated groups coordinated here (every group's when
        `every`)."""
        found = {group: self.fetch(group, topic, index) for group in self._offsets if every or group in self.replicated}
        return {group: committed.offset for group, committed in found.items() if committed is not None}

    def fetch_all(self, group: str) -> dict[TopicPartition, CommittedOffset]:
        found = {tp: self.fetch(group, *tp) for tp in sorted(self._offsets.get(group, {}))}
        return {tp: committed for tp, committed in found.items() if committed is not None}

    def has_offsets(self, group: str) -> bool:
        return bool(self._inflight.get(group)) or bool(self.fetch_all(group))

    def ever_had_offsets(self, group: str) -> bool:
        return group in self._ever

    def forget(self, group: str) -> None:
        if not self.has_offsets(group):
            self.drop(group)

    # ---- writing

    def commit(self, group: str, topic: str, index: int, offset: int, leader_epoch: int = -1,
               metadata: str | None = "", commit_timestamp: int = -1,
               protocol_type: str | None = None, keep_newer: bool = False) -> asyncio.Future:
        known = self._topics.get(topic)
        if known is None or not 0 <= index < known.count:
            return _done(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        metadata = metadata or ""
        if java_length(metadata) > self.metadata_max_bytes:
            return _done(ErrorCode.OFFSET_METADATA_TOO_LARGE)
        if self._fence_of(group) is None:
            return _done(ErrorCode.NOT_COORDINATOR)
        stamp = commit_timestamp if commit_timestamp >= 0 else clock.now_ms()
        current = self.fetch(group, topic, index)
        if keep_newer and current is not None and current.commit_timestamp > stamp:
            return _done(ErrorCode.NONE)
        if protocol_type:
            self._protocols[group] = protocol_type
        return self._hand(group, (topic, index), CommittedOffset(offset, leader_epoch, metadata, stamp))

    def _hand(self, group: str, tp: TopicPartition, committed: CommittedOffset) -> asyncio.Future:
        fence = self._fence_of(group)
        if fence is None:
            return _done(ErrorCode.NOT_COORDINATOR)
        future = asyncio.get_running_loop().create_future()
        self._inflight[group] += 1
        self._ever.add(group)
        commit = _Commit(group, tp, committed, self._protocols.get(group), future, fence)
        self._newest[(group, tp)] = commit
        self._batcher.add(commit)
        return future

    async def _flush(self, commits: list[_Commit]) -> None:
        try:
            stored = await self._write(commits)
        except LedgerFencedOut as exc:  # another broker coordinates these groups now: the clients look it up
            log.warning("offset commits refused: %s", exc)
            stored = None
        except (OSError, *DATABASE_ERRORS) as exc:
            log.error("offset commits failed: %s", exc)  # as Kafka answers a failed offsets append
            stored = None
        for commit in commits:
            key = (self._storage.ledger_key(*commit.tp), commit.group)
            if stored is None:
                _resolve(commit.future, ErrorCode.NOT_COORDINATOR)
            elif key in stored:
                if self._fence_of(commit.group) == commit.fence:  # not if the shard was dropped since
                    self._keep(commit.group, commit.tp, commit.committed)
                _resolve(commit.future, ErrorCode.NONE)
            else:  # the partition's ledger is not in the database (topic deleted, or not opened by its owner yet)
                _resolve(commit.future, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
            if self._newest.get((commit.group, commit.tp)) is commit:
                del self._newest[(commit.group, commit.tp)]
            self._inflight[commit.group] -= 1
            if not self._inflight[commit.group]:
                del self._inflight[commit.group]

    async def _write(self, commits: list[_Commit]) -> set[tuple[str, str]]:
        fences = {}
        for commit in commits:
            # Under the epoch it was accepted with: a shard dropped and taken again since has a new one, and the
            # commit of the earlier tenure would land over the other coordinator's later ones.
            if self._fence_of(commit.group) != commit.fence:
                raise LedgerFencedOut(f"group {commit.group}: coordinated by another broker since it was accepted")
            fences[commit.fence[0]] = commit.fence[1]
        latest = {(self._storage.ledger_key(*c.tp), c.group): c for c in commits}  # the last commit of each wins
        keys = list(latest)
        positions = await self._store.positions_before([(ledger, latest[(ledger, group)].committed.offset)
                                                        for ledger, group in keys])
        rows = []
        for (ledger, group), position in zip(keys, positions):
            commit = latest[(ledger, group)]
            committed = commit.committed
            longs = {OFFSET_KEY: committed.offset, LEADER_EPOCH_KEY: committed.leader_epoch,
                     COMMIT_TS_KEY: committed.commit_timestamp}
            if commit.group in self.replicated:
                longs[REPLICATED_KEY] = 1
            strings = {METADATA_KEY: committed.metadata}
            if commit.protocol_type:
                strings[PROTOCOL_TYPE_KEY] = commit.protocol_type
            _, info = encode_cursor(group, Position(*position) if position else BEFORE_FIRST, longs, strings)
            rows.append((ledger, group, info))
        return await self._store.put_group_cursors(fences, rows, [])

    async def delete(self, group: str, topic: str, index: int) -> None:
        await self._batcher.wait_idle()  # commits handed over before the deletion land first
        fence = self._fence_of(group)
        if fence is None:
            raise OSError(f"group {group}: coordinated by another broker now")
        await self._store.put_group_cursors(dict([fence]), [], [(self._storage.ledger_key(topic, index), group)])
        self._offsets.get(group, {}).pop((topic, index), None)

    async def delete_group(self, group: str) -> None:
        for topic, index in sorted(self._offsets.get(group, {})):
            await self.delete(group, topic, index)

    async def set_replicated(self, group: str, enabled: bool) -> int:
        """Turn PIP-33 replication of the group's position on or off, as its coordinator: the flag's record, then
        every row of the group written again with or without it; returns how many rows were written."""
        if self._fence_of(group) is None:
            raise NotCoordinated(f"group {group!r} is coordinated by another broker of this cluster now: ask that "
                                 f"broker (the one FindCoordinator names for it)")
        if enabled:
            await self._store.put_record(REPLICATED_RECORD, group, b"")
            self.replicated.add(group)
        else:
            self.replicated.discard(group)
            await self._store.delete_record(REPLICATED_RECORD, group)
        written = [self._hand(group, tp, committed) for tp, committed in self.fetch_all(group).items()]
        outcomes = await asyncio.gather(*written)
        if failed := [code for code in outcomes if code != ErrorCode.NONE]:
            raise OSError(f"group {group!r}: {len(failed)} of {len(written)} rows not written: {failed[0].name}")
        return len(written)
