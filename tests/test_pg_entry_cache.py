"""The PostgreSQL engine with a bounded entry cache, against a real server: a takeover loads every entry's index
metadata without its bytes (plus the tail's bytes, within a budget), a read the cache misses comes back short and
reads the bytes back in the background (waking the readers waiting for entries, as a Fetch's long poll does), an
awaited read waits for them (the dedup replay of a takeover), the cleaner reads evicted entries back, the cache stays
within its bound, and damaged stored bytes are refused, never served. The cache's own order and bound, alone."""
import asyncio

import asyncpg
import pytest

from dedup import DedupConfig, Status
from kop.compaction.rewrite import CompactionJob, compact
from kop.ledger import LedgerConfig, Position
from kop.ledger.interface import Entry
from kop.ledger.postgres import PgManagedLedger, PgStore
from kop.ledger.postgres import ledger as ledger_module
from kop.ledger.postgres.entry_cache import EntryCache
from kop.ledger.time_index import batch_max_timestamp
from kop.partition import PartitionLog
from protocol.errors import ErrorCode
from protocol.records import iter_records
from test_ledger import append  # the file engine's tests: the same appends
from tests.test_compaction_rewrite import T0, batch, write
from tests.test_partition_dedup import NAME, answers, batch as dedup_batch

CONFIG = LedgerConfig(max_ledger_bytes=4096)
BOUND = 2000  # entry bytes held by the bounded broker: 20 of the 100-byte entries


@pytest.fixture
async def stores(postgres_url):
    """(a broker holding every entry, a broker whose cache is bounded) on one database."""
    whole = await PgStore(postgres_url).open()
    bounded = await PgStore(postgres_url, entry_cache_bytes=BOUND).open()
    yield whole, bounded
    await bounded.close()
    await whole.close()


async def written_and_reopened(stores, count: int = 100, name: str = "t") -> tuple[PgManagedLedger, list[Position]]:
    """count entries of 100 bytes written by the unbounded broker, then the partition taken over by the bounded one."""
    whole, bounded = stores
    ml = await PgManagedLedger.open(name, whole, CONFIG)
    positions = await append(ml, count)
    await ml.close()
    return await PgManagedLedger.open(name, bounded, CONFIG), positions


async def read_all(ml: PgManagedLedger, batch_entries: int = 10, check=lambda: True) -> list[Entry]:
    """Every durable entry, by awaited reads (each may come back short, never empty before the end), as the dedup
    replay reads; check() holds after each read."""
    seen: list[Entry] = []
    after = Position(-1, -1)
    for _ in range(1000):  # bounded: at least one entry a read
        entries = await ml.read_after_async(after, batch_entries)
        assert check()
        if not entries:
            return seen
        seen.extend(entries)
        after = entries[-1].position
    raise AssertionError("the reads did not reach the end")


def held(ml: PgManagedLedger) -> list[int]:
    """The ledger ids of the entries whose bytes ml holds, one per entry."""
    return [l.ledger_id for l in ml._ledgers for data in l.data if data is not None]


async def test_a_takeover_loads_the_index_and_only_the_tails_bytes(stores):
    ml, positions = await written_and_reopened(stores)
    whole = await PgManagedLedger.open("t", stores[0], CONFIG)  # the same partition loaded whole, to compare with
    assert ml.confirmed_end_index == whole.confirmed_end_index == 200 and ml.last_confirmed == positions[-1]
    assert ml.start_index == 0 and ml.position_of_index(101) == whole.position_of_index(101) == positions[50]
    assert ml.internal_stats().ledgers == whole.internal_stats().ledgers  # entries and sizes from the heads
    last_ledger = positions[-1].ledger_id
    in_last = sum(p.ledger_id == last_ledger for p in positions)
    tail_entries = len(held(ml))  # the tail's bytes only: the last entries of the last ledger, within the bound
    assert held(ml) == [last_ledger] * tail_entries and 0 < tail_entries <= in_last
    last = next(l for l in ml._ledgers if l.ledger_id == last_ledger)
    assert [d is not None for d in last.data] == [False] * (in_last - tail_entries) + [True] * tail_entries
    assert stores[1].entry_cache.size == 100 * len(held(ml))
    # The tail is served at once, as before.
    tail = ml.read_from_index(198, 1 << 20)
    assert [e.first_index for e in tail] == [198] and bytes(tail[0].data) == bytes([198]) * 100
    await whole.close()
    await ml.close()


