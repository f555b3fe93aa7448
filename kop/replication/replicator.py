"""A replicator: one partition's entries, sent to one remote cluster, from its own durable cursor
`pulsar.repl.<remote>`.

It reads after the cursor, up to the last stable offset (so only decided transactions go), and sends each entry
with its metadata (ReplicateEntries). It skips what must not go: entries that came from another cluster
(`replicated_from` set: no loops, whatever the topology), entries whose `replicate_to` leaves the remote out (so
PIP-33 RESPONSE markers reach their requester alone, and SNAPSHOT markers stay), transaction markers and aborted
transactions' batches, and records older than the topic's message TTL (Pulsar's replicator drops expired entries
too; they stay here). A remote that answers a snapshot REQUEST in its response (it does not replicate back) has
the answer handed to the partition's snapshot controller. The cursor moves past a run of entries only once
the remote has answered that all of them are durable there; anything unanswered is sent again, and the remote
finds it stored already by its source position. One request is in flight per replicator, so a partition's entries
reach the remote in order.
"""
import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from kop.ledger import Entry
from kop.ledger.position import BEFORE_FIRST, Position
from kop.partition import REPLICATOR_CURSOR_PREFIX, PartitionLog
from kop.replication.link import LinkError, RemoteLink
from protocol.errors import ErrorCode
from protocol.replication import ReplicateEntriesRequest, ReplicateEntriesResponse
from proto.kop_pb2 import MessageMetadata

log = logging.getLogger(__name__)

MAX_ENTRIES = 500  # per request
MAX_BYTES = 1 << 20  # per request and per read (the first entry whatever its size): a step holds no more in memory
IDLE_CHECK_S = 1.0  # re-read at least this often without new data (a transaction decided, a policy change)
BACKOFF_S = (0.1, 5.0)  # first and longest pause after a failure

Request = ReplicateEntriesRequest


def cursor_name(remote: str) -> str:
    return REPLICATOR_CURSOR_PREFIX + remote


class RemoteRefused(Exception):
    """The remote answered with an error for these entries."""


@dataclass(slots=True)
class ReplicatorStats:
    entries_sent: int = 0  # entries the remote stored or already had
    duplicates: int = 0  # of those, entries it already had (resends)
    entries_skipped: int = 0
    entries_expired: int = 0  # of those skipped, entries older than the message TTL
    bytes_sent: int = 0
    last_error: str | None = None
    last_error_time_ms: int = 0


