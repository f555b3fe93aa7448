"""Producer ids, allocated durably in blocks so that no id is ever handed out twice, even across crashes, and the
epoch last handed out for each, so a KIP-360 bump is granted only to the producer that holds that epoch.

Before the first id of a block is handed out, the end of the block is written (atomically, fsynced) as the next
block's start; after a restart allocation resumes there, skipping whatever was left of the old block. The epochs are
kept in memory only: after a restart no (id, epoch) is known, and a bump request gets a new id, which is what Kafka
answers every idempotent producer anyway.
"""
import os
from collections import OrderedDict

from kop.ledger.framed_file import replace_atomically
from proto.kop_pb2 import ProducerIdBlock

BLOCK_SIZE = 1000
MAX_EPOCH = 32767  # Short.MAX_VALUE: an id whose epoch would reach it is replaced, as Kafka does
MAX_TRACKED_EPOCHS = 100_000  # the oldest are forgotten first; a forgotten id's bump gets a new id


class ProducerIdAllocator:
    def __init__(self, path: str, durable: bool = True) -> None:
        self._path = path
        self._durable = durable
        self._next = 0
        self._block_end = 0
        self._epochs: OrderedDict[int, int] = OrderedDict()  # id -> the epoch last handed out with it
        if os.path.exists(path):
            block = ProducerIdBlock()
            with open(path, "rb") as f:
                block.ParseFromString(f.read())
            self._next = self._block_end = block.next_block_start

    def allocate(self) -> int:
        """A new producer id, with epoch 0."""
        if self._next >= self._block_end:
            end = self._next + BLOCK_SIZE
            replace_atomically(self._path, ProducerIdBlock(next_block_start=end).SerializeToString(), self._durable)
            self._block_end = end
        pid = self._next
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
