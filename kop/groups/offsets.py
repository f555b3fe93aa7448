"""Committed offsets, stored where Pulsar keeps subscription state: one cursor per group on each partition's managed
ledger, named after the group.

The cursor's mark-delete position is the entry holding offset `committed - 1` (the last consumed entry;
BEFORE_FIRST for 0; the last confirmed entry if the commit is beyond the end). The exact Kafka offset, leader epoch
and commit time ride in the cursor's long properties and the metadata string in its string properties, written as one
atomic, group-committed cursor-log record: a commit is durable before OffsetCommit answers, and thousands of commits
share a few fsyncs. Cursor names starting with `pulsar.` belong to the system (dedup, replicators), never to groups.

The in-memory index (which partitions hold a group's cursor) must always cover the durable cursors, or OffsetFetch
for every partition and ListGroups miss a commit until a restart. So a partition enters the index when its commit
starts, commits still in flight count as offsets, and a cursor is deleted only after the commits already handed to
it are durable: a commit racing a deletion either lands before it (and is deleted) or after it (and is kept).
"""
import asyncio
import logging
import os
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kop import clock
from kop.ledger import BEFORE_FIRST, LedgerClosedError, ManagedLedger, Position
from kop.ledger.errors import CursorNotFoundError
from kop.ledger.framed_file import replace_atomically
from proto.kop_pb2 import ReplicatedGroups
from protocol.errors import ErrorCode

if TYPE_CHECKING:  # kop.topics imports kop.groups (generations) for the storage engines
    from kop.topics import TopicManager

log = logging.getLogger(__name__)

SYSTEM_CURSOR_PREFIX = "pulsar."
OFFSET_KEY = "kafka.offset"
LEADER_EPOCH_KEY = "kafka.leader_epoch"
COMMIT_TS_KEY = "kafka.commit_ts"
METADATA_KEY = "kafka.metadata"
PROTOCOL_TYPE_KEY = "kafka.protocol_type"  # so a group is listed as it was ("consumer") after a restart
REPLICATED_KEY = "pulsar.replicated.subscription"  # 1: the group's position is replicated to other clusters (PIP-33)


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    offset: int
    leader_epoch: int = -1
    metadata: str = ""
    commit_timestamp: int = -1


TopicPartition = tuple[str, int]


def position_for_offset(ledger: ManagedLedger, committed: int) -> Position:
    """The mark-delete position for a committed offset: the entry holding the last consumed offset."""
    last = committed - 1
    if last < ledger.start_index:
        return BEFORE_FIRST
    if last >= ledger.confirmed_end_index:
        return ledger.last_confirmed
    return ledger.position_of_index(last) or ledger.last_confirmed


def _committed(cursor) -> CommittedOffset | None:
    props = cursor.properties
    if OFFSET_KEY not in props:
        return None  # opened but nothing durable yet
    return CommittedOffset(props[OFFSET_KEY], props.get(LEADER_EPOCH_KEY, -1),
                           cursor.string_properties.get(METADATA_KEY, ""), props.get(COMMIT_TS_KEY, -1))


def committed_offsets(ledger: ManagedLedger) -> dict[str, CommittedOffset]:
    """The durable committed offset of every group with a cursor on this partition's ledger."""
    out = {}
    for name, cursor in ledger.cursors.items():
        if not name.startswith(SYSTEM_CURSOR_PREFIX) and (committed := _committed(cursor)) is not None:
            out[name] = committed
    return out


def replicated_offsets(ledger: ManagedLedger, every: bool) -> dict[str, int]:
    """The committed offset of each group whose cursor on this partition carries the replicated flag (of every
    group when `every`: a topic or namespace policy replicates them all)."""
    cursors = ledger.cursors
    return {group: committed.offset for group, committed in committed_offsets(ledger).items()
            if every or cursors[group].properties.get(REPLICATED_KEY)}


