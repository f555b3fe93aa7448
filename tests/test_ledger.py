"""The file managed ledger: appends, reads, crash recovery (torn tails, stale index), cursors, failures, retention."""
import asyncio
import os
import time

import pytest

from kop.ledger import (BEFORE_FIRST, LedgerConfig, FileManagedLedger, InvalidMarkDeleteError, LedgerWriteError,
                        Position)

CONFIG = LedgerConfig(max_ledger_bytes=4096)


def open_ml(path, config=CONFIG):
    return FileManagedLedger.open("t", str(path), config, None)


async def append(ml, count, span=2, size=100):
    futures = []
    for _ in range(count):
        first = ml.written_end_index
        futures.append(ml.add_entry(first, span, b"meta", bytes([first % 256]) * size))
    return await asyncio.gather(*futures)


async def test_append_read_and_reopen_keep_offsets(tmp_path):
    ml = open_ml(tmp_path)
    positions = await append(ml, 100)
    assert ml.confirmed_end_index == 200
    assert len({p.ledger_id for p in positions}) > 1  # rolled on size
    entries = ml.read_from_index(51, 1 << 20)
    assert entries[0].first_index == 50 and entries[-1].first_index == 198
    assert [e.first_index for e in entries] == list(range(50, 200, 2))
    assert bytes(entries[0].data) == bytes([50]) * 100
    await ml.close()
    ml = open_ml(tmp_path)
    assert ml.confirmed_end_index == 200
    assert ml.last_confirmed == positions[-1]
    assert [e.first_index for e in ml.read_from_index(0, 1 << 20)] == list(range(0, 200, 2))
    assert (await append(ml, 1))[0].ledger_id > positions[-1].ledger_id  # a new ledger after reopening
    await ml.close()


async def test_read_respects_byte_limit_but_returns_at_least_one_entry(tmp_path):
    ml = open_ml(tmp_path, LedgerConfig())
    await append(ml, 10, size=1000)
    assert len(ml.read_from_index(0, 1)) == 1
    assert len(ml.read_from_index(0, 3500)) == 3
    assert ml.read_from_index(20, 100) == []
    await ml.close()


async def test_torn_tail_is_truncated_and_acknowledged_entries_survive(tmp_path):
    ml = open_ml(tmp_path, LedgerConfig())
    await append(ml, 5)
    ledger_id = ml.last_confirmed.ledger_id
    await ml.close()
    log = tmp_path / f"{ledger_id}.log"
    good = log.stat().st_size
    with open(log, "ab") as f:  # a crash mid-write: a length prefix and part of a payload
        f.write(b"\x00\x00\x01\x00\x12\x34\x56\x78partial")
    ml = open_ml(tmp_path, LedgerConfig())
    assert ml.confirmed_end_index == 10
    assert log.stat().st_size == good
    assert [e.first_index for e in ml.read_from_index(0, 1 << 20)] == [0, 2, 4, 6, 8]
    await ml.close()


async def test_corrupt_last_entry_is_dropped_not_served(tmp_path):
    ml = open_ml(tmp_path, LedgerConfig())
    await append(ml, 3)
    ledger_id = ml.last_confirmed.ledger_id
    await ml.close()
    log = tmp_path / f"{ledger_id}.log"
    data = bytearray(log.read_bytes())
    data[-5] ^= 0xFF  # bit rot in the last entry's payload
    log.write_bytes(bytes(data))
    ml = open_ml(tmp_path, LedgerConfig())
    assert ml.confirmed_end_index == 4
    await ml.close()


async def test_missing_index_is_rebuilt_from_the_log(tmp_path):
    ml = open_ml(tmp_path, LedgerConfig())
    await append(ml, 7)
    ledger_id = ml.last_confirmed.ledger_id
    await ml.close()
    os.unlink(tmp_path / f"{ledger_id}.idx")
    ml = open_ml(tmp_path, LedgerConfig())
    assert ml.position_of_index(9) == Position(ledger_id, 4)
    assert ml.confirmed_end_index == 14
    await ml.close()


