"""Which of its group partitions an open transaction holds an offset for, as the groups' coordinator knows it
(KIP-447: OffsetFetch with require_stable answers UNSTABLE_OFFSET_COMMIT for them until the transaction ends).

A transaction's offsets stay with its transaction coordinator until it commits (kop/transactions); the group's
coordinator keeps this index of them by group and producer id: an entry is added once the transaction coordinator has
accepted a TxnOffsetCommit, and goes when the transaction ends (its offsets committed, or none coming after an abort).
On one broker that is all memory: both coordinators are that broker, and its transaction coordinator replays its
open transactions' offsets at a restart. In a cluster the group's coordinator may move to another broker while a
transaction is open, so each (group, producer) entry is also a record in the database (kind `txn-pending-offset`),
written under the fencing epoch of the group's shard, and the broker that takes the shard over reads them with the
committed offsets, as Kafka's new group coordinator finds the pending transactional offsets in `__consumer_offsets`.
"""
import asyncio
import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from kop.groups.generations import CoordinatorMoved, Fence, RecordStore, moved_when_fenced
from kop.ledger.postgres.store import DATABASE_ERRORS

log = logging.getLogger(__name__)

KIND = "txn-pending-offset"
TopicPartition = tuple[str, int]


def _key(group_id: str, producer_id: int) -> str:
    return json.dumps([group_id, producer_id])


@dataclass(slots=True, eq=False)  # each one is itself: settled removes that one
class HandingOn:
    """A TxnOffsetCommit on its way to the transaction's coordinator; `ended`: the transaction ended meanwhile."""
    group_id: str
    producer_id: int
    ended: bool = False


class TxnHeldOffsets:
    def __init__(self) -> None:
        self._held: dict[str, dict[int, set[TopicPartition]]] = {}  # group -> producer id -> partitions
        self._handing: dict[tuple[str, int], list[HandingOn]] = {}  # (group, producer id) -> those in flight
        self._lock = asyncio.Lock()  # one write at a time, each of the entry as it is then: the last one wins
        self._store: RecordStore | None = None
        self._fence_of: Callable[[str], Fence | None] = lambda group_id: None

    def persist_in(self, store: RecordStore, fence_of: Callable[[str], Fence | None]) -> None:
        """A cluster's coordinator: keep each entry as a record too, written only while fence_of(group) holds."""
        self._store, self._fence_of = store, fence_of

    def holds(self, group_id: str, topic: str, partition: int) -> bool:
        return any((topic, partition) in tps for tps in self._held.get(group_id, {}).values())

    def handing_on(self, group_id: str, producer_id: int) -> HandingOn:
        """Before a TxnOffsetCommit goes to the transaction's coordinator; then `hold` (or `settled` if refused)."""
        handing = HandingOn(group_id, producer_id)
        self._handing.setdefault((group_id, producer_id), []).append(handing)
        return handing

    def settled(self, handing: HandingOn) -> None:
        key = (handing.group_id, handing.producer_id)
        in_flight = self._handing.get(key, [])
        if handing in in_flight:
            in_flight.remove(handing)
        if not in_flight:
            self._handing.pop(key, None)

    async def hold(self, handing: HandingOn, partitions: Iterable[TopicPartition]) -> bool:
        """The transaction's coordinator accepted these offsets; False if they could not be stored (this broker no
        longer coordinates the group: the client asks the one that does)."""
        self.settled(handing)
        if handing.ended:
            return True  # the transaction ended before its coordinator's answer came back: nothing is held
        group_id, producer_id = handing.group_id, handing.producer_id
        self._held.setdefault(group_id, {}).setdefault(producer_id, set()).update(partitions)
        return await self._write(group_id, producer_id)

    async def ended(self, group_id: str, producer_id: int,
                    partitions: Iterable[TopicPartition] | None = None) -> bool:
        """The producer's transaction ended: its offsets of these partitions are committed (None: it aborted, none
        will come). False if that could not be stored (the transaction coordinator tries again)."""
        for handing in self._handing.get((group_id, producer_id), []):
            handing.ended = True
        by_producer = self._held.get(group_id, {})
        if partitions is None:
            by_producer.pop(producer_id, None)
        elif producer_id in by_producer:
            by_producer[producer_id] -= set(partitions)
        return await self._write(group_id, producer_id)

    async def _write(self, group_id: str, producer_id: int) -> bool:
        if self._store is None:
            self._tidy(group_id, producer_id)
            return True
        async with self._lock:
            partitions = self._tidy(group_id, producer_id)
            try:
                fence = self._fence_of(group_id)
                if fence is None:
                    raise CoordinatorMoved(f"group {group_id}: coordinated by another broker now")
                async with moved_when_fenced():
                    if partitions:
                        await self._store.put_record(KIND, _key(group_id, producer_id),
                                                     json.dumps(sorted(partitions)).encode(), fence)
                    else:
                        await self._store.delete_record(KIND, _key(group_id, producer_id), fence)
            except (CoordinatorMoved, OSError, *DATABASE_ERRORS) as exc:
                log.warning("group %s: transaction offsets of producer %d not stored: %s", group_id, producer_id, exc)
                return False
        return True

    def _tidy(self, group_id: str, producer_id: int) -> set[TopicPartition]:
        """The producer's partitions held in the group now, dropping empty entries."""
        by_producer = self._held.get(group_id, {})
        partitions = by_producer.get(producer_id, set())
        if not partitions:
            by_producer.pop(producer_id, None)
            if not by_producer:
                self._held.pop(group_id, None)
        return set(partitions)

    # ---- a cluster's shards coming and going (kop/cluster/groups.py)

    async def load(self, wanted: Callable[[str], bool]) -> None:
        """Read the entries of the groups `wanted` (a shard taken over, after its fencing)."""
        assert self._store is not None
        self.drop(wanted)  # what this broker held when it last had the shard is stale now
        for key, value in (await self._store.records(KIND)).items():
            group_id, producer_id = json.loads(key)
            if wanted(group_id):
                self._held.setdefault(group_id, {})[producer_id] = {(t, p) for t, p in json.loads(value)}

    def drop(self, unwanted: Callable[[str], bool]) -> None:
        """Forget the entries of the groups `unwanted` (a shard that moved away)."""
        for group_id in [g for g in self._held if unwanted(g)]:
            del self._held[group_id]
