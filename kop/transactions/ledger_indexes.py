"""One partition's aborted-transaction indexes, one per ledger holding ABORT markers, as Kafka keeps a .txnindex per
segment. A ledger's index stays in memory (and in the partition's transaction snapshots) until the ledger is closed
and every entry of it stored; then it is written with the ledger (`ManagedLedger.write_txn_index`) and leaves
memory. A lookup reads the stored indexes it needs through the broker's index cache, passing by those whose summary
shows they hold nothing for it; retention deletes an index with its ledger.

A stored index whose write fails stays in memory and in the snapshots, and is written again later (at most every
RETRY_SECONDS). One found damaged or missing when read is rebuilt from the log, then kept in memory and written again
the same way."""
import asyncio
import logging
import time
from bisect import bisect_left, insort
from collections.abc import Awaitable, Callable

from kop.ledger import ManagedLedger, ManagedLedgerError
from kop.transactions.aborted_index import AbortedTxn, DamagedIndex, IndexSummary, LedgerAborts, Listed
from kop.transactions.index_cache import IndexCache

log = logging.getLogger(__name__)

RETRY_SECONDS = 5.0


class LedgerIndexes:
    def __init__(self, ledger: ManagedLedger, cache: IndexCache, log_name: str,
                 rebuild: Callable[[list[int]], Awaitable[dict[int, LedgerAborts]]]) -> None:
        """rebuild: ledgers' indexes rebuilt from the log (for one stored damaged)."""
        self._ledger = ledger
        self._rebuild = rebuild
        self._cache = cache
        self._owner = cache.new_owner()
        self.log_name = log_name
        self._memory: dict[int, LedgerAborts] = {}  # not stored yet, by ledger id
        self._stored: dict[int, IndexSummary | None] = {}  # stored: their summary, once known
        self._ids: list[int] = []  # the ledgers of both, ascending
        self._writing: dict[int, asyncio.Task] = {}
        self._reading: dict[int, asyncio.Future] = {}
        self._retry_at = 0.0  # monotonic time before which a failed write is not tried again

    # ---- what is kept

    def reset(self, stored: list[int]) -> None:
        """Forget everything but the ledgers that hold a stored index (loading the partition)."""
        self._cache.discard_owner(self._owner)
        self._memory, self._stored = {}, dict.fromkeys(stored)
        self._ids = sorted(stored)

    def add(self, ledger_id: int, txn: AbortedTxn) -> int:
        """Note an aborted transaction whose marker ledger_id holds; returns how many that ledger holds in memory
        (0 when its index is stored already: a replay of it at load)."""
        if ledger_id in self._stored:
            return 0
        aborts = self._memory.get(ledger_id)
        if aborts is None:
            aborts = self._memory[ledger_id] = LedgerAborts()
            insort(self._ids, ledger_id)
        aborts.append(txn)
        return len(aborts)

    def adopt(self, ledger_id: int, aborts: LedgerAborts) -> None:
        """Take a ledger's index from a snapshot or a rebuild, unless it is stored already."""
        if ledger_id not in self._stored and ledger_id not in self._memory and len(aborts):
            self._memory[ledger_id] = aborts
            insort(self._ids, ledger_id)

    @property
    def holds_any(self) -> bool:
        """Whether any ledger has an aborted transaction indexed (a fetch from a partition with none looks nothing
        up)."""
        return bool(self._ids)

    def stored_ids(self) -> list[int]:
        """The ledgers whose index is stored (what a snapshot lists, so a load can tell one has gone missing)."""
        return sorted(self._stored)

    def in_memory(self) -> dict[int, LedgerAborts]:
        """The indexes not stored yet, by ledger id (what a snapshot keeps)."""
        return self._memory

    @property
    def memory_bytes(self) -> int:
        return sum(aborts.nbytes for aborts in self._memory.values())

    def forget_before(self, start_offset: int, first_ledger_id: int | None) -> None:
        """Retention or DeleteRecords moved the log start to start_offset, held by ledger first_ledger_id (None:
        no entry holds it: the log is empty, every marker noted is behind it): a fetch never again needs the
        indexes of the ledgers before it."""
        cut = len(self._ids) if first_ledger_id is None else bisect_left(self._ids, first_ledger_id)
        for ledger_id in self._ids[:cut]:
            self._memory.pop(ledger_id, None)
            self._stored.pop(ledger_id, None)
            self._cache.discard(self._owner, ledger_id)
        del self._ids[:cut]

    # ---- storing closed ledgers' indexes

    def store_closed(self, before_ledger_id: int) -> None:
        """Every entry of the ledgers before before_ledger_id is stored: write their indexes (in the background)."""
        closed = [i for i in self._memory if i < before_ledger_id and i not in self._writing]
        if not closed or (self._retry_at and time.monotonic() < self._retry_at):
            return
        for ledger_id in closed:
            self._writing[ledger_id] = asyncio.ensure_future(self._store(ledger_id))

    async def store_all_closed(self, before_ledger_id: int) -> None:
        """store_closed, then wait for the writes (loading the partition, closing it)."""
        self._retry_at = 0.0
        self.store_closed(before_ledger_id)
        await self.wait_writes()

    async def wait_writes(self) -> None:
        if self._writing:
            await asyncio.wait(list(self._writing.values()))

    async def _store(self, ledger_id: int) -> None:
        aborts = self._memory[ledger_id]
        try:
            await self._ledger.write_txn_index(ledger_id, aborts.encode())
        except (ManagedLedgerError, OSError, ValueError) as exc:
            self._retry_at = time.monotonic() + RETRY_SECONDS
            log.warning("%s: aborted-transaction index of ledger %d not stored (%s); kept in memory and in the "
                        "snapshots, written again later", self.log_name, ledger_id, exc)
            return
        finally:
            self._writing.pop(ledger_id, None)
        self._retry_at = 0.0
        if self._memory.get(ledger_id) is aborts:  # not forgotten meanwhile
            del self._memory[ledger_id]
            self._stored[ledger_id] = aborts.summary()
            self._cache.put(self._owner, ledger_id, aborts)

    # ---- lookups

    async def collect(self, first_ledger_id: int, fetch_offset: int, upper: int) -> list[Listed]:
        """The aborted transactions a fetch returning [fetch_offset, upper) lists, in marker order: those whose
        marker is at or after fetch_offset (so in the ledger first_ledger_id, which holds fetch_offset, or a later
        one) and whose first offset is below upper, up to the first aborted with the last stable offset at or past
        upper. Raises ManagedLedgerError or OSError when a stored index it needs cannot be read."""
        out: list[Listed] = []
        for ledger_id in self._ids[bisect_left(self._ids, first_ledger_id):]:
            aborts = self._memory.get(ledger_id)
            if aborts is None:
                summary = self._stored.get(ledger_id)
                if summary is not None and summary.last_marker < fetch_offset:
                    continue
                if summary is not None and summary.first_marker >= fetch_offset \
                        and summary.min_first_offset >= upper:
                    if summary.max_stable_offset >= upper:
                        break  # the lookup would stop in this ledger without listing any of it
                    continue
                aborts = await self._read(ledger_id)
            if aborts.collect(fetch_offset, upper, out):
                break
        return out

    async def listed(self) -> list[AbortedTxn]:
        """Every aborted transaction indexed, in marker order (admin views and tests: it reads every index)."""
        out: list[AbortedTxn] = []
        for ledger_id in list(self._ids):
            out.extend(self._memory.get(ledger_id) or await self._read(ledger_id))
        return out

    async def _read(self, ledger_id: int) -> LedgerAborts:
        cached = self._cache.get(self._owner, ledger_id)
        if cached is not None:
            return cached
        reading = self._reading.get(ledger_id)
        if reading is None:  # one read, however many fetches wait for it
            reading = self._reading[ledger_id] = asyncio.ensure_future(self._read_stored(ledger_id))
            reading.add_done_callback(lambda _: self._reading.pop(ledger_id, None))
        return await asyncio.shield(reading)

    async def _read_stored(self, ledger_id: int) -> LedgerAborts:
        data = await self._ledger.read_txn_index(ledger_id)
        if data is None and ledger_id not in self._ledger.txn_indexed_ledgers():
            return LedgerAborts()  # deleted with its ledger since the lookup began
        try:
            if data is None:  # the engine holds it, but it is not there (a file removed by hand)
                raise DamagedIndex("missing")
            aborts = LedgerAborts.decode(data)
        except DamagedIndex as exc:
            log.warning("%s: aborted-transaction index of ledger %d is damaged (%s); rebuilding it from the log",
                        self.log_name, ledger_id, exc)
            aborts = (await self._rebuild([ledger_id]))[ledger_id]
            if ledger_id in self._stored:  # not deleted with its ledger meanwhile: written again as one not stored yet
                del self._stored[ledger_id]
                self._memory[ledger_id] = aborts
                self._writing[ledger_id] = asyncio.ensure_future(self._store(ledger_id))
            return aborts
        if ledger_id in self._stored:
            self._stored[ledger_id] = aborts.summary()
            self._cache.put(self._owner, ledger_id, aborts)
        return aborts

    async def close(self) -> None:
        await self.wait_writes()
        self._cache.discard_owner(self._owner)