async def test_failed_write_fails_pending_entries_and_rolls(tmp_path):
    ml = open_ml(tmp_path, LedgerConfig())
    first = await append(ml, 2)
    ml.inject_write_failures(1)
    doomed = [ml.add_entry(ml.written_end_index, 2, b"", b"x") for _ in range(1)]
    with pytest.raises(LedgerWriteError):
        await doomed[0]
    assert ml.written_end_index == 4  # offsets of the failed entry are free again
    again = await append(ml, 1)
    assert again[0].ledger_id > first[-1].ledger_id
    await ml.close()
    ml = open_ml(tmp_path, LedgerConfig())
    assert [e.first_index for e in ml.read_from_index(0, 1 << 20)] == [0, 2, 4]
    await ml.close()


async def test_a_failed_entry_never_comes_back_even_if_its_truncation_was_lost(tmp_path, monkeypatch):
    """A write reported as failed is truncated away, but the truncation is not fsynced before the client retries.
    If a power loss undid it, recovery must still drop the failed entry (the closed ledger's entry count in
    ledgers.info bounds it), or the retried batch would be stored twice."""
    from kop.ledger.ledger_file import LedgerFile

    saved = {}
    truncate = LedgerFile.truncate

    def remembering_truncate(self, entries):
        with open(os.path.join(str(tmp_path), f"{self.ledger_id}.log"), "rb") as f:
            saved[self.ledger_id] = f.read()
        truncate(self, entries)

    ml = open_ml(tmp_path, LedgerConfig())
    await append(ml, 2)
    ml.inject_write_failures(1)
    monkeypatch.setattr(LedgerFile, "truncate", remembering_truncate)
    with pytest.raises(LedgerWriteError):
        await ml.add_entry(ml.written_end_index, 2, b"", b"doomed")
    monkeypatch.setattr(LedgerFile, "truncate", truncate)
    await ml.add_entry(ml.written_end_index, 2, b"", b"retried")
    await ml.close()
    (ledger_id, content), = saved.items()
    with open(os.path.join(str(tmp_path), f"{ledger_id}.log"), "wb") as f:
        f.write(content)  # the failed entry is back on disk, as if the truncation had been lost
    ml = open_ml(tmp_path, LedgerConfig())
    entries = ml.read_from_index(0, 1 << 20)
    assert [e.first_index for e in entries] == [0, 2, 4]
    assert entries[-1].data == b"retried"
    await ml.close()


async def test_a_write_torn_by_eio_is_cut_off_its_file_and_the_next_write_goes_on(tmp_path, monkeypatch):
    """The append_failures failpoint: half the record reaches the file, then EIO. The entry fails, the half record
    is cut off (the file ends where the entries before it do), and the next write lands in a new ledger."""
    from kop.ledger import framed_file, ledger_file

    sizes = []  # (where the record starts, the file's size once the torn write is made, its size after the append)
    append_at, write_all_at = ledger_file.append_at, framed_file.write_all_at

    def measuring_write_all_at(fd, data, pos):
        write_all_at(fd, data, pos)
        sizes.append(os.fstat(fd).st_size)

    def measuring_append_at(fd, data, pos, torn_at=None):
        try:
            append_at(fd, data, pos, torn_at)
        finally:
            sizes[:] = [(pos, sizes[0] if sizes else None, os.fstat(fd).st_size)]

    ml = open_ml(tmp_path, LedgerConfig())
    first = await append(ml, 2)
    ml.inject_append_failures(1)
    monkeypatch.setattr(ledger_file, "append_at", measuring_append_at)
    monkeypatch.setattr(framed_file, "write_all_at", measuring_write_all_at)
    with pytest.raises(LedgerWriteError):
        await ml.add_entry(ml.written_end_index, 2, b"", b"doomed" * 100)
    monkeypatch.undo()
    (pos, torn_size, size_after), = sizes
    assert torn_size > pos  # the control: part of the record reached the file
    assert size_after == pos  # and was cut back off
    again = await ml.add_entry(ml.written_end_index, 2, b"", b"retried")
    assert again.ledger_id > first[-1].ledger_id
    await ml.close()
    ml = open_ml(tmp_path, LedgerConfig())
    entries = ml.read_from_index(0, 1 << 20)
    assert [e.first_index for e in entries] == [0, 2, 4] and entries[-1].data == b"retried"
    await ml.close()


