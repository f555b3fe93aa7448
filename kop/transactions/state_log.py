"""The transaction state log: an internal managed ledger whose entries are TransactionLogRecords, each a
transactional id's whole state after a transition. One broker on files keeps one (`__transaction_state`, beside the
topics' ledgers, never a topic clients see); a cluster keeps one per shard in PostgreSQL (kop/cluster/transactions.py),
opened by the shard's owner, whose opening fences out the previous owner's writes.
Loading replays it and keeps the last record per id; a record is durable before the transition it records is
answered. When the log holds many more records than ids, the live states are appended again and everything before
them is deleted, so the log (and the replay at start-up) stays proportional to the ids, not to their history."""
import asyncio
import logging
import os
from concurrent.futures import Executor

from kop.ledger import FileManagedLedger, LedgerConfig, ManagedLedger
from kop.transactions.state import TxnMetadata
from proto.kop_pb2 import TransactionLogRecord

log = logging.getLogger(__name__)

LEDGER_NAME = "__transaction_state"
READ_BYTES = 4 << 20
COMPACT_MIN_RECORDS = 10_000  # compact once the log holds this many records and 4x the live ids
COMPACT_FACTOR = 4


LEDGER_CONFIG = dict(max_ledger_bytes=64 << 20, max_entry_bytes=16 << 20)


class TxnStateLog:
    def __init__(self, ledger: ManagedLedger, coordinator_epoch: int = 0) -> None:
        """coordinator_epoch: the fencing epoch this broker opened the log with (0 on files), which its transaction
        markers carry."""
        self._ledger = ledger
        self.coordinator_epoch = coordinator_epoch
        self._compacting = False

    @classmethod
    def on_files(cls, data_dir: str, fsync: bool, executor: Executor | None = None) -> "TxnStateLog":
        config = LedgerConfig(**LEDGER_CONFIG, fsync=fsync)
        return cls(FileManagedLedger.open(LEDGER_NAME, os.path.join(data_dir, "transactions"), config, executor))

    def load(self) -> dict[str, TxnMetadata]:
        """Every transaction's last state, read synchronously (the file engine's log, at start)."""
        ledger = self._ledger
        states: dict[str, TxnMetadata] = {}
        offset = ledger.start_index
        while offset < ledger.confirmed_end_index:
            entries = ledger.read_from_index(offset, READ_BYTES)
            if not entries:
                break
            offset = _apply(states, entries)
        return states

    async def load_async(self) -> dict[str, TxnMetadata]:
        """load(), waiting for entries an engine must read back (a shard taken over on PostgreSQL)."""
        ledger = self._ledger
        states: dict[str, TxnMetadata] = {}
        offset = ledger.start_index
        while offset < ledger.confirmed_end_index:
            entries = await ledger.read_from_index_async(offset, READ_BYTES)
            if not entries:
                break
            offset = _apply(states, entries)
        return states

    def append(self, record: TransactionLogRecord) -> asyncio.Future:
        """Store one record; the future resolves once it is durable (or fails with the ledger's error)."""
        ledger = self._ledger
        return ledger.add_entry(ledger.written_end_index, 1, b"", record.SerializeToString())

    async def compact_if_due(self, states: dict[str, TxnMetadata]) -> None:
        ledger = self._ledger
        held = ledger.confirmed_end_index - ledger.start_index
        if self._compacting or held < max(COMPACT_MIN_RECORDS, COMPACT_FACTOR * len(states)):
            return
        self._compacting = True
        try:
            start = ledger.written_end_index
            await asyncio.gather(*(self.append(meta.to_record()) for meta in list(states.values())))
            await ledger.delete_before(start)
            await ledger.trim(0, -1, -1, None)
            log.info("transaction state log compacted: %d records kept of %d", len(states), held)
        finally:
            self._compacting = False

    async def close(self) -> None:
        await self._ledger.close()


def _apply(states: dict[str, TxnMetadata], entries: list) -> int:
    """Apply the state log's entries to states; the offset after them."""
    for entry in entries:
        record = TransactionLogRecord()
        record.ParseFromString(bytes(entry.data))
        if record.deleted:
            states.pop(record.transactional_id, None)
        else:
            states[record.transactional_id] = TxnMetadata.from_record(record)
    return entries[-1].first_index + entries[-1].span
