"""The PostgreSQL managed ledger against a real server: appends, reads, reopening, cursors, group commit, failed
writes, fencing by a newer owner, retention, the schema's version."""
import asyncio

import asyncpg
import pytest

from dedup import DedupConfig
from kop.ledger import LedgerConfig, InvalidMarkDeleteError, LedgerWriteError, ManagedLedgerError, Position
from kop.ledger.postgres import LedgerFencedOut, PgManagedLedger, PgStore
from kop.ledger.postgres.schema import SCHEMA_VERSION
from kop.partition import PartitionLog
from kop.startup import StartupError
from test_ledger import append  # the file engine's tests: the same appends
from tests.test_replication_partition import check_markers_left_out_of_reads

CONFIG = LedgerConfig(max_ledger_bytes=4096)


@pytest.fixture
async def store(postgres_url):
    store = await PgStore(postgres_url).open()
    yield store
    await store.close()


async def test_append_read_and_reopen_keep_offsets(store):
    ml = await PgManagedLedger.open("t", store, CONFIG)
    positions = await append(ml, 100)
    assert ml.confirmed_end_index == 200
    assert len({p.ledger_id for p in positions}) > 1  # rolled on size
    assert [e.first_index for e in ml.read_from_index(51, 1 << 20)] == list(range(50, 200, 2))
    await ml.close()
    ml = await PgManagedLedger.open("t", store, CONFIG)
    assert ml.confirmed_end_index == 200 and ml.last_confirmed == positions[-1]
    entries = ml.read_from_index(0, 1 << 20)
    assert [e.first_index for e in entries] == list(range(0, 200, 2))
    assert bytes(entries[25].data) == bytes([50]) * 100 and entries[25].metadata == b"meta"
    assert (await append(ml, 1))[0].ledger_id > positions[-1].ledger_id  # a new ledger after reopening
    assert len(ml.read_from_index(0, 1)) == 1 and len(ml.read_from_index(0, 250)) == 2  # KIP-74 limits
    await ml.close()


async def test_the_entry_before_an_offset_is_the_batch_after_markers_that_share_its_first_offset(store):
    """A consumer that committed offset 2 last read the batch at offset 1, not one of the markers (span 0) stored
    just before it with the same first offset."""
    ml = await PgManagedLedger.open("ties", store, CONFIG)
    await ml.add_entry(0, 1, b"meta", b"a")
    for _ in range(3):
        await ml.add_entry(1, 0, b"marker", b"")
    batch = await ml.add_entry(1, 1, b"meta", b"b")
    assert await store.positions_before([("ties", 2), ("ties", 1), ("ties", 0)]) == \
        [(batch.ledger_id, batch.entry_id), (batch.ledger_id, 0), None]
    await ml.close()


async def test_the_entry_rows_are_the_file_engines_framed_bytes(store, postgres_url):
    ml = await PgManagedLedger.open("t", store, CONFIG)
    await append(ml, 3)
    await ml.close()
    from kop.ledger.ledger_file import encode_entry
    conn = await asyncpg.connect(postgres_url)
    try:
        rows = await conn.fetch("SELECT first_index, entry FROM kop_entry WHERE name = 't' ORDER BY first_index")
        version = await conn.fetchval("SELECT version FROM kop_schema")
    finally:
        await conn.close()
    assert [r[0] for r in rows] == [0, 2, 4]
    assert rows[1][1] == encode_entry(2, 2, b"meta", bytes([2]) * 100)
    assert version == SCHEMA_VERSION


async def test_many_appends_share_one_round_trip(store):
    ml = await PgManagedLedger.open("t", store, CONFIG)
    statements = []
    original = store.append

    async def counting(*args):
        statements.append(len(args[-1]))
        await original(*args)

    store.append = counting
    await append(ml, 200, size=10)
    assert sum(statements) == 200
    assert len(statements) < 20, statements  # submitted while one commit was in flight: batched into the next
    await ml.close()


async def test_cursor_position_and_properties_survive_reopening(store):
    ml = await PgManagedLedger.open("t", store, CONFIG)
    positions = await append(ml, 5)
    cursor = ml.open_cursor("pulsar.dedup", positions[0])
    assert not cursor.is_durable
    await cursor.mark_delete(positions[2], {"p1": 7}, {"s": "x"})
    with pytest.raises(InvalidMarkDeleteError):
        await cursor.mark_delete(positions[1])
    group = ml.open_cursor("g", positions[0])
    await asyncio.gather(*(group.reset(positions[i], {"o": i}) for i in range(5)))  # one round trip, the last wins
    await ml.open_cursor("gone").mark_delete(positions[4])
    await ml.delete_cursor("gone")
    await ml.close()
    ml = await PgManagedLedger.open("t", store, CONFIG)
    assert set(ml.cursors) == {"pulsar.dedup", "g"}
    dedup = ml.cursors["pulsar.dedup"]
    assert dedup.is_durable and dedup.mark_delete_position == positions[2]
    assert dedup.properties == {"p1": 7} and dedup.string_properties == {"s": "x"}
    assert ml.cursors["g"].properties == {"o": 4}
    await ml.close()


