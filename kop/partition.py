"""PartitionLog: one Kafka partition on top of one managed ledger.

The produce path lands here: `publish_normal` for data batches (Kafka's producer rules and PIP-6 dedup first, then
offset assignment and the append), `publish_control` for transaction markers (no sequence checks). Both run their
decision and offset assignment synchronously, in call order, so appends to one partition happen in arrival order;
they return a future of the result that resolves once the entry is durable, so many appends share one
group-committed fsync. Bookkeeping after the write runs in callbacks, whether or not anyone awaits the result
(acks=0).
"""
import asyncio
import logging
import time
from dataclasses import dataclass

from kop.ledger import Entry, LedgerWriteError, ManagedLedger, ManagedLedgerError, Position
from protocol.errors import ErrorCode
from protocol.records import BatchHeader, assign_offsets
from proto.kop_pb2 import MessageMetadata

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class AppendResult:
    error: ErrorCode = ErrorCode.NONE
    base_offset: int = -1
    log_append_time: int = -1
    message: str | None = None


def _resolved(result: AppendResult) -> asyncio.Future:
    future = asyncio.get_running_loop().create_future()
    future.set_result(result)
    return future


class PartitionLog:
    def __init__(self, topic: str, partition: int, ledger: ManagedLedger) -> None:
        self.topic = topic
        self.partition = partition
        self.name = f"{topic}-{partition}"
        self.ledger = ledger
        self._waiters: list[asyncio.Future] = []
        ledger.add_confirm_listener(self._wake_waiters)

    # ---- offsets

    @property
    def high_watermark(self) -> int:
        return self.ledger.confirmed_end_index

    @property
    def log_start_offset(self) -> int:
        return self.ledger.start_index

    # ---- writing

    def publish_normal(self, header: BatchHeader, view: memoryview) -> asyncio.Future:
        """Append a client data batch; resolves to an AppendResult once durable (or rejected)."""
        metadata = MessageMetadata(producer_id=header.producer_id, producer_epoch=header.producer_epoch,
                                   is_transactional=header.is_transactional)
        return self._append(header, view, metadata)

    def publish_control(self, header: BatchHeader, view: memoryview, marker_type: int) -> asyncio.Future:
        """Append a control batch (transaction marker): no sequence checks, never deduplicated."""
        metadata = MessageMetadata(producer_id=header.producer_id, producer_epoch=header.producer_epoch,
                                   is_control=True, is_transactional=header.is_transactional,
                                   marker_type=marker_type)
        return self._append(header, view, metadata)

    def _append(self, header: BatchHeader, view: memoryview, metadata: MessageMetadata) -> asyncio.Future:
        """Assign offsets to one batch and hand it to the ledger."""
        base = self.ledger.written_end_index
        batch = bytearray(view)
        assign_offsets(batch, 0, base)
        metadata.publish_time = int(time.time() * 1000)
        metadata.num_messages = header.records_count
        try:
            written = self.ledger.add_entry(base, header.last_offset_delta + 1, metadata.SerializeToString(), batch)
        except ManagedLedgerError as exc:
            return _resolved(AppendResult(ErrorCode.KAFKA_STORAGE_ERROR, message=str(exc)))
        result = asyncio.get_running_loop().create_future()
        written.add_done_callback(lambda f: self._on_written(f, base, result))
        return result

    def _on_written(self, written: asyncio.Future, base: int, result: asyncio.Future) -> None:
        exc = written.exception()
        if exc is None:
            outcome = AppendResult(ErrorCode.NONE, base)
        elif isinstance(exc, LedgerWriteError):
            # Not written: retriable, the client resends with the same sequence numbers.
            outcome = AppendResult(ErrorCode.NOT_LEADER_OR_FOLLOWER, message=f"write failed, retry: {exc}")
        else:
            outcome = AppendResult(ErrorCode.KAFKA_STORAGE_ERROR, message=str(exc))
        if not result.done():
            result.set_result(outcome)

    # ---- reading

    def read(self, offset: int, max_bytes: int) -> list[Entry]:
        """Durable entries from the one holding `offset`, up to max_bytes (at least one entry if any)."""
        return self.ledger.read_from_index(offset, max_bytes)

    def watch(self, future: asyncio.Future) -> None:
        """Resolve future (if still pending) the next time new entries become durable."""
        self._waiters.append(future)

    def unwatch(self, future: asyncio.Future) -> None:
        if future in self._waiters:
            self._waiters.remove(future)

    def _wake_waiters(self) -> None:
        waiters, self._waiters = self._waiters, []
        for future in waiters:
            if not future.done():
                future.set_result(None)

    def retention_floor(self) -> Position | None:
        """The oldest position a cursor still needs (retention never deletes past it); None if none is needed."""
        return None

    async def close(self) -> None:
        self._wake_waiters()
        await self.ledger.close()
