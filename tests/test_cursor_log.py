"""The cursor log under damage and during compaction: a torn tail, a damaged newest record, damage in the middle, a
lost dedup cursor, compaction off the event loop and compaction that fails half way.

Each test drives a real FileManagedLedger (or its CursorLog) on a temporary directory and damages the file as a crash
or a bad sector would, then reopens it.
"""
import asyncio
import os
import struct
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

import kop.ledger.cursor_log as cursor_log
from kop.dedup_storage import LedgerDedupStorage
from kop.ledger import BEFORE_FIRST, LedgerConfig, FileManagedLedger, Position
from kop.ledger.cursor_scan import MARKER_NAME, recover
from kop.ledger.file_pool import FilePool
from proto.kop_pb2 import ManagedCursorInfo, MessageMetadata

DEDUP = "pulsar.dedup"
HEADER = struct.Struct(">II")


def open_ml(path, fsync=True, executor=None):
    return FileManagedLedger.open("t", str(path), LedgerConfig(fsync=fsync), executor)


async def append(ml, count):
    futures = []
    for _ in range(count):
        first = ml.written_end_index
        futures.append(ml.add_entry(first, 1, MessageMetadata(producer_name="p").SerializeToString(), b"x" * 10))
    return await asyncio.gather(*futures)


async def commit_many(ml, position, count=200):
    """Commit `count` offsets of group "g" one after the other: enough records to make the log compact."""
    group = ml.open_cursor("g", BEFORE_FIRST)
    for i in range(count):
        await group.mark_delete(position, {"o": i})
    return group


def records(path) -> list[tuple[int, int, ManagedCursorInfo]]:
    """(offset, framed length, record) of every record of a clean cursor log."""
    data = open(path, "rb").read()
    out, pos = [], 0
    while pos < len(data):
        length, _crc = HEADER.unpack_from(data, pos)
        info = ManagedCursorInfo()
        info.ParseFromString(data[pos + 8:pos + 8 + length])
        out.append((pos, 8 + length, info))
        pos += 8 + length
    return out


def newest_record_of(path, name) -> tuple[int, int]:
    return [(offset, size) for offset, size, info in records(path) if info.name == name][-1]


def flip_byte(path, offset) -> None:
    data = bytearray(open(path, "rb").read())
    data[offset] ^= 0xFF
    open(path, "wb").write(bytes(data))


def state(ml, name):
    cursor = ml.cursors[name]
    return cursor.mark_delete_position, cursor.properties


# ---- damage at the end


@pytest.mark.parametrize("cut", [1, 5, 8, 12])
async def test_torn_tail_recovers_each_cursors_previous_consistent_record(tmp_path, cut):
    ml = open_ml(tmp_path)
    positions = await append(ml, 4)
    a, b = ml.open_cursor("a", BEFORE_FIRST), ml.open_cursor(DEDUP, BEFORE_FIRST)
    await a.mark_delete(positions[0], {"n": 1})
    await b.mark_delete(positions[1], {"p": 10})
    await a.mark_delete(positions[2], {"n": 2})
    await b.mark_delete(positions[3], {"p": 20})  # the record the crash tears
    await ml.close()
    path = tmp_path / "cursors.log"
    size = path.stat().st_size
    os.truncate(path, size - cut)
    ml = open_ml(tmp_path)
    assert state(ml, "a") == (positions[2], {"n": 2})
    assert state(ml, DEDUP) == (positions[1], {"p": 10})
    # the log keeps working after the torn tail: a new record lands and survives a reopen
    await ml.cursors[DEDUP].mark_delete(positions[3], {"p": 30})
    await ml.close()
    ml = open_ml(tmp_path)
    assert state(ml, DEDUP) == (positions[3], {"p": 30})
    assert state(ml, "a") == (positions[2], {"n": 2})
    await ml.close()


async def test_garbage_after_the_last_record_is_replaced_by_a_marker(tmp_path):
    ml = open_ml(tmp_path)
    positions = await append(ml, 2)
    await ml.open_cursor("g", BEFORE_FIRST).mark_delete(positions[1], {"o": 2})
    await ml.close()
    path = tmp_path / "cursors.log"
    with open(path, "ab") as f:
        f.write(b"\x00\x00\x00\x10garbage-garbage!")
    ml = open_ml(tmp_path)
    assert state(ml, "g") == (positions[1], {"o": 2})
    await ml.close()
    names = [info.name for _, _, info in records(path)]  # the file is clean records again
    assert names == ["g", MARKER_NAME]


# ---- a damaged newest record