async def test_a_failed_write_is_not_stored_and_writes_resume_after(store):
    ml = await PgManagedLedger.open("t", store, CONFIG)
    failures = []
    ml.add_failure_listener(failures.append)
    await append(ml, 3)
    ml.inject_write_failures(1)
    results = await asyncio.gather(*(ml.add_entry(ml.written_end_index, 2, b"m", b"x" * 10) for _ in range(1)),
                                   return_exceptions=True)
    assert isinstance(results[0], LedgerWriteError) and len(failures) == 1
    assert ml.confirmed_end_index == ml.written_end_index == 6
    await until_writes_resume(ml, 2)  # the clean-up runs in the background; appends are refused until it is done
    assert ml.confirmed_end_index == 10
    await ml.close()
    ml = await PgManagedLedger.open("t", store, CONFIG)
    assert [e.first_index for e in ml.read_from_index(0, 1 << 20)] == [0, 2, 4, 6, 8]
    await ml.close()


async def until_writes_resume(ml, count: int) -> None:
    """Append `count` entries once the clean-up after a failed write let appends in again."""
    for _ in range(50):
        try:
            await append(ml, count)
            return
        except Exception:  # noqa: BLE001 - refused until the clean-up is done
            await asyncio.sleep(0.05)
    raise AssertionError("writes did not resume after the failed write")


async def test_entries_that_cover_no_offset_are_stored_reloaded_and_kept_after_a_failed_write(store):
    """PIP-33 markers cover no offset: a marker shares its first offset with the next entry (and with another
    marker), and a confirmed marker at the end is not part of a later failed write's tail."""
    ml = await PgManagedLedger.open("t", store, CONFIG)
    await append(ml, 2)
    await asyncio.gather(ml.add_entry(4, 0, b"marker", b"a"), ml.add_entry(4, 0, b"marker", b"b"))
    await append(ml, 1)
    await ml.add_entry(6, 0, b"marker", b"c")
    ml.inject_write_failures(1)
    with pytest.raises(LedgerWriteError):
        await ml.add_entry(6, 2, b"m", b"x" * 10)
    await until_writes_resume(ml, 1)
    await ml.close()
    ml = await PgManagedLedger.open("t", store, CONFIG)
    stored = [(e.first_index, e.span, bytes(e.data)) for e in ml.read_after(Position(-1, -1), 100)]
    assert [(first, span) for first, span, _ in stored] == [(0, 2), (2, 2), (4, 0), (4, 0), (4, 2), (6, 0), (6, 2)]
    assert [data for _, span, data in stored if not span] == [b"a", b"b", b"c"]
    await ml.close()


async def test_an_earlier_owner_is_fenced_out_by_a_newer_one(store, postgres_url):
    old = await PgManagedLedger.open("t", store, CONFIG)
    await append(old, 2)
    cursor = old.open_cursor("g")
    other_store = await PgStore(postgres_url).open()  # another broker
    try:
        new = await PgManagedLedger.open("t", other_store, CONFIG)
        assert new.epoch == old.epoch + 1
        with pytest.raises(LedgerWriteError):
            await append(old, 1)
        with pytest.raises(LedgerFencedOut):
            await cursor.mark_delete(old.last_confirmed)
        await append(new, 1)
        assert [e.first_index for e in new.read_from_index(0, 1 << 20)] == [0, 2, 4]
        await new.close()
    finally:
        await other_store.close()
    await old.close()


async def test_retention_deletes_whole_ledgers_and_delete_before_is_stored(store):
    ml = await PgManagedLedger.open("t", store, CONFIG)
    await append(ml, 100)  # rolls every ~40 entries
    result = await ml.trim(0, retention_ms=-1, retention_bytes=5000, keep_from=None)
    assert result.deleted >= 1 and 0 < ml.start_index < 180
    start = ml.start_index
    assert await ml.delete_before(start + 10) == start + 10
    await ml.close()
    ml = await PgManagedLedger.open("t", store, CONFIG)
    assert ml.start_index == start + 10 and ml.confirmed_end_index == 200
    assert ml.read_from_index(start, 1 << 20) == []
    await ml.close()


