"""Log compaction on the PostgreSQL engine against a real server: the cleaner's rewrite of entries held in memory
keeps every entry's position, offsets and producer fields; its install stores the changed entries and the
cleaned-through point in one fenced transaction (all or nothing), is served at once and survives a reopen; a fenced
owner or a ledger retention deleted meanwhile installs nothing."""
import threading
from dataclasses import replace

import asyncpg
import pytest

from kop.compaction.rewrite import CleanerStopped, CompactionJob, CompactionResult, compact
from kop.ledger import LedgerConfig
from kop.ledger.postgres import PgManagedLedger, PgStore
from protocol.records import iter_records, split_batches
from tests.test_compaction_rewrite import T0, batch, write

CONFIG = LedgerConfig(max_ledger_bytes=1 << 20)


@pytest.fixture
async def store(postgres_url):
    store = await PgStore(postgres_url).open()
    yield store
    await store.close()


def job(ml: PgManagedLedger, horizon_ms: int = 0) -> CompactionJob:
    return CompactionJob("t", "test", tuple(ml.closed_ledgers()), horizon_ms, CONFIG.max_entry_bytes, True)


def stored(ml: PgManagedLedger, start: int = 0) -> list[tuple[int, bytes | None, bytes | None]]:
    return [(r.offset, r.key, r.value) for e in ml.read_from_index(start, 1 << 30) for r in iter_records(e.data)]


async def rows(postgres_url: str, name: str) -> list[tuple[int, int, int, bytes]]:
    conn = await asyncpg.connect(postgres_url)
    try:
        return [tuple(r) for r in await conn.fetch("SELECT ledger_id, entry_id, first_index, entry FROM kop_entry "
                                                    "WHERE name = $1 ORDER BY ledger_id, entry_id", name)]
    finally:
        await conn.close()


async def two_closed_ledgers(ml: PgManagedLedger) -> None:
    await write(ml, batch(0, [(b"a", b"a0"), (b"b", b"b0")], producer_id=7, sequence=0))
    await write(ml, batch(2, [(b"a", b"a1"), (b"c", b"c1")], producer_id=7, sequence=2))
    ml._start_new_ledger()  # close it: only closed ledgers are cleaned
    await write(ml, batch(4, [(b"b", None), (b"a", b"a2")], producer_id=7, sequence=4))
    await write(ml, batch(6, [(b"a", b"a3")], producer_id=7, sequence=6))
    ml._start_new_ledger()
    await write(ml, batch(7, [(b"c", b"c3")]))  # the current ledger: never cleaned


EXPECTED = [(3, b"c", b"c1"), (4, b"b", None), (6, b"a", b"a3"), (7, b"c", b"c3")]


async def compacted(store: PgStore, postgres_url: str) -> tuple[PgManagedLedger, list, CompactionResult]:
    """"t" with two closed ledgers, its rows as stored, and a pass over them, not installed yet."""
    ml = await PgManagedLedger.open("t", store, CONFIG)
    await two_closed_ledgers(ml)
    return ml, await rows(postgres_url, "t"), compact(job(ml))


async def reopened(ml: PgManagedLedger, store: PgStore) -> PgManagedLedger:
    """The managed ledger closed and opened again, as the next owner loads it."""
    await ml.close()
    return await PgManagedLedger.open(ml.name, store, CONFIG)