class NotCoordinated(Exception):
    """This broker does not coordinate the group now (a cluster of brokers): the broker that does must be asked."""


def _done(value) -> asyncio.Future:
    future = asyncio.get_running_loop().create_future()
    future.set_result(value)
    return future


class OffsetStore:
    def __init__(self, topics: "TopicManager", metadata_max_bytes: int = 4096, pending_path: str | None = None,
                 durable: bool = True) -> None:
        """pending_path: where the replicated flags of groups with no commit yet are kept (None: in memory only)."""
        self._topics = topics
        self.metadata_max_bytes = metadata_max_bytes
        # group -> partitions that may hold its cursor; verified against the live cursor on every read
        self._index: dict[str, set[TopicPartition]] = {}
        # the newest position handed to each cursor, durable or not, to choose mark_delete or reset
        self._submitted: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        # ... and the latest commit timestamp handed to it (a transaction's offsets yield to later commits)
        self._submitted_stamp: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        # ... and the latest offset handed to it (a PIP-33 update never moves a group back past one in flight)
        self._submitted_offset: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        # group -> partition -> cursor writes not yet durable
        self._inflight: dict[str, dict[TopicPartition, set[asyncio.Future]]] = {}
        self.replicated: set[str] = set()  # groups whose cursors carry REPLICATED_KEY (each new one gets it too)
        # ... of them, those flagged before their first commit landed: no cursor holds their flag yet
        self._pending_replicated: set[str] = set()
        self._pending_path = pending_path
        self._durable = durable

    # ---- loading

    def load(self) -> dict[str, str | None]:
        """Index every group cursor of every partition; returns the groups with committed offsets and the
        protocol type they last committed with."""
        self._index.clear()
        self._load_pending_replicated()
        found: dict[str, str | None] = {}
        for topic in self._topics.topics.values():
            for partition in topic.partitions:
                cursors = partition.ledger.cursors
                for name in committed_offsets(partition.ledger):
                    self._index.setdefault(name, set()).add((topic.name, partition.partition))
                    if cursors[name].properties.get(REPLICATED_KEY):
                        self.replicated.add(name)
                    found[name] = found.get(name) or cursors[name].string_properties.get(PROTOCOL_TYPE_KEY)
        return found

    def _load_pending_replicated(self) -> None:
        if self._pending_path is None or not os.path.exists(self._pending_path):
            return
        with open(self._pending_path, "rb") as f:
            self._pending_replicated = set(ReplicatedGroups.FromString(f.read()).group_ids)
        self.replicated |= self._pending_replicated

    def _save_pending_replicated(self, pending: set[str]) -> None:
        if pending == self._pending_replicated:
            return
        if self._pending_path is not None:
            os.makedirs(os.path.dirname(self._pending_path), exist_ok=True)
            record = ReplicatedGroups(group_ids=sorted(pending))
            replace_atomically(self._pending_path, record.SerializeToString(), durable=self._durable)
        self._pending_replicated = pending

    # ---- reading

    def _live_cursor(self, group: str, topic: str, index: int):
        partition = self._topics.partition(topic, index)
        if partition is None:
            return None
        cursor = partition.ledger.cursors.get(group)
        return cursor if cursor is not None and _committed(cursor) is not None else None

    def fetch(self, group: str, topic: str, index: int) -> CommittedOffset | None:
        cursor = self._live_cursor(group, topic, index)
        return _committed(cursor) if cursor is not None else None

    def newest_offset(self, group: str, topic: str, index: int) -> int | None:
        """The offset of the group's latest commit on the partition, durable or still being written."""
        partition = self._topics.partition(topic, index)
        cursor = partition.ledger.cursors.get(group) if partition is not None else None
        if cursor is None:
            return None
        committed = _committed(cursor)
        return self._submitted_offset.get(cursor, committed.offset if committed is not None else None)

    def replicated_on(self, topic: str, index: int, every: bool) -> dict[str, int]:
        """The committed offsets of the partition's replicated groups (every group's when `every`)."""
        partition = self._topics.partition(topic, index)
        return {} if partition is None else replicated_offsets(partition.ledger, every)

    def fetch_all(self, group: str) -> dict[TopicPartition, CommittedOffset]:
        out = {}
        for topic, index in sorted(self._prune(group)):
            committed = self.fetch(group, topic, index)
            if committed is not None:
                out[(topic, index)] = committed
        return out

    def has_offsets(self, group: str) -> bool:
        """Durable offsets, or commits on their way to being durable."""
        return group in self._inflight or any(self.fetch(group, *tp) is not None for tp in self._prune(group))

    def ever_had_offsets(self, group: str) -> bool:
        """True if the group was indexed, even if its partitions (and cursors) were deleted since."""
        return group in self._index

    def _prune(self, group: str) -> set[TopicPartition]:
        """Drop index entries whose cursor is gone (topic deleted, offsets deleted); returns the rest."""
        parts = self._index.get(group)
        if not parts:
            return set()
        for tp in list(parts):
            partition = self._topics.partition(*tp)
            if partition is None or group not in partition.ledger.cursors:
                parts.discard(tp)
        return set(parts)

    def forget(self, group: str) -> None:
        """Stop tracking a group that no longer exists."""
        if not self.has_offsets(group):
            self._index.pop(group, None)

    # ---- writing

    def commit(self, group: str, topic: str, index: int, offset: int, leader_epoch: int = -1,
               metadata: str | None = "", commit_timestamp: int = -1,
               protocol_type: str | None = None, keep_newer: bool = False) -> asyncio.Future:
        """Start storing one committed offset; the result resolves once it is durable (or failed). keep_newer: do
        nothing (NONE) if the group's latest commit here, durable or on its way, is timestamped after this one.

        Called synchronously in request order, so the cursor log gets a partition's commits in that order."""
        partition = self._topics.partition(topic, index)
        if partition is None:
            return _done(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        metadata = metadata or ""
        if java_length(metadata) > self.metadata_max_bytes:
            return _done(ErrorCode.OFFSET_METADATA_TOO_LARGE)
        ledger = partition.ledger
        try:
            cursor = ledger.open_cursor(group, initial=BEFORE_FIRST)
        except LedgerClosedError:
            return _done(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        stamp = commit_timestamp if commit_timestamp >= 0 else clock.now_ms()
        latest = self._submitted_stamp.get(cursor, cursor.properties.get(COMMIT_TS_KEY, -1))
        if keep_newer and latest > stamp:
            return _done(ErrorCode.NONE)
        self._submitted_stamp[cursor] = max(stamp, latest)
        position = position_for_offset(ledger, offset)
        previous = self._submitted.get(cursor, cursor.mark_delete_position)
        move = cursor.mark_delete if position >= previous else cursor.reset
        self._submitted[cursor] = position
        self._submitted_offset[cursor] = offset
        self._index.setdefault(group, set()).add((topic, index))
        longs = {OFFSET_KEY: offset, LEADER_EPOCH_KEY: leader_epoch, COMMIT_TS_KEY: stamp}
        if group in self.replicated:
            longs[REPLICATED_KEY] = 1
        strings = {METADATA_KEY: metadata}
        if protocol_type:
            strings[PROTOCOL_TYPE_KEY] = protocol_type
        task = asyncio.ensure_future(move(position, longs, strings))
        self._track(group, (topic, index), task)
        if group in self._pending_replicated:
            task.add_done_callback(lambda done: self._flag_landed(group, done))
        result = asyncio.get_running_loop().create_future()
        task.add_done_callback(lambda done: result.set_result(_outcome(done, f"{group} on {topic}-{index}")))
        return result

    def _flag_landed(self, group: str, commit: asyncio.Future) -> None:
        """A commit of a group flagged before it had any is durable, with the flag: its cursor holds it now."""
        if not commit.cancelled() and commit.exception() is None and group in self.replicated:
            self._save_pending_replicated(self._pending_replicated - {group})

    async def set_replicated(self, group: str, enabled: bool) -> int:
        """Turn PIP-33 replication of the group's position on or off: the flag goes into every cursor of the group
        (its next commits keep it), or, for a group with no commit yet, into the pending file until its first commit
        lands; returns how many cursors were changed."""
        (self.replicated.add if enabled else self.replicated.discard)(group)
        if not enabled or not self.has_offsets(group):
            pending = self._pending_replicated | {group} if enabled else self._pending_replicated - {group}
            self._save_pending_replicated(pending)
        changed = 0
        for topic, index in sorted(self._prune(group)):
            partition = self._topics.partition(topic, index)
            cursor = partition.ledger.cursors.get(group) if partition is not None else None
            if cursor is None or bool(cursor.properties.get(REPLICATED_KEY)) == enabled:
                continue
            props = {k: v for k, v in cursor.properties.items() if k != REPLICATED_KEY}
            if enabled:
                props[REPLICATED_KEY] = 1
            position = self._submitted.get(cursor, cursor.mark_delete_position)
            await cursor.reset(position, props)
            changed += 1
        return changed

    def _track(self, group: str, tp: TopicPartition, task: asyncio.Future) -> None:
        pending = self._inflight.setdefault(group, {}).setdefault(tp, set())
        pending.add(task)

        def landed(_: asyncio.Future) -> None:
            pending.discard(task)
            by_partition = self._inflight.get(group)
            if by_partition is not None and not pending and by_partition.get(tp) is pending:
                del by_partition[tp]
                if not by_partition:
                    del self._inflight[group]
        task.add_done_callback(landed)

    async def delete(self, group: str, topic: str, index: int) -> None:
        # A commit handed to the cursor before the deletion lands first; otherwise its record would follow the
        # deletion in the cursor log, durable but missing from the cursor table and the index until a restart.
        for _ in range(1000):  # more than this many commits arriving during one deletion: delete anyway
            pending = self._inflight.get(group, {}).get((topic, index))
            if not pending:
                break
            await asyncio.wait(pending)
        # From here to the cursor leaving the table nothing yields, so a later commit opens a new cursor and
        # re-enters the index.
        parts = self._index.get(group)
        if parts is not None:
            parts.discard((topic, index))
            if not parts:
                del self._index[group]
        partition = self._topics.partition(topic, index)
        if partition is None:
            return
        try:
            await partition.ledger.delete_cursor(group)
        except (CursorNotFoundError, LedgerClosedError):
            pass

    async def delete_group(self, group: str) -> None:
        """Delete every cursor of a group that takes no new commits (the coordinator marked it Dead)."""
        for topic, index in sorted(self._index.get(group, set())):
            await self.delete(group, topic, index)


def java_length(text: str) -> int:
    """Kafka limits offset metadata by Java's String.length(): UTF-16 code units, not bytes."""
    return len(text.encode("utf-16-le")) // 2


def _outcome(task: asyncio.Future, what: str) -> ErrorCode:
    exc = task.exception() if not task.cancelled() else asyncio.CancelledError()
    if exc is None:
        return ErrorCode.NONE
    if isinstance(exc, LedgerClosedError):
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION  # the topic was deleted meanwhile
    if isinstance(exc, OSError):
        # As Kafka answers a failed offsets append: the client looks up the coordinator again and retries.
        log.error("offset commit for %s failed: %s", what, exc)
        return ErrorCode.NOT_COORDINATOR
    if isinstance(exc, asyncio.CancelledError):
        return ErrorCode.COORDINATOR_NOT_AVAILABLE  # shutting down
    log.error("offset commit for %s failed", what, exc_info=exc)
    return ErrorCode.UNKNOWN_SERVER_ERROR