async def test_cursor_position_and_properties_are_one_atomic_record(tmp_path):
    ml = open_ml(tmp_path, LedgerConfig())
    positions = await append(ml, 4)
    cursor = ml.open_cursor("pulsar.dedup", BEFORE_FIRST)
    await cursor.mark_delete(positions[1], {"p1": 10})
    await cursor.mark_delete(positions[3], {"p1": 20, "p2": 5})
    await ml.close()
    # corrupt the latest record: recovery falls back to the previous consistent pair
    path = tmp_path / "cursors.log"
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.write_bytes(bytes(data))
    ml = open_ml(tmp_path, LedgerConfig())
    cursor = ml.cursors["pulsar.dedup"]
    assert cursor.mark_delete_position == positions[1]
    assert cursor.properties == {"p1": 10}
    await ml.close()


async def test_mark_delete_never_moves_backwards_or_past_the_last_confirmed_entry(tmp_path):
    ml = open_ml(tmp_path, LedgerConfig())
    positions = await append(ml, 3)
    cursor = ml.open_cursor("g", BEFORE_FIRST)
    await cursor.mark_delete(positions[2])
    with pytest.raises(InvalidMarkDeleteError):
        await cursor.mark_delete(positions[0])
    with pytest.raises(InvalidMarkDeleteError):
        await cursor.mark_delete(Position(positions[2].ledger_id, 99))
    await cursor.mark_delete(positions[2], {"same": 1})  # same position, new properties: allowed
    assert cursor.properties == {"same": 1}
    await ml.close()


async def test_cursor_log_compacts_and_keeps_latest_state(tmp_path, monkeypatch):
    import kop.ledger.cursor_log as cursor_log
    monkeypatch.setattr(cursor_log, "COMPACT_MIN_BYTES", 2000)

    ml = open_ml(tmp_path, LedgerConfig())
    positions = await append(ml, 1)
    cursors = [ml.open_cursor(f"group-{i}", BEFORE_FIRST) for i in range(3)]
    for round_ in range(200):
        await asyncio.gather(*(c.mark_delete(positions[0], {"round": round_}) for c in cursors))
    await ml.delete_cursor("group-2")
    await ml.close()
    assert (tmp_path / "cursors.log").stat().st_size < 2000 * 2
    ml = open_ml(tmp_path, LedgerConfig())
    assert sorted(ml.cursors) == ["group-0", "group-1"]
    assert ml.cursors["group-1"].properties == {"round": 199}
    await ml.close()


async def test_retention_deletes_whole_old_ledgers_but_not_what_a_cursor_needs(tmp_path):
    ml = open_ml(tmp_path)
    positions = await append(ml, 100)
    ledgers_before = len({p.ledger_id for p in positions})
    keep = positions[40]
    held = await ml.trim(now_ms=1 << 60, retention_ms=0, retention_bytes=-1, keep_from=keep)
    assert held.deleted > 0 and held.held_back
    assert ml.start_index <= 80  # offsets from the cursor's ledger on are still there
    assert ml.read_from_index(ml.start_index, 1 << 20)[0].position.ledger_id <= keep.ledger_id
    rest = await ml.trim(now_ms=1 << 60, retention_ms=0, retention_bytes=-1, keep_from=None)
    assert not rest.held_back
    # every ledger with entries went (the current one was rolled first, all of it past retention)
    assert held.deleted + rest.deleted == ledgers_before
    assert [l.entries for l in ml.internal_stats().ledgers] == [0]
    assert ml.start_index > 80
    assert ml.read_from_index(10, 100) == []
    await ml.close()