async def test_a_compaction_is_stored_in_place_and_survives_a_reopen(store, postgres_url):
    ml = await PgManagedLedger.open("t", store, CONFIG)
    await two_closed_ledgers(ml)
    before = ml.read_from_index(0, 1 << 30)
    rows_before = await rows(postgres_url, "t")
    closed = ml.closed_ledgers()
    assert [s.ledger_id for s in closed] == [0, 1]  # the current ledger is not offered
    result = compact(job(ml))  # tombstones stay: their ledger is younger than the horizon
    assert (result.keys, result.records_read, result.records_removed) == (3, 7, 4)
    assert all(r.in_memory and r.size < r.size_before for r in result.rewritten)
    installed = await ml.install_compaction(result.rewritten, closed[-1].ledger_id)
    assert installed == result.rewritten and ml.cleaned_through == 1
    assert stored(ml) == EXPECTED
    after = ml.read_from_index(0, 1 << 30)
    assert [(e.position, e.first_index, e.span, e.metadata) for e in after] == \
        [(e.position, e.first_index, e.span, e.metadata) for e in before]
    for new, was in zip(after, before):  # emptied batches stay, with their producer fields and offsets
        (h, _), = split_batches(new.data)
        (w, _), = split_batches(was.data)
        assert (h.base_offset, h.last_offset_delta, h.producer_id, h.producer_epoch, h.base_sequence,
                h.max_timestamp) == (w.base_offset, w.last_offset_delta, w.producer_id, w.producer_epoch,
                                     w.base_sequence, w.max_timestamp)
    assert await ml.find_by_timestamp(T0 + 1, 0) is not None  # the time index is unchanged
    rows_after = await rows(postgres_url, "t")
    assert [r[:3] for r in rows_after] == [r[:3] for r in rows_before]  # same positions and first offsets
    assert sum(len(r[3]) for r in rows_after) < sum(len(r[3]) for r in rows_before)
    assert rows_after[3] == rows_before[3]  # an entry that kept all its records is not rewritten
    ml = await reopened(ml, store)
    assert stored(ml) == EXPECTED and ml.cleaned_through == 1
    assert [(e.position, e.first_index) for e in ml.read_from_index(0, 1 << 30)] == \
        [(e.position, e.first_index) for e in before]
    await ml.close()


async def test_the_rewrites_and_the_cleaned_through_point_commit_together_or_not_at_all(store, postgres_url):
    ml, rows_before, result = await compacted(store, postgres_url)
    changed = [(r.ledger_id, entry_id, payload) for r in result.rewritten for entry_id, payload in r.entries]

    def crash() -> None:  # the failpoint's moment: every statement ran, the commit did not
        raise RuntimeError("crashed before the commit")

    with pytest.raises(RuntimeError):
        await store.install_compaction("t", ml.epoch, changed, 1, crash)
    assert await rows(postgres_url, "t") == rows_before
    ml = await reopened(ml, store)
    assert ml.cleaned_through == -1
    assert await store.install_compaction("t", ml.epoch, changed, 1) == {0, 1}  # the control: it installs
    assert await rows(postgres_url, "t") != rows_before
    await ml.close()


async def test_a_fenced_owner_installs_nothing(store, postgres_url):
    ml, rows_before, result = await compacted(store, postgres_url)
    newer = await PgManagedLedger.open("t", store, CONFIG)  # another broker took the partition
    assert await ml.install_compaction(result.rewritten, 1) == []
    assert await rows(postgres_url, "t") == rows_before and ml.cleaned_through == -1
    assert len(stored(ml)) == 8  # memory still serves the originals
    assert await newer.install_compaction(compact(job(newer)).rewritten, 1) != []  # the control
    await ml.close()
    await newer.close()


async def test_a_ledger_deleted_by_retention_meanwhile_is_not_installed(store):
    ml = await PgManagedLedger.open("t", store, CONFIG)
    await two_closed_ledgers(ml)
    result = compact(job(ml))
    assert [r.ledger_id for r in result.rewritten] == [0, 1]
    await ml._delete_oldest()  # retention, between the cleaner's read and its install
    installed = await ml.install_compaction(result.rewritten, 1)
    assert [r.ledger_id for r in installed] == [1]
    assert stored(ml, 4) == EXPECTED[1:]
    await ml.close()


async def test_only_ledgers_whose_entries_are_all_durable_are_offered(store):
    ml = await PgManagedLedger.open("t", store, CONFIG)
    await write(ml, batch(0, [(b"a", b"a0")]))
    ml.hold_flushes(True)
    pending = ml.add_entry(1, 1, b"meta", batch(1, [(b"a", b"a1")]))
    ml._start_new_ledger()  # closed in memory, but its last entry is not committed yet
    assert ml.closed_ledgers() == []
    ml.hold_flushes(False)
    await pending
    assert [s.ledger_id for s in ml.closed_ledgers()] == [0]
    await ml.close()


async def test_a_pass_in_a_thread_ends_once_the_cleaner_stops(store):
    """The broker shutting down does not wait for a pass over entries in memory: it ends at the next entry."""
    ml = await PgManagedLedger.open("t", store, CONFIG)
    await two_closed_ledgers(ml)
    stop = threading.Event()
    assert compact(replace(job(ml), stop=stop)).records_removed == 4  # the control: not stopped, it runs
    stop.set()
    with pytest.raises(CleanerStopped):
        compact(replace(job(ml), stop=stop))
    await ml.close()