async def test_damaged_newest_record_falls_back_to_the_previous_one_kept_through_compaction(tmp_path, monkeypatch):
    monkeypatch.setattr(cursor_log, "COMPACT_MIN_BYTES", 2000)

    ml = open_ml(tmp_path)
    positions = await append(ml, 100)
    dedup, group = ml.open_cursor(DEDUP, BEFORE_FIRST), ml.open_cursor("g", BEFORE_FIRST)
    path = tmp_path / "cursors.log"
    inode = path.stat().st_ino
    for i, position in enumerate(positions):
        await dedup.mark_delete(position, {"producer": i})
        await group.mark_delete(position, {"offset": i})
        if path.stat().st_ino != inode:
            break  # the compacted file replaced the log: stop while it holds only what compaction kept
    for _ in range(100):  # a compaction still running (its fsyncs are slow on a loaded machine) may finish
        if path.stat().st_ino != inode:
            break
        await asyncio.sleep(0.05)
    await ml.close()
    assert path.stat().st_ino != inode, "no compaction"
    compacted = records(path)[:4]
    assert [info.name for _, _, info in compacted] == [DEDUP, DEDUP, "g", "g"]  # two records of each cursor
    # Keep only what the compaction wrote (drop the records carried over or appended after it), then damage
    # the newest dedup record: the one compaction kept before it is the fallback.
    offset, size, newest = compacted[1]
    os.truncate(path, compacted[-1][0] + compacted[-1][1])
    flip_byte(path, offset + size - 1)
    ml = open_ml(tmp_path)
    previous = newest.position.properties[0].value - 1
    assert state(ml, DEDUP) == (positions[previous], {"producer": previous})  # consistent, not empty
    await ml.close()


async def test_retention_floor_of_a_cursor_is_its_older_kept_record(tmp_path):
    ml = open_ml(tmp_path)
    positions = await append(ml, 3)
    dedup = ml.open_cursor(DEDUP, BEFORE_FIRST)
    await dedup.mark_delete(positions[0], {"p": 0})
    assert dedup.recovery_floor == positions[0]
    await dedup.mark_delete(positions[1], {"p": 1})
    await dedup.mark_delete(positions[2], {"p": 2})
    assert dedup.recovery_floor == positions[1]  # a damaged newest record falls back there
    await ml.close()
    ml = open_ml(tmp_path)
    assert ml.cursors[DEDUP].recovery_floor == positions[1]
    await ml.close()


# ---- damage in the middle


@pytest.mark.parametrize("where", ["length", "crc", "payload"])
async def test_damage_in_the_middle_keeps_the_intact_records_after_it(tmp_path, where):
    ml = open_ml(tmp_path)
    positions = await append(ml, 4)
    a, b, c = (ml.open_cursor(n, BEFORE_FIRST) for n in ("a", "b", DEDUP))
    await a.mark_delete(positions[0], {"a": 0})
    await b.mark_delete(positions[0], {"b": 0})
    await c.mark_delete(positions[0], {"c": 0})
    await a.mark_delete(positions[1], {"a": 1})  # the record the bad sector hits
    await b.mark_delete(positions[2], {"b": 2})
    await c.mark_delete(positions[3], {"c": 3})
    await ml.close()
    path = tmp_path / "cursors.log"
    offset, size = records(path)[3][:2]
    flip_byte(path, {"length": offset + 1, "crc": offset + 5, "payload": offset + size - 2}[where])
    ml = open_ml(tmp_path)
    assert state(ml, "a") == (positions[0], {"a": 0})  # falls back
    assert state(ml, "b") == (positions[2], {"b": 2})  # after the damage: kept
    assert state(ml, DEDUP) == (positions[3], {"c": 3})
    # new records land after the damaged one and win on the next open
    await ml.cursors["a"].mark_delete(positions[3], {"a": 3})
    await ml.close()
    ml = open_ml(tmp_path)
    assert state(ml, "a") == (positions[3], {"a": 3})
    assert state(ml, "b") == (positions[2], {"b": 2})
    await ml.close()


def test_a_record_shaped_string_inside_a_damaged_record_is_not_taken_for_a_record():
    inner = ManagedCursorInfo(name=DEDUP, deleted=True).SerializeToString()
    import crc32c
    fake = HEADER.pack(len(inner), crc32c.crc32c(inner)) + inner
    outer = ManagedCursorInfo(name="g")
    outer.position.ledgerId, outer.position.entryId = 1, 1
    outer.position.string_properties.add(name="kafka.metadata", value=fake.decode("latin-1"))
    follower = ManagedCursorInfo(name="h", deleted=True).SerializeToString()
    payload = outer.SerializeToString()
    data = bytearray(HEADER.pack(len(payload), crc32c.crc32c(payload)) + payload)
    data[0] = 0x7F  # the length field is damaged
    data += b"\x01\x02\x03"  # and what follows the fake record is not a record either
    data += HEADER.pack(len(follower), crc32c.crc32c(follower)) + follower
    recovered = recover(bytes(data))
    assert DEDUP not in recovered.known_deleted and recovered.damaged