async def test_offsets_and_ledger_ids_keep_rising_after_retention_deleted_every_entry(tmp_path):
    """Retention may delete every ledger with entries; after a restart the log is empty but its next offset is
    where it was (Kafka keeps its log end offset), and new positions sort after every old one (cursors hold them)."""
    ml = open_ml(tmp_path)
    positions = await append(ml, 50)
    cursor = ml.open_cursor("c")
    await cursor.mark_delete(positions[-1])
    ml2_end = ml.confirmed_end_index
    ml._start_new_ledger()  # the ledger with the last entries closes, as on a restart
    await ml.trim(now_ms=1 << 60, retention_ms=0, retention_bytes=-1, keep_from=None)
    assert ml.read_from_index(ml2_end - 2, 1 << 20) == []
    await ml.close()
    ml = open_ml(tmp_path)
    assert (ml.start_index, ml.confirmed_end_index) == (ml2_end, ml2_end)
    assert ml.last_confirmed >= positions[-1]
    (after,) = await append(ml, 1)
    assert after > positions[-1]
    assert [e.first_index for e in ml.read_from_index(ml2_end, 1 << 20)] == [ml2_end]
    assert [e.position for e in ml.read_after(positions[-1], 10)] == [after]
    await ml.close()


async def test_delete_before_hides_records_durably_and_trim_removes_whole_ledgers_below(tmp_path):
    ml = open_ml(tmp_path)
    positions = await append(ml, 100)  # offsets 0..199, several ledgers
    assert await ml.delete_before(151) == 151
    assert await ml.delete_before(20) == 151  # never backwards
    assert ml.read_from_index(150, 1 << 20) == []
    assert ml.read_from_index(151, 1 << 20)[0].first_index == 150  # the entry holding 151
    keep = positions[10]
    held = await ml.trim(now_ms=0, retention_ms=-1, retention_bytes=-1, keep_from=keep)
    assert held.deleted == 0 and held.held_back  # a cursor needs them
    deleted = (await ml.trim(now_ms=0, retention_ms=-1, retention_bytes=-1, keep_from=None)).deleted
    assert deleted > 0 and ml.start_index == 151
    assert ml.internal_stats().ledgers[0].entries  # the ledger holding 150 stays
    assert await ml.delete_before(10_000) == 200  # at most the durable end
    await ml.close()
    ml = open_ml(tmp_path)
    assert (ml.start_index, ml.confirmed_end_index) == (200, 200)
    assert ml.read_from_index(199, 1 << 20) == []
    (after,) = await append(ml, 1)
    assert ml.read_from_index(200, 1 << 20)[0].position == after
    await ml.close()


async def test_a_read_crossing_into_the_next_ledger_stays_within_the_byte_limit(tmp_path):
    """Only a response's first entry may exceed the limit (KIP-74): not the first entry of the next ledger."""
    ml = open_ml(tmp_path, LedgerConfig(max_ledger_bytes=1000))
    positions = await append(ml, 6, size=400)  # three entries per ledger
    last_of_first = max(i for i, p in enumerate(positions) if p.ledger_id == positions[0].ledger_id)
    start = 2 * last_of_first
    entries = ml.read_from_index(start, 500)
    assert [e.first_index for e in entries] == [start]
    assert sum(len(e.data) for e in entries) == 400
    assert len(ml.read_from_index(start, 900)) == 2  # both fit (with their framing): the next ledger's first too
    assert len(ml.read_from_index(start, 1)) == 1  # the first entry always comes, whatever the limit
    await ml.close()