async def test_a_read_that_misses_comes_back_short_and_the_fill_wakes_readers(stores):
    ml, positions = await written_and_reopened(stores)
    woken = asyncio.Event()
    ml.add_confirm_listener(woken.set)  # a Fetch's long poll waits on this
    assert ml.read_from_index(0, 1 << 20) == []  # nothing of ledger 0 held: short (empty), a fill started
    assert ml.read_from_index(0, 1 << 20) == [] and stores[1].entry_cache.misses == 1  # joined, not started again
    await asyncio.wait_for(woken.wait(), 30)
    entries = ml.read_from_index(0, 1000)
    assert [e.first_index for e in entries] == list(range(0, 20, 2))  # read back: the same entries as written
    assert [bytes(e.data) for e in entries] == [bytes([i]) * 100 for i in range(0, 20, 2)]
    assert all(e.metadata == b"meta" and e.span == 2 for e in entries)
    assert [e.position for e in entries] == positions[:10]
    await ml.close()


async def test_an_awaited_read_returns_every_entry_and_the_cache_stays_bounded(stores):
    ml, positions = await written_and_reopened(stores)
    cache = stores[1].entry_cache
    seen = await read_all(ml, 7, check=lambda: cache.size <= BOUND)
    assert [e.position for e in seen] == positions
    assert [bytes(e.data) for e in seen] == [bytes([i % 256]) * 100 for i in range(0, 200, 2)]
    assert len(held(ml)) <= BOUND // 100
    await ml.close()
    assert cache.size == 0 and len(cache) == 0  # a closed ledger gives its bytes back


async def test_a_reader_cancelled_while_waiting_for_a_read_back_leaves_the_others_theirs(stores):
    """Readers of the same miss share one read-back: a connection closed under one of them cancels that reader only,
    not the read-back the others wait for."""
    ml, positions = await written_and_reopened(stores)
    leaving = asyncio.ensure_future(ml.read_from_index_async(0, 1000))
    staying = asyncio.ensure_future(ml.read_from_index_async(0, 1000))
    await asyncio.sleep(0)  # both are waiting on the one fill now
    assert stores[1].entry_cache.misses == 1
    leaving.cancel()
    entries = await asyncio.wait_for(staying, 30)
    assert leaving.cancelled()
    assert [e.position for e in entries] == positions[:10]
    await ml.close()


async def test_appends_beyond_the_bound_evict_the_oldest_bytes_and_reads_still_find_them(stores):
    _, bounded = stores
    ml = await PgManagedLedger.open("t", bounded, CONFIG)
    positions = await append(ml, 100)
    assert bounded.entry_cache.size <= BOUND and len(held(ml)) == BOUND // 100
    assert held(ml)[-1] == positions[-1].ledger_id  # the newest kept
    assert ml.read_from_index(0, 1 << 20) == []
    entries = await ml.read_after_async(Position(-1, -1), 1)
    assert [(e.position, bytes(e.data)) for e in entries] == [(positions[0], bytes([0]) * 100)]
    found = await ml.find_by_timestamp(-1, 50)  # a timestamp every batch reaches: the entry holding offset 50
    assert found is not None and found.position == positions[25] and bytes(found.data) == bytes([50]) * 100
    await ml.close()


