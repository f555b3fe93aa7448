"""Writes a partition's transaction state (PartitionTransactions.snapshot) into its `pulsar.transactions` cursor,
at the position of the last entry the state has taken: every SNAPSHOT_ENTRIES stored entries once the partition may
hold transactions, when retention asks (the cursor's records hold back a ledger it would delete), and when the
partition closes, so a clean restart reads no entry. One write at a time; a failed one waits for the next."""
import asyncio
import logging

from kop.ledger import ManagedLedgerError, Position
from kop.transactions.partition_index import PartitionTransactions

log = logging.getLogger(__name__)

SNAPSHOT_ENTRIES = 1000


class IndexSnapshots:
    def __init__(self, transactions: PartitionTransactions, log_name: str) -> None:
        self._transactions = transactions
        self._log_name = log_name
        self._cursor = None
        self._stored = 0  # entries stored since the last snapshot
        self._last: tuple[Position, int] | None = None  # the last entry taken: its position and end offset
        self._writing: asyncio.Task | None = None

    def enable(self, cursor, last: tuple[Position, int] | None = None, replayed: int = 0) -> None:
        """Snapshot into cursor from now on. Loading the partition: `last` is the entry the state covers up to,
        `replayed` how many entries after the snapshot it read (they count towards the next one)."""
        self._cursor = cursor
        self._last = last or self._last
        self._stored += replayed
        if self._stored >= SNAPSHOT_ENTRIES:
            self.snapshot_now()

    def on_stored(self, position: Position, end_offset: int) -> None:
        """The entry at `position`, ending below end_offset, is stored, and the state has taken it (call in log
        order, after the state: a marker closes its transaction before its entry counts here)."""
        self._last = (position, end_offset)
        if self._cursor is None:
            return
        self._stored += 1
        if self._stored >= SNAPSHOT_ENTRIES:
            self.snapshot_now()

    def snapshot_now(self) -> bool:
        """Snapshot at the last entry taken, even where the cursor already is; returns whether a write started."""
        if self._cursor is None or self._last is None or self._writing is not None:
            return False
        position, end_offset = self._last
        self._stored = 0
        self._writing = asyncio.ensure_future(self._write(position, self._transactions.snapshot(end_offset)))
        return True

    async def _write(self, position: Position, snapshot: dict[str, str]) -> None:
        try:
            await self._cursor.mark_delete(position, string_properties=snapshot)
        except (ManagedLedgerError, OSError) as exc:
            log.warning("%s: transaction snapshot not written (%s); the next one will be", self._log_name, exc)
        finally:
            self._writing = None

    async def close(self) -> None:
        """Wait for the write in flight, then snapshot what was stored since (a clean restart then reads nothing)."""
        await self.flush()
        if self._stored and self.snapshot_now():
            await self.flush()

    async def flush(self) -> None:
        """Wait for the snapshot being written, if any."""
        if self._writing is not None:
            await asyncio.wait([self._writing])