async def test_retention_by_size_deletes_the_oldest_ledgers_beyond_retention_bytes(tmp_path):
    ml = open_ml(tmp_path, LedgerConfig(max_ledger_bytes=1000))
    await append(ml, 30, size=400)  # ~12 KB in ten ledgers of three entries
    sizes = [l.size for l in ml.internal_stats().ledgers if l.entries]
    assert len(sizes) >= 10
    limit = 3000
    deleted = (await ml.trim(now_ms=0, retention_ms=-1, retention_bytes=limit, keep_from=None)).deleted
    remaining = [l.size for l in ml.internal_stats().ledgers if l.entries]
    assert deleted == len(sizes) - len(remaining) > 0
    # Kafka's rule: delete the oldest while what remains without it is still at least retention.bytes
    assert sum(remaining) - remaining[0] < limit <= sum(remaining)
    assert ml.start_index == ml.read_from_index(ml.start_index, 1)[0].first_index > 0
    assert ml.confirmed_end_index == 60
    assert (await ml.trim(now_ms=0, retention_ms=-1, retention_bytes=limit, keep_from=None)).deleted == 0
    assert (await ml.trim(now_ms=0, retention_ms=-1, retention_bytes=-1, keep_from=None)).deleted == 0  # no limit
    await ml.close()
    ml = open_ml(tmp_path, LedgerConfig(max_ledger_bytes=1000))
    assert [l.size for l in ml.internal_stats().ledgers if l.entries] == remaining
    await ml.close()


async def test_an_idle_current_ledger_is_rolled_by_age_so_retention_reaches_it(tmp_path):
    """A quiet topic never fills its ledger: trim closes it once it is older than the roll time (segment.ms), and
    retention then deletes it; offsets go on from where they were."""
    ml = open_ml(tmp_path, LedgerConfig())  # 256 MB ledgers: never full here
    ml.set_rollover(256 * 1024 * 1024, 60_000)
    await append(ml, 3)
    now = int(time.time() * 1000)
    assert (await ml.trim(now_ms=now, retention_ms=3_600_000, retention_bytes=-1,
                          keep_from=None)).deleted == 0
    assert len(ml.internal_stats().ledgers) == 1  # younger than a minute: still the current one
    later = now + 120_000
    assert (await ml.trim(now_ms=later, retention_ms=3_600_000, retention_bytes=-1,
                          keep_from=None)).deleted == 0
    stats = ml.internal_stats()
    assert [l.entries for l in stats.ledgers] == [3, 0]  # rolled, kept: within retention
    assert stats.current_ledger_id == stats.ledgers[1].ledger_id
    assert (await ml.trim(now_ms=later + 3_600_000, retention_ms=3_600_000, retention_bytes=-1,
                          keep_from=None)).deleted == 1
    assert (ml.start_index, ml.confirmed_end_index) == (6, 6)
    (after,) = await append(ml, 1)
    assert ml.read_from_index(6, 1 << 20)[0].position == after
    await ml.close()


async def test_a_current_ledger_wholly_past_retention_is_rolled_and_deleted(tmp_path):
    """As Kafka rolls its active segment when retention must delete it: retention.ms below the roll time works."""
    ml = open_ml(tmp_path, LedgerConfig())
    await append(ml, 3)
    now = int(time.time() * 1000)
    early, due = now + 10_000, now + 120_000
    assert (await ml.trim(now_ms=early, retention_ms=60_000, retention_bytes=-1, keep_from=None)).deleted == 0
    assert (await ml.trim(now_ms=due, retention_ms=60_000, retention_bytes=-1, keep_from=None)).deleted == 1
    assert (ml.start_index, ml.confirmed_end_index) == (6, 6)
    await ml.close()


async def test_rollover_limits_change_at_run_time_and_age_rolls_at_the_next_append(tmp_path):
    ml = open_ml(tmp_path, LedgerConfig())
    positions = await append(ml, 4, size=400)
    assert len({p.ledger_id for p in positions}) == 1
    ml.set_rollover(1000, 7 * 24 * 3600 * 1000)  # segment.bytes lowered by AlterConfigs
    positions = await append(ml, 4, size=400)
    assert len({p.ledger_id for p in positions}) > 1
    ml.set_rollover(1 << 30, 1)  # segment.ms=1: every append finds its ledger a millisecond old or more
    first = (await append(ml, 1))[0]
    time.sleep(0.002)
    second = (await append(ml, 1))[0]
    assert second.ledger_id > first.ledger_id
    await ml.close()