# ---- a lost dedup cursor


async def test_dedup_cursor_lost_to_damage_restarts_before_the_first_entry_and_replays_everything(tmp_path):
    ml = open_ml(tmp_path)
    storage = LedgerDedupStorage(ml)
    cursor = await storage.open_cursor(DEDUP)  # runtime enable on an empty log
    positions = await append(ml, 5)
    await ml.open_cursor("g", BEFORE_FIRST).mark_delete(positions[4], {"o": 5})
    await ml.close()
    path = tmp_path / "cursors.log"
    offset, _size = newest_record_of(path, DEDUP)  # its only record
    flip_byte(path, offset + 1)  # the length field: the scan must resynchronise to find "g"
    ml = open_ml(tmp_path)
    assert DEDUP not in ml.cursors
    assert state(ml, "g") == (positions[4], {"o": 5})
    cursor = await LedgerDedupStorage(ml).open_cursor(DEDUP)
    assert (cursor.mark_delete_position, cursor.properties) == (BEFORE_FIRST, {})  # never the end
    replayed = [e.position async for e in LedgerDedupStorage(ml).replay_after(cursor.mark_delete_position)]
    assert replayed == positions
    await ml.close()
    ml = open_ml(tmp_path)  # the choice is durable
    assert ml.cursors[DEDUP].mark_delete_position == BEFORE_FIRST
    await ml.close()


async def test_dedup_cursor_that_never_existed_starts_at_the_end(tmp_path):
    ml = open_ml(tmp_path)
    positions = await append(ml, 3)
    cursor = await LedgerDedupStorage(ml).open_cursor(DEDUP)
    assert (cursor.mark_delete_position, cursor.properties) == (positions[-1], {})
    await ml.close()


async def test_the_loss_is_remembered_across_restarts_and_compaction(tmp_path, monkeypatch):
    monkeypatch.setattr(cursor_log, "COMPACT_MIN_BYTES", 2000)

    ml = open_ml(tmp_path)
    positions = await append(ml, 2)
    await ml.open_cursor(DEDUP, BEFORE_FIRST).mark_delete(positions[1], {"p": 1})
    await ml.close()
    path = tmp_path / "cursors.log"
    os.truncate(path, path.stat().st_size - 3)  # dedup's only record is torn: the damage is at the end
    ml = open_ml(tmp_path)
    await commit_many(ml, positions[1])  # compacts the marker's old file away
    await ml.close()
    assert len(records(path)) < 200, "no compaction"
    await open_ml(tmp_path).close()  # a restart that does not touch the dedup cursor
    ml = open_ml(tmp_path)
    cursor = await LedgerDedupStorage(ml).open_cursor(DEDUP)
    assert cursor.mark_delete_position == BEFORE_FIRST
    await ml.delete_cursor(DEDUP)  # then a runtime disable ...
    await ml.close()
    # ... deleted after the damage: a later enable is a new cursor, at the end
    ml = open_ml(tmp_path)
    assert (await LedgerDedupStorage(ml).open_cursor(DEDUP)).mark_delete_position == positions[1]
    await ml.close()


async def test_disabling_dedup_whose_cursor_was_lost_records_the_deletion(tmp_path):
    ml = open_ml(tmp_path)
    positions = await append(ml, 2)
    await ml.open_cursor(DEDUP, BEFORE_FIRST).mark_delete(positions[0], {"p": 0})
    await ml.close()
    path = tmp_path / "cursors.log"
    flip_byte(path, path.stat().st_size - 1)
    ml = open_ml(tmp_path)
    await LedgerDedupStorage(ml).delete_cursor(DEDUP)  # dedup disabled while it was down: not an error
    await ml.close()
    ml = open_ml(tmp_path)
    assert (await LedgerDedupStorage(ml).open_cursor(DEDUP)).mark_delete_position == positions[1]
    await ml.close()


# ---- compaction


@pytest.fixture
def blocked_compaction(monkeypatch):
    """(started, release): a compaction's rewrite sets `started` in its worker thread, then waits for `release`."""
    monkeypatch.setattr(cursor_log, "COMPACT_MIN_BYTES", 2000)
    started, release = threading.Event(), threading.Event()
    write_new_file = cursor_log._write_new_file

    def blocked_write_new_file(*args):
        started.set()
        assert release.wait(30), "the test never released the compaction"
        return write_new_file(*args)

    monkeypatch.setattr(cursor_log, "_write_new_file", blocked_write_new_file)
    yield started, release
    release.set()


