"""The bytes of entries the PostgreSQL engine holds in memory, bounded per broker (Pulsar's managed-ledger entry
cache in front of BookKeeper reads).

Every managed ledger of the broker shares one cache. An entry whose bytes are held is recorded here by its owner
(the engine's in-memory ledger) and entry id, most recently used last; once the total passes `max_bytes`, the least
recently used entries are dropped from their owners (`owner.drop_bytes(entry_id)`) until it fits again. An owner
keeps every entry's index metadata regardless (offsets, size, time, MessageMetadata), so a dropped entry is still
found by offset and read again from the database when wanted. `max_bytes` None keeps every entry: nothing is ever
dropped (the engine's behaviour before the cache), and only the total is counted, no order kept.
"""
from collections import OrderedDict
from typing import Protocol


class BytesOwner(Protocol):
    def drop_bytes(self, entry_id: int) -> None: ...


class EntryCache:
    def __init__(self, max_bytes: int | None = None) -> None:
        self.max_bytes = max_bytes
        self.size = 0
        self.misses = 0  # reads that found an entry's bytes not held and read them back from the database
        self.evictions = 0  # entries whose bytes were dropped to stay within the bound
        self._entries: OrderedDict[tuple[BytesOwner, int], int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, owner: BytesOwner, entry_id: int, size: int) -> None:
        """The bytes of owner's entry are held now (most recently used); drop the least recently used past the
        bound. The entry just added is dropped last: a read that filled it finds it even past the bound."""
        if self.max_bytes is None:
            self.size += size
            return
        key = (owner, entry_id)
        old = self._entries.pop(key, None)
        if old is not None:
            self.size -= old
        self._entries[key] = size
        self.size += size
        self._evict(keep=key)

    def touch(self, owner: BytesOwner, entry_id: int) -> None:
        if self.max_bytes is not None:
            key = (owner, entry_id)
            if key in self._entries:
                self._entries.move_to_end(key)

    def discard(self, owner: BytesOwner, entry_id: int, size: int) -> None:
        """The owner no longer holds the entry's bytes, of that size (truncated, deleted, closed)."""
        if self.max_bytes is None:
            self.size -= size
        elif self._entries.pop((owner, entry_id), None) is not None:
            self.size -= size

    def _evict(self, keep: tuple[BytesOwner, int]) -> None:
        while self.size > self.max_bytes and len(self._entries) > 1:
            key, size = next(iter(self._entries.items()))
            if key == keep:
                break
            del self._entries[key]
            self.size -= size
            self.evictions += 1
            key[0].drop_bytes(key[1])