async def test_unlisted_ledger_files_are_removed_on_open(tmp_path):
    ml = open_ml(tmp_path)
    await append(ml, 3)
    await ml.close()
    (tmp_path / "77.log").write_bytes(b"stale")  # a ledger created just before a crash, never listed
    (tmp_path / "77.idx").write_bytes(b"")
    ml = open_ml(tmp_path)
    assert not (tmp_path / "77.log").exists() and not (tmp_path / "77.idx").exists()
    assert [e.first_index for e in ml.read_from_index(0, 1 << 20)] == [0, 2, 4]
    await ml.close()


async def test_new_directories_and_ledger_files_are_fsynced_into_their_parents(tmp_path, monkeypatch):
    """A file or directory exists after a power loss only once its parent directory was fsynced after its
    creation: the managed-ledger directory (and its missing parents) and each new ledger file."""
    from kop.ledger import framed_file
    synced = []
    real = framed_file.fsync_dir

    def recording(path):
        synced.append((os.path.abspath(path), sorted(os.listdir(path))))
        real(path)
    monkeypatch.setattr(framed_file, "fsync_dir", recording)

    directory = tmp_path / "ns" / "t-partition-0"
    ml = open_ml(directory)
    assert (str(tmp_path), ["ns"]) in synced
    assert (str(tmp_path / "ns"), ["t-partition-0"]) in synced
    first_ledger = ml.internal_stats().current_ledger_id
    assert any(path == str(directory) and f"{first_ledger}.log" in names for path, names in synced)
    synced.clear()
    ml._start_new_ledger()
    rolled = ml.internal_stats().current_ledger_id
    assert any(path == str(directory) and f"{rolled}.log" in names for path, names in synced)
    await ml.close()


async def test_a_closed_ledgers_transaction_index_is_stored_beside_it_read_back_and_deleted_with_it(tmp_path):
    ml = open_ml(tmp_path)
    positions = await append(ml, 100)
    first, current = positions[0].ledger_id, positions[-1].ledger_id
    assert first < current and ml.txn_indexed_ledgers() == []
    with pytest.raises(ValueError):
        await ml.write_txn_index(current, b"open")  # only a closed ledger gets one
    ml.inject_txn_index_write_failures(1)
    with pytest.raises(OSError):
        await ml.write_txn_index(first, b"index")
    assert await ml.read_txn_index(first) is None
    await ml.write_txn_index(first, b"index")
    assert (tmp_path / f"{first}.txnindex").read_bytes() == b"index"
    assert await ml.read_txn_index(first) == b"index" and ml.txn_indexed_ledgers() == [first]
    await ml.close()

    (tmp_path / f"{current}.txnindex.tmp").write_bytes(b"cut short")  # a write a crash interrupted
    (tmp_path / "999.txnindex").write_bytes(b"unlisted")
    ml = open_ml(tmp_path)
    assert ml.txn_indexed_ledgers() == [first] and await ml.read_txn_index(first) == b"index"
    assert sorted(p.name for p in tmp_path.glob("*.txnindex*")) == [f"{first}.txnindex"]
    assert (await ml.trim(int(time.time() * 1000), 0, -1, None)).deleted > 0  # retention takes the ledger
    assert ml.txn_indexed_ledgers() == [] and await ml.read_txn_index(first) is None
    assert not (tmp_path / f"{first}.txnindex").exists()
    await ml.close()


async def test_a_requested_roll_starts_a_new_ledger_at_the_next_append(tmp_path):
    ml = open_ml(tmp_path, LedgerConfig())
    ml.request_roll()  # the current ledger is empty: nothing to roll
    first = (await append(ml, 2))[0].ledger_id
    ml.request_roll()
    second = (await append(ml, 2))[0].ledger_id
    assert second == first + 1
    assert (await append(ml, 1))[0].ledger_id == second  # once
    await ml.close()