async def test_compaction_runs_off_the_loop_while_new_records_land_in_order(tmp_path, blocked_compaction):
    started, release = blocked_compaction

    executor = ThreadPoolExecutor(2)
    ml = open_ml(tmp_path, executor=executor)
    positions = await append(ml, 2)
    group = ml.open_cursor("g", BEFORE_FIRST)
    for i in range(100):
        if started.is_set():
            break
        await group.mark_delete(positions[0], {"o": i})
    assert started.is_set(), "no compaction started"
    # The rewrite is blocked in its worker thread; commits still complete, on the old file.
    for i in range(100, 110):
        await group.mark_delete(positions[1], {"o": i})
    await ml.open_cursor("h", BEFORE_FIRST).mark_delete(positions[1], {"o": -1})
    release.set()
    await group.mark_delete(positions[1], {"o": 110})
    await ml.close()
    executor.shutdown()
    assert (tmp_path / "cursors.log").stat().st_size < 2000
    ml = open_ml(tmp_path)
    assert state(ml, "g") == (positions[1], {"o": 110})
    assert state(ml, "h") == (positions[1], {"o": -1})
    await ml.close()


@pytest.mark.parametrize("failing", ["write", "replace"])
async def test_compaction_failing_before_the_replace_keeps_the_old_file_live(tmp_path, monkeypatch, failing):
    monkeypatch.setattr(cursor_log, "COMPACT_MIN_BYTES", 2000)
    failures = []

    def fail(*args):
        failures.append(args)
        raise OSError(28, "injected: no space left")

    monkeypatch.setattr(cursor_log, {"write": "_write_new_file", "replace": "_finish_new_file"}[failing], fail)

    ml = open_ml(tmp_path)
    positions = await append(ml, 1)
    await commit_many(ml, positions[0])
    await ml.close()
    assert failures, "no compaction was attempted"
    assert not (tmp_path / "cursors.log.tmp").exists()
    ml = open_ml(tmp_path)
    assert state(ml, "g") == (positions[0], {"o": 199})
    await ml.close()


async def test_compaction_failing_after_the_replace_never_acknowledges_into_the_old_file(tmp_path, monkeypatch):
    """The directory fsync after the replace fails: records held during the switch fail (not acknowledged), the
    next record retries the switch, and every acknowledged record is in the live file on reopen."""
    monkeypatch.setattr(cursor_log, "COMPACT_MIN_BYTES", 2000)
    dir_syncs = {"calls": 0, "fail": 0}
    real_fsync_dir = cursor_log.fsync_dir

    def flaky_fsync_dir(path):
        dir_syncs["calls"] += 1
        if dir_syncs["fail"] > 0:
            dir_syncs["fail"] -= 1
            raise OSError(5, "injected: directory fsync failed")
        real_fsync_dir(path)

    monkeypatch.setattr(cursor_log, "fsync_dir", flaky_fsync_dir)

    ml = open_ml(tmp_path)
    positions = await append(ml, 1)
    group = ml.open_cursor("g", BEFORE_FIRST)
    dir_syncs["fail"] = 2  # the compaction's switch, then the first retry
    acknowledged, failed = [], 0
    for i in range(200):
        try:
            await group.mark_delete(positions[0], {"o": i})
            acknowledged.append(i)
        except OSError:
            failed += 1
    await ml.close()
    assert dir_syncs["fail"] == 0 and failed >= 1, (dir_syncs, failed)
    assert acknowledged[-1] == 199
    ml = open_ml(tmp_path)
    assert state(ml, "g") == (positions[0], {"o": 199})
    await ml.close()
    assert len(records(tmp_path / "cursors.log")) < 200  # the compacted file is the live one


async def test_fsync_false_is_honoured_by_the_cursor_log_and_its_compaction(tmp_path, monkeypatch):
    monkeypatch.setattr(cursor_log, "COMPACT_MIN_BYTES", 2000)
    syncs = []
    monkeypatch.setattr(cursor_log, "fsync_dir", lambda path: syncs.append(("dir", path)))
    for name in ("fsync", "fdatasync"):
        real = getattr(os, name)
        monkeypatch.setattr(os, name, lambda fd, _real=real, _name=name: (syncs.append((_name, fd)), _real(fd)))

    ml = open_ml(tmp_path / "nosync", fsync=False)
    syncs.clear()  # the ledger's own files are not under test here
    path = tmp_path / "nosync" / "cursors.log"
    positions = await append(ml, 1)
    await commit_many(ml, positions[0])
    await ml.close()
    assert len(records(path)) < 200, "no compaction"
    assert syncs == []