class Replicator:
    def __init__(self, partition: PartitionLog, topic_id: bytes, partition_count: Callable[[], int], local: str,
                 remote: str, link: Callable[[], RemoteLink | None],
                 on_snapshot_answer: Callable[[str, str, Position, Position], None],
                 message_ttl_s: Callable[[], int] = lambda: 0,
                 now_ms: Callable[[], int] = lambda: int(time.time() * 1000)) -> None:
        """topic_id: the id of the partition's topic, new each time it is created (its positions start again, so
        the remote judges them per topic id); on_snapshot_answer(snapshot id, remote, where the remote stored the
        REQUEST, where it is here); message_ttl_s(): the topic's message TTL (0: none); now_ms(): the wall clock
        the entries' publish times are read against."""
        self._message_ttl_s = message_ttl_s
        self._now_ms = now_ms
        self.partition = partition
        self.topic_id = uuid.UUID(bytes=topic_id)
        self._on_snapshot_answer = on_snapshot_answer
        self.local = local
        self.remote = remote
        self._partition_count = partition_count
        self._link = link
        self.cursor = partition.ledger.open_cursor(cursor_name(remote), initial=BEFORE_FIRST)
        self.stats = ReplicatorStats()
        self._task: asyncio.Task | None = None

    @property
    def connected(self) -> bool:
        link = self._link()
        return link is not None and link.connected and self.stats.last_error is None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"replicator {self.partition.name} -> {self.remote}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        pause = BACKOFF_S[0]
        while True:
            try:
                moved = await self._step()
                if self.stats.last_error is not None:
                    log.info("%s -> %s: replicating again", self.partition.name, self.remote)
                    self.stats.last_error = None
                pause = BACKOFF_S[0]
                if not moved:
                    await self._wait_for_data()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # anything: the replicator must keep trying, and say why it cannot
                message = str(exc) or type(exc).__name__
                if message != self.stats.last_error:
                    log.warning("%s -> %s: %s", self.partition.name, self.remote, message)
                self.stats.last_error, self.stats.last_error_time_ms = message, int(time.time() * 1000)
                await asyncio.sleep(pause)
                pause = min(pause * 2, BACKOFF_S[1])

    async def _wait_for_data(self) -> None:
        future = asyncio.get_running_loop().create_future()
        self.partition.watch(future)
        try:
            await asyncio.wait_for(future, IDLE_CHECK_S)
        except asyncio.TimeoutError:
            pass
        finally:
            self.partition.unwatch(future)

    async def _step(self) -> bool:
        """Send the next run of entries; returns whether the cursor moved."""
        stable = self.partition.last_stable_offset
        to_send: list[tuple[Entry, MessageMetadata]] = []
        last: Position | None = None
        size = skipped = expired = 0
        ttl_s = self._message_ttl_s()
        expired_before = self._now_ms() - ttl_s * 1000 if ttl_s > 0 else None
        for entry in await self.partition.ledger.read_after_async(self.cursor.mark_delete_position, MAX_ENTRIES,
                                                                 MAX_BYTES):
            if entry.first_index + entry.span > stable:
                break  # an open transaction: wait until it is decided
            metadata = MessageMetadata.FromString(entry.metadata)
            if to_send and size + len(entry.data) > MAX_BYTES:
                break
            last = entry.position
            if not await self._forwards(entry, metadata):
                skipped += 1
            elif expired_before is not None and metadata.publish_time < expired_before:
                skipped += 1
                expired += 1
            else:
                to_send.append((entry, metadata))
                size += len(entry.data)
        if last is None:
            return False
        if to_send:
            await self._send(to_send)
            self.stats.bytes_sent += size
        self.stats.entries_skipped += skipped
        self.stats.entries_expired += expired
        await self.cursor.mark_delete(last)
        return True

    async def _forwards(self, entry: Entry, metadata: MessageMetadata) -> bool:
        if metadata.replicated_from or metadata.is_control:
            return False
        if metadata.replicate_to and self.remote not in metadata.replicate_to:
            return False
        if metadata.is_transactional:
            aborted = await self.partition.aborted_transactions(entry, entry.first_index, entry.first_index + 1)
            return not any(producer_id == metadata.producer_id for producer_id, _ in aborted)
        return True

    async def _send(self, entries: list[tuple[Entry, MessageMetadata]]) -> None:
        link = self._link()
        if link is None:
            raise LinkError(f"cluster {self.remote!r} is not in the clusters registry")
        partition = self.partition
        request = Request[0](
            source_cluster=self.local, target_cluster=self.remote, timeout_ms=int(link.timeout_s * 1000),
            topics=[Request.ReplicateTopic(
                name=partition.topic, topic_id=self.topic_id, partition_count=self._partition_count(), partitions=[
                Request.ReplicateTopic.ReplicatePartition(partition_index=partition.partition, entries=[
                    Request.ReplicateTopic.ReplicatePartition.ReplicateEntry(
                        ledger_id=entry.position.ledger_id, entry_id=entry.position.entry_id,
                        metadata=entry.metadata, records=bytes(entry.data))
                    for entry, _ in entries])])])
        response = await link.send(request, ReplicateEntriesResponse)
        if response.error_code:
            raise RemoteRefused(f"cluster {self.remote} refused: {ErrorCode(response.error_code).name}: "
                                f"{response.error_message}")
        result = response.topics[0].partitions[0]
        self.stats.entries_sent += result.stored
        self.stats.duplicates += result.duplicates
        for answer in result.snapshot_answers:
            self._on_snapshot_answer(answer.snapshot_id, self.remote, Position(answer.ledger_id, answer.entry_id),
                                     Position(answer.source_ledger_id, answer.source_entry_id))
        if result.error_code or result.stored != len(entries):
            raise RemoteRefused(f"cluster {self.remote} stored {result.stored} of {len(entries)} entries: "
                                f"{ErrorCode(result.error_code).name}: {result.error_message}")

    def backlog(self) -> tuple[int, int]:
        """Entries after the cursor and their bytes."""
        return self.partition.backlog_after(self.cursor.mark_delete_position)

    def to_json(self) -> dict:
        entries, size = self.backlog()
        return {"cursor": str(self.cursor.mark_delete_position), "replicationBacklog": entries,
                "replicationBacklogBytes": size, "connected": self.connected,
                "entriesReplicated": self.stats.entries_sent, "duplicatesAtRemote": self.stats.duplicates,
                "entriesSkipped": self.stats.entries_skipped, "entriesExpired": self.stats.entries_expired,
                "bytesReplicated": self.stats.bytes_sent,
                "lastError": self.stats.last_error, "lastErrorTimestamp": self.stats.last_error_time_ms or None}
