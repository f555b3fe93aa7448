"""Producer ids, allocated durably in blocks so that no id is ever handed out twice, even across crashes.

Before the first id of a block is handed out, the end of the block is written (atomically, fsynced) as the next
block's start; after a restart allocation resumes there, skipping whatever was left of the old block.
"""
import os

from kop.ledger.framed_file import replace_atomically
from proto.kop_pb2 import ProducerIdBlock

BLOCK_SIZE = 1000


class ProducerIdAllocator:
    def __init__(self, path: str, durable: bool = True) -> None:
        self._path = path
        self._durable = durable
        self._next = 0
        self._block_end = 0
        if os.path.exists(path):
            block = ProducerIdBlock()
            with open(path, "rb") as f:
                block.ParseFromString(f.read())
            self._next = self._block_end = block.next_block_start

    def was_issued(self, producer_id: int) -> bool:
        """Whether the id may have been handed out by this broker (ids below the durable high-water mark)."""
        return 0 <= producer_id < self._block_end

    def allocate(self) -> int:
        if self._next >= self._block_end:
            end = self._next + BLOCK_SIZE
            replace_atomically(self._path, ProducerIdBlock(next_block_start=end).SerializeToString(), self._durable)
            self._block_end = end
        pid = self._next
        self._next += 1
        return pid
