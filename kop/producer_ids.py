"""Producer ids, allocated durably in blocks so that no id is ever handed out twice, even across crashes, and the
epoch last handed out for each, so a KIP-360 bump is granted only to the producer that holds that epoch.

Before the first id of a block is handed out, the block is reserved durably: in the data directory its end is
written (atomically, fsynced) as the next block's start; in PostgreSQL one counter row is raised by the block size in
one statement, so brokers sharing the database never get the same block. After a restart allocation resumes after
the last reserved block, skipping whatever was left of the old one. The epochs are
kept in memory only: after a restart no (id, epoch) is known, and a bump request gets a new id, which is what Kafka
answers every idempotent producer anyway.

Ids carry their cluster's tag in their high bits (a hash of the cluster's name), so clusters that replicate to one
another never hand out the same id: a producer that moves to another cluster keeping its id (a DNS or load-balancer
failover) is the same producer there, and the other cluster deduplicates its resends against what replication
brought (Pulsar's deduplication V1, by the original producer's identity; kop/partition.py). Ids handed out before
tags existed have tag 0, which no cluster has.
"""
import asyncio
import os
import zlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from kop.ledger.framed_file import replace_atomically
from proto.kop_pb2 import ProducerIdBlock

BLOCK_SIZE = 1000
MAX_EPOCH = 32767  # Short.MAX_VALUE: an id whose epoch would reach it is replaced, as Kafka does
MAX_TRACKED_EPOCHS = 100_000  # the oldest are forgotten first; a forgotten id's bump gets a new id
TAG_SHIFT = 47  # a producer id is (cluster tag << 47) | n: 2^47 ids per cluster, under 2^62 with any tag
TAG_COUNT = 32767  # tags 1..32767; 0: an id from before tags


def cluster_tag(name: str) -> int:
    """The tag of a cluster's producer ids, from its name (every broker of the cluster computes the same)."""
    return zlib.crc32(name.encode()) % TAG_COUNT + 1


def tag_of(producer_id: int) -> int:
    return producer_id >> TAG_SHIFT if producer_id >= 0 else 0


class SharedProducerIds:
    """The producer ids that name the same producer in this cluster and the clusters it replicates with: those
    tagged by one of them, while all their tags differ (two clusters whose names share a tag could hand out the same
    id, so then none is shared). Kept current by the replication service; read on the produce path."""

    def __init__(self) -> None:
        self.tags: frozenset[int] = frozenset()

    def update(self, clusters: list[str]) -> None:
        tags = [cluster_tag(name) for name in set(clusters)]
        self.tags = frozenset(tags) if len(tags) > 1 and len(set(tags)) == len(tags) else frozenset()

    def shared(self, producer_id: int) -> bool:
        return producer_id >> TAG_SHIFT in self.tags if self.tags else False


class FileProducerIdBlocks:
    """Blocks reserved in `<data>/producer-ids`: the next block's start."""

    def __init__(self, path: str, durable: bool = True) -> None:
        self._path = path
        self._durable = durable
        self._next_start = 0
        if os.path.exists(path):
            block = ProducerIdBlock()
            with open(path, "rb") as f:
                block.ParseFromString(f.read())
            self._next_start = block.next_block_start

    async def reserve(self, size: int) -> int:
        start, end = self._next_start, self._next_start + size
        replace_atomically(self._path, ProducerIdBlock(next_block_start=end).SerializeToString(), self._durable)
        self._next_start = end
        return start


class ProducerIdAllocator:
    def __init__(self, reserve: Callable[[int], Awaitable[int]], tag: int = 0) -> None:
        """reserve(size): durably reserve the next block of `size` ids and return its first; tag: this cluster's
        (cluster_tag), in the high bits of every id."""
        self._reserve = reserve
        self._tag_bits = tag << TAG_SHIFT
        self._next = 0
        self._block_end = 0
        self._reserving = asyncio.Lock()
        self._epochs: OrderedDict[int, int] = OrderedDict()  # id -> the epoch last handed out with it

    async def allocate(self) -> int:
        """A new producer id, with epoch 0."""
        while self._next >= self._block_end:
            async with self._reserving:  # one reservation at a time: a block is never handed out twice
                if self._next >= self._block_end:
                    self._next = await self._reserve(BLOCK_SIZE)
                    self._block_end = self._next + BLOCK_SIZE
        pid = self._tag_bits | self._next
        self._next += 1
        self._remember(pid, 0)
        return pid

    def bump(self, producer_id: int, epoch: int) -> int | None:
        """The next epoch of `producer_id` if `epoch` is the one this broker last handed out with it (in this run)
        and there is a next one; None otherwise: a stale or unknown pair must not get a live producer's epoch."""
        if self._epochs.get(producer_id) != epoch or epoch + 1 >= MAX_EPOCH:
            return None
        self._remember(producer_id, epoch + 1)
        return epoch + 1

    def _remember(self, producer_id: int, epoch: int) -> None:
        self._epochs[producer_id] = epoch
        self._epochs.move_to_end(producer_id)
        if len(self._epochs) > MAX_TRACKED_EPOCHS:
            self._epochs.popitem(last=False)