async def test_creating_the_cursor_log_fsyncs_its_directory(tmp_path, monkeypatch):
    synced = []
    monkeypatch.setattr(cursor_log, "fsync_dir", synced.append)
    path = str(tmp_path / "cursors.log")
    log_ = cursor_log.CursorLog(path, None, True, lambda: BEFORE_FIRST)
    log_.open()
    assert synced == [str(tmp_path)]
    await log_.close()
    log_ = cursor_log.CursorLog(path, None, True, lambda: BEFORE_FIRST)
    log_.open()  # it exists now: nothing to make durable
    assert synced == [str(tmp_path)]
    await log_.close()


async def test_closing_waits_for_a_compaction_in_flight(tmp_path, blocked_compaction):
    started, release = blocked_compaction

    executor = ThreadPoolExecutor(2)
    ml = open_ml(tmp_path, executor=executor)
    positions = await append(ml, 1)
    group = ml.open_cursor("g", BEFORE_FIRST)
    for i in range(100):
        await group.mark_delete(positions[0], {"o": i})
        if started.is_set():
            break
    assert started.is_set(), "no compaction started"
    closing = asyncio.ensure_future(ml.close())
    for _ in range(20):
        await asyncio.sleep(0)
    assert not closing.done()  # held by the rewrite in its thread
    release.set()
    await closing
    executor.shutdown()
    assert not (tmp_path / "cursors.log.tmp").exists()
    ml = open_ml(tmp_path)
    assert state(ml, "g") == (positions[0], {"o": i})
    await ml.close()


async def test_positions_survive_compaction_unchanged(tmp_path, monkeypatch):
    monkeypatch.setattr(cursor_log, "COMPACT_MIN_BYTES", 2000)

    ml = open_ml(tmp_path)
    positions = await append(ml, 30)
    cursors = [ml.open_cursor(f"g{i}", BEFORE_FIRST) for i in range(3)]
    for position in positions:
        for i, cursor in enumerate(cursors):
            await cursor.mark_delete(position, {"i": i}, {"meta": f"{position}"})
    expected = {c.name: (c.mark_delete_position, c.properties, c.string_properties) for c in cursors}
    await ml.close()
    ml = open_ml(tmp_path)
    assert {c.name: (c.mark_delete_position, c.properties, c.string_properties)
            for c in ml.cursors.values()} == expected
    assert ml.cursors["g0"].recovery_floor == positions[-2]
    await ml.close()


async def test_recovery_floor_of_a_new_cursor_is_its_position(tmp_path):
    ml = open_ml(tmp_path)
    await append(ml, 2)
    cursor = ml.open_cursor("g", Position(0, 1))
    assert cursor.recovery_floor == Position(0, 1)
    await ml.close()


async def test_compaction_through_a_descriptor_pool_that_keeps_closing_the_log(tmp_path, monkeypatch):
    """Two managed ledgers share a pool of one descriptor, so every commit of one closes the other's cursor log:
    commits and compactions still land in order on the live file, and a reopen finds the last of each."""
    monkeypatch.setattr(cursor_log, "COMPACT_MIN_BYTES", 2000)
    pool = FilePool(capacity=1)
    config = LedgerConfig(fsync=True)
    a = FileManagedLedger.open("a", str(tmp_path / "a"), config, None, files=pool)
    b = FileManagedLedger.open("b", str(tmp_path / "b"), config, None, files=pool)
    pa, pb = (await append(a, 1))[0], (await append(b, 1))[0]
    ga, gb = a.open_cursor("g", BEFORE_FIRST), b.open_cursor("g", BEFORE_FIRST)
    opens_before = pool.opens
    for i in range(200):
        await ga.mark_delete(pa, {"o": i})
        await gb.mark_delete(pb, {"o": -i})
    assert pool.opens - opens_before >= 200, "the pool did not close and reopen the logs"
    # compacted (an inode number can come back, a size cannot): 200 records of each log would take ~12 KB
    assert (tmp_path / "a" / "cursors.log").stat().st_size < 4000, "no compaction"
    await a.close()
    await b.close()
    assert pool.open_count == 0
    a, b = open_ml(tmp_path / "a"), open_ml(tmp_path / "b")
    assert state(a, "g") == (pa, {"o": 199})
    assert state(b, "g") == (pb, {"o": -199})
    await a.close()
    await b.close()