async def test_a_database_of_a_newer_schema_is_refused(postgres_url):
    conn = await asyncpg.connect(postgres_url)
    try:
        await conn.execute("CREATE TABLE kop_schema (version integer NOT NULL)")
        await conn.execute("INSERT INTO kop_schema VALUES ($1)", SCHEMA_VERSION + 1)
    finally:
        await conn.close()
    with pytest.raises(StartupError, match="newer than this kop"):
        await PgStore(postgres_url).open()


async def test_a_database_of_the_first_schema_is_migrated(postgres_url):
    from kop.ledger.postgres.schema import MIGRATIONS
    conn = await asyncpg.connect(postgres_url)
    try:
        await conn.execute("CREATE TABLE kop_schema (version integer NOT NULL); INSERT INTO kop_schema VALUES (1)")
        await conn.execute(MIGRATIONS[0])
        await conn.execute("INSERT INTO kop_record VALUES ('topic', 'public/default/t', 'x')")
        await conn.execute("INSERT INTO kop_entry VALUES ('t', 0, 0, 0, 'e')")
        await conn.execute("INSERT INTO kop_managed_ledger VALUES ('t', 1, 0, 1, 0)")
    finally:
        await conn.close()
    store = await PgStore(postgres_url).open()
    try:
        assert await store.records("topic") == {"public/default/t": b"x"}  # kept
        assert await store.reserve_producer_ids(1000) == 0  # the table version 2 added
    finally:
        await store.close()
    conn = await asyncpg.connect(postgres_url)
    try:
        assert await conn.fetchval("SELECT version FROM kop_schema") == SCHEMA_VERSION == 8
        assert await conn.fetchval("SELECT entry FROM kop_entry WHERE name = 't' AND entry_id = 0") == b"e"
        assert await conn.fetchval("SELECT count(*) FROM kop_broker") == 0  # the table version 4 added
        assert await conn.fetchval("SELECT count(*) FROM kop_record_version") == 0  # version 5's
        assert await conn.fetchval("SELECT count(txn_index) FROM kop_ledger") == 0  # the column version 6 added
        assert await conn.fetchval("SELECT count(*) FROM pg_indexes WHERE indexname = 'kop_entry_first_index'") == 1
        assert await conn.fetchval("SELECT cleaned_through FROM kop_managed_ledger WHERE name = 't'") == -1  # 8's
    finally:
        await conn.close()


async def test_producer_id_blocks_are_never_handed_out_twice(store, postgres_url):
    other = await PgStore(postgres_url).open()  # another broker on the same database
    try:
        starts = await asyncio.gather(*(s.reserve_producer_ids(1000) for s in [store, other] * 5))
    finally:
        await other.close()
    assert sorted(starts) == list(range(0, 10_000, 1000))


async def test_a_closed_ledgers_transaction_index_is_a_column_of_its_row_and_goes_with_it(store):
    ml = await PgManagedLedger.open("t", store, CONFIG)
    positions = await append(ml, 100)
    first, current = positions[0].ledger_id, positions[-1].ledger_id
    with pytest.raises(ValueError):
        await ml.write_txn_index(current, b"open")  # only a closed ledger gets one
    await ml.write_txn_index(first, b"index")
    assert await ml.read_txn_index(first) == b"index" and ml.txn_indexed_ledgers() == [first]
    await ml.close()

    ml = await PgManagedLedger.open("t", store, CONFIG)
    assert ml.txn_indexed_ledgers() == [first] and await ml.read_txn_index(first) == b"index"
    assert (await ml.trim(0, -1, 1, None)).deleted > 0  # retention (by size) takes the ledger's row
    assert ml.txn_indexed_ledgers() == [] and await ml.read_txn_index(first) is None
    async with store.pool.acquire() as conn:
        assert await conn.fetchval("SELECT count(txn_index) FROM kop_ledger WHERE name = 't'") == 0
    await ml.close()


async def test_a_consumers_read_leaves_markers_out_across_ledgers(store):
    partition = PartitionLog("t", 0, await PgManagedLedger.open("t", store, CONFIG), DedupConfig())
    await check_markers_left_out_of_reads(partition)
    assert len(partition.ledger.internal_stats().ledgers) > 1  # control: the ledger rolled among them
    await partition.close()


async def test_delete_before_with_the_database_out_of_reach_is_a_ledger_error_and_deletes_nothing(postgres_url):
    """DeleteRecords answers KAFKA_STORAGE_ERROR for a ManagedLedgerError: the database's own errors are one too."""
    store = await PgStore(postgres_url).open()
    ml = await PgManagedLedger.open("gone", store, LedgerConfig())
    await append(ml, 3)
    await store.pool.close()  # as the database out of reach: every statement fails on the pool's side
    try:
        with pytest.raises(ManagedLedgerError, match="the new log start not stored"):
            await ml.delete_before(2)
        assert ml.start_index == 0
    finally:
        await store.close()