async def test_large_entries_and_markers_are_indexed_from_their_heads(stores):
    """The head query reads a slice of each entry: sizes, offsets, metadata and times must come out the same as
    when the whole entry is read, for entries stored out of line (TOAST) and markers without a batch."""
    whole, bounded = stores
    ml = await PgManagedLedger.open("big", whole, LedgerConfig())
    big = batch(0, [(b"k", b"v" * 300_000)])
    await write(ml, big)
    await ml.add_entry(1, 0, b"marker-metadata", b"")
    ml._start_new_ledger()
    await ml.add_entry(1, 1, b"meta", b"x")  # the tail
    await ml.close()
    ml = await PgManagedLedger.open("big", bounded, LedgerConfig())
    first = ml._ledgers[0]
    assert list(first.sizes) == [len(big), 0] and list(first.spans) == [1, 0]
    assert first.metadata[1] == b"marker-metadata" and first.data == [None, None]
    assert list(first.times.timestamps) == [batch_max_timestamp(big), -1] and batch_max_timestamp(big) == T0
    found = await ml.find_by_timestamp(T0, 0)
    assert found.position == Position(first.ledger_id, 0) and bytes(found.data) == bytes(big)
    assert [r.value for r in iter_records(found.data)] == [b"v" * 300_000]
    await ml.close()


async def test_damaged_stored_bytes_are_refused_not_served(stores, postgres_url):
    ml, positions = await written_and_reopened(stores)
    conn = await asyncpg.connect(postgres_url)
    try:  # flip a byte of the first entry's batch: its CRC no longer matches
        await conn.execute("UPDATE kop_entry SET entry = overlay(entry PLACING '\\xff'::bytea FROM 40 FOR 1) "
                           "WHERE name = 't' AND ledger_id = $1 AND entry_id = 0", positions[0].ledger_id)
    finally:
        await conn.close()
    with pytest.raises(OSError):
        await ml.read_after_async(Position(-1, -1), 1)
    with pytest.raises(OSError):  # never the damaged bytes, nor a short read for ever: an error (KAFKA_STORAGE_ERROR)
        ml.read_from_index(0, 1 << 20)
    later = await ml.read_after_async(positions[0], 1)  # the entries after it are whole
    assert [e.position for e in later] == [positions[1]]
    await ml.close()


async def test_the_cleaner_reads_evicted_entries_back_for_its_pass(stores):
    _, bounded = stores
    ml = await PgManagedLedger.open("c", bounded, LedgerConfig(max_ledger_bytes=1 << 20))
    await write(ml, batch(0, [(b"a", b"a0" * 600), (b"b", b"b0")]))
    await write(ml, batch(2, [(b"a", b"a1" * 600)]))
    ml._start_new_ledger()  # close it: only closed ledgers are cleaned
    await write(ml, batch(3, [(b"b", b"b3" * 600)]))  # evicts the closed ledger's first entry
    ml._start_new_ledger()
    snapshots = ml.closed_ledgers()
    assert snapshots[0].entries[0] is None  # its bytes were evicted
    snapshots = await ml.with_entries(snapshots[:1])
    assert all(e is not None for e in snapshots[0].entries)
    result = compact(CompactionJob("c", "test", tuple(snapshots), 0, CONFIG.max_entry_bytes, True))
    installed = await ml.install_compaction(result.rewritten, snapshots[-1].ledger_id)
    assert len(installed) == 1
    records = [(r.offset, r.key) for e in await read_all(ml) for r in iter_records(e.data)]
    assert records == [(1, b"b"), (2, b"a"), (3, b"b")]
    await ml.close()



