"""Which live broker owns a partition: rendezvous (highest random weight) hashing over the live node ids.

Every broker computes the same answer from the same member list, with no coordination; when a broker leaves, only
its partitions move (each to the broker that scores next highest), and when one joins it takes about 1/n of them.
"""
import hashlib
from collections.abc import Callable, Iterable


def _score(node_id: int, key: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{node_id}/{key}".encode(), digest_size=8).digest(), "big")


def owner_of(key: str, node_ids: Iterable[int]) -> int | None:
    """The node that owns `key` (a managed ledger's name, a coordinator key); None with no live node."""
    return max(node_ids, key=lambda node: _score(node, key), default=None)


def java_hash_shard(key: str, shards: int) -> int:
    """Kafka's partitionFor of a coordinator key: abs(key.hashCode()) % shards, with Java's String.hashCode over
    UTF-16 code units."""
    h = 0
    data = key.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + int.from_bytes(data[i:i + 2], "big")) & 0xFFFFFFFF
    return (h & 0x7FFFFFFF) % shards


def taken_over(epochs: dict[int, int], ledger_of: Callable[[int], str], stored: dict[str, int]) -> list[int]:
    """The coordinator shards (`epochs`: shard -> the epoch this broker took it over with) whose fencing ledger's
    stored epoch (`stored`: ledger name -> epoch, read since) rose past this broker's: another broker took them."""
    return [shard for shard, epoch in sorted(epochs.items()) if stored.get(ledger_of(shard), epoch) > epoch]
