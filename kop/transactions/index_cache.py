"""Closed ledgers' aborted-transaction indexes read back for read_committed fetches, shared by a broker's partitions:
once they hold more than max_bytes, the least recently used go first. An index larger than the whole cache is
served without being kept."""
import itertools
from collections import OrderedDict

from kop.transactions.aborted_index import LedgerAborts

DEFAULT_CACHE_BYTES = 16 << 20


class IndexCache:
    def __init__(self, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[tuple[int, int], LedgerAborts] = OrderedDict()
        self._ledgers: dict[int, set[int]] = {}  # owner -> its ledgers cached
        self._owners = itertools.count()

    def new_owner(self) -> int:
        """A key space of its own for one partition's ledgers (ledger ids start again in a topic created anew)."""
        return next(self._owners)

    def get(self, owner: int, ledger_id: int) -> LedgerAborts | None:
        aborts = self._entries.get((owner, ledger_id))
        if aborts is None:
            self.misses += 1
            return None
        self.hits += 1
        self._entries.move_to_end((owner, ledger_id))
        return aborts

    def put(self, owner: int, ledger_id: int, aborts: LedgerAborts) -> None:
        self.discard(owner, ledger_id)
        if aborts.nbytes > self.max_bytes:
            return
        self._entries[(owner, ledger_id)] = aborts
        self._ledgers.setdefault(owner, set()).add(ledger_id)
        self.bytes += aborts.nbytes
        while self.bytes > self.max_bytes:
            self.discard(*next(iter(self._entries)))

    def discard(self, owner: int, ledger_id: int) -> None:
        aborts = self._entries.pop((owner, ledger_id), None)
        if aborts is not None:
            self.bytes -= aborts.nbytes
            ledgers = self._ledgers[owner]
            ledgers.discard(ledger_id)
            if not ledgers:
                del self._ledgers[owner]

    def discard_owner(self, owner: int) -> None:
        for ledger_id in list(self._ledgers.get(owner, ())):
            self.discard(owner, ledger_id)

    def __len__(self) -> int:
        return len(self._entries)