async def test_a_takeovers_dedup_replay_reads_the_evicted_entries_back(stores):
    """The new owner's PIP-6 replay reads every entry after the dedup cursor, though only the tail's bytes were
    loaded: a producer's retry of a stored batch is then answered as stored, not stored twice."""
    whole, bounded = stores
    small = LedgerConfig(max_ledger_bytes=1)  # a ledger per entry: a takeover holds only the last one's bytes
    first = PartitionLog("t", 0, await PgManagedLedger.open("t-0", whole, small), DedupConfig())
    await first.apply_dedup_policy(True)
    assert await answers(*(first.publish_normal(*dedup_batch(seq, b"v%d" % seq)) for seq in range(4))) == \
        [(ErrorCode.NONE, seq) for seq in range(4)]
    ml = await PgManagedLedger.open("t-0", bounded, small)  # taken over without a clean close: a replay is due
    assert len(set(held(ml))) == 1 and len(ml._ledgers) > 4  # control: the earlier ledgers' bytes not loaded
    second = PartitionLog("t", 0, ml, DedupConfig())
    await second.apply_dedup_policy(True)
    assert second.dedup.status is Status.ENABLED and dict(second.dedup.persisted) == {NAME: 3}
    assert len(set(held(ml))) > 1  # the replay read them back
    assert await answers(second.publish_normal(*dedup_batch(2, b"v2"))) == [(ErrorCode.NONE, 2)]  # a lost response
    assert ml.confirmed_end_index == 4  # not stored again
    await second.close()
    await first.close()


async def test_an_entrys_offsets_come_from_the_index_without_its_bytes(stores):
    ml, positions = await written_and_reopened(stores)
    assert ml._ledgers[0].data[5] is None  # control: its bytes are not held
    assert ml.offsets_of(positions[5]) == (10, 2)
    assert ml.offsets_of(Position(positions[5].ledger_id, 10_000)) is None
    assert ml.offsets_of(Position(positions[-1].ledger_id + 1, 0)) is None  # the empty current ledger
    await ml.close()


async def test_a_takeover_reads_only_the_last_entries_that_fit_in_the_tail_budget(stores, monkeypatch):
    monkeypatch.setattr(ledger_module, "TAKEOVER_TAIL_BYTES", 400)  # three framed entries of 126 bytes
    ml, positions = await written_and_reopened(stores)
    assert [Position(l.ledger_id, i) for l in ml._ledgers for i, data in enumerate(l.data) if data is not None] == \
        positions[-3:]
    await ml.close()


async def test_a_consumers_read_that_misses_is_short_and_its_long_poll_is_woken_by_the_fill(stores):
    """What the Fetch handler sees: an empty read below the high watermark (not an error), and the partition's
    watchers (a long poll) woken once the bytes are in, so its next read serves them."""
    ml, positions = await written_and_reopened(stores)
    partition = PartitionLog("t", 0, ml, DedupConfig())
    assert partition.high_watermark == 200 and partition.read_records(0, 1 << 20) == []
    woken = asyncio.get_running_loop().create_future()
    partition.watch(woken)
    await asyncio.wait_for(woken, 30)
    records = partition.read_records(0, 1000)
    assert [e.position for e in records] == positions[:10]
    await partition.close()


class _Owner:
    def __init__(self) -> None:
        self.dropped: list[int] = []

    def drop_bytes(self, entry_id: int) -> None:
        self.dropped.append(entry_id)


def test_the_cache_drops_the_least_recently_used_past_its_bound_and_an_unbounded_one_only_counts():
    owner, cache = _Owner(), EntryCache(300)
    for entry_id in range(3):
        cache.add(owner, entry_id, 100)
    cache.touch(owner, 0)  # read again: now the most recently used
    cache.add(owner, 3, 100)
    assert owner.dropped == [1] and cache.size == 300
    cache.discard(owner, 2, 100)
    cache.add(owner, 4, 500)  # larger than the bound: kept alone, what was read last
    assert owner.dropped == [1, 0, 3] and cache.size == 500 and len(cache) == 1 and cache.evictions == 3
    unbounded = EntryCache()
    for entry_id in range(1000):
        unbounded.add(owner, entry_id, 100)
    unbounded.discard(owner, 0, 100)
    assert unbounded.size == 99_900 and len(unbounded) == 0 and owner.dropped == [1, 0, 3]
