"""A full disk under the file managed ledger and its cursor log: a write that takes only part of a record leaves
nothing of it behind, and a failed write whose roll to a new ledger fails too (ledgers.info cannot be rewritten)
refuses writes with a retriable error until the roll succeeds, without losing or hiding what was acknowledged."""
import asyncio
import errno
import os

import pytest

from kop.ledger import LedgerConfig, FileManagedLedger, LedgerWriteError, Position
from kop.ledger import file_ledger, framed_file, ledger_file

CONFIG = LedgerConfig(max_ledger_bytes=1 << 20)
REAL_PWRITE = os.pwrite


def enospc(*_args, **_kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def half_then_enospc(patch) -> None:
    """os.pwrite and os.pwritev for a disk with room for half of the next write: it writes that half, then fails."""
    room = []

    def pwrite(fd: int, data, pos: int) -> int:
        if room:
            raise OSError(errno.ENOSPC, "No space left on device")
        room.append(len(data) // 2)
        return REAL_PWRITE(fd, memoryview(data)[: room[0]], pos)

    def pwritev(fd: int, parts, pos: int) -> int:
        return pwrite(fd, b"".join(parts), pos)
    patch.setattr(framed_file.os, "pwrite", pwrite)
    patch.setattr(framed_file.os, "pwritev", pwritev)


async def append(ml: FileManagedLedger, payload: bytes = b"x" * 100) -> asyncio.Future:
    return ml.add_entry(ml.written_end_index, 1, b"meta", payload)


async def test_an_entry_the_disk_took_half_of_leaves_nothing_behind(tmp_path, monkeypatch):
    ml = FileManagedLedger.open("t", str(tmp_path), CONFIG, None)
    assert await (await append(ml)) == Position(0, 0)
    ledger_id = ml.last_confirmed.ledger_id
    good = os.path.getsize(tmp_path / f"{ledger_id}.log")
    with monkeypatch.context() as patch:
        half_then_enospc(patch)
        patch.setattr(file_ledger, "replace_atomically", enospc)  # and the roll cannot list a new ledger
        failed = await append(ml, b"y" * 4000)
        with pytest.raises(LedgerWriteError):
            await failed
    assert os.path.getsize(tmp_path / f"{ledger_id}.log") == good  # no half entry after the acknowledged one
    await ml.close()
    reopened = FileManagedLedger.open("t", str(tmp_path), CONFIG, None)
    assert [e.first_index for e in reopened.read_from_index(0, 1 << 20)] == [0]
    await reopened.close()


async def test_writes_are_refused_until_the_roll_after_a_failed_write_succeeds(tmp_path, monkeypatch):
    ml = FileManagedLedger.open("t", str(tmp_path), CONFIG, None)
    assert await (await append(ml)) == Position(0, 0)
    with monkeypatch.context() as patch:
        half_then_enospc(patch)
        patch.setattr(file_ledger, "replace_atomically", enospc)
        with pytest.raises(LedgerWriteError):
            await (await append(ml))
        # Still full: ledgers.info cannot name a new ledger, so nothing may go into the one that failed.
        with pytest.raises(LedgerWriteError, match="cannot start a new ledger"):
            await append(ml)
        assert ml.confirmed_end_index == ml.written_end_index == 1
    assert sorted(os.listdir(tmp_path)) == ["0.idx", "0.log", "cursors.log", "ledgers.info"]  # no stray ledger
    resumed = await (await append(ml))  # space is back: a new ledger, without a restart
    assert resumed.ledger_id > 0 and ml.confirmed_end_index == 2
    await ml.close()
    reopened = FileManagedLedger.open("t", str(tmp_path), CONFIG, None)
    assert [e.first_index for e in reopened.read_from_index(0, 1 << 20)] == [0, 1]
    await reopened.close()


async def test_a_cursor_record_the_disk_took_half_of_does_not_read_as_damage_after_a_restart(tmp_path, monkeypatch,
                                                                                             caplog):
    ml = FileManagedLedger.open("t", str(tmp_path), CONFIG, None)
    await (await append(ml))
    cursor = ml.open_cursor("group")
    await cursor.mark_delete(Position(0, 0), {"offset": 1})
    with monkeypatch.context() as patch:
        half_then_enospc(patch)
        with pytest.raises(OSError):
            await cursor.mark_delete(Position(0, 0), {f"p{i}": i for i in range(200)})  # a big record
    await ml.close()
    reopened = FileManagedLedger.open("t", str(tmp_path), CONFIG, None)
    assert "damaged" not in caplog.text
    assert reopened.cursors["group"].properties == {"offset": 1}
    # Not taken for damage: a new cursor starts where it is asked to, not before the first entry.
    assert reopened.open_cursor("another", Position(0, 0)).mark_delete_position == Position(0, 0)
    await reopened.close()



def index_refused():
    """An os.pwrite for a disk whose log pages still have room but whose index file needs a new page."""
    def pwrite(fd: int, data, pos: int) -> int:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".idx"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return REAL_PWRITE(fd, data, pos)
    return pwrite


async def test_an_entry_whose_index_record_the_disk_refuses_is_answered_and_indexed_later(tmp_path, monkeypatch,
                                                                                          caplog):
    """The entry is durable (only its index record failed, written after the fsync and repaired at open): its write
    completes. Before, the error escaped the group commit and the write was never answered."""
    monkeypatch.setattr(ledger_file, "INDEX_EVERY", 1)  # index records after every flush, not every 64 entries
    ml = FileManagedLedger.open("t", str(tmp_path), CONFIG, None)
    assert await (await append(ml)) == Position(0, 0)
    idx = tmp_path / f"{ml.last_confirmed.ledger_id}.idx"
    with monkeypatch.context() as patch:
        patch.setattr(framed_file.os, "pwrite", index_refused())
        assert await asyncio.wait_for(await append(ml), 5) == Position(0, 1)
        assert ml.confirmed_end_index == 2
    assert "index not written" in caplog.text and os.path.getsize(idx) == 16  # the control: one index record
    assert await (await append(ml)) == Position(0, 2)
    assert os.path.getsize(idx) == 3 * 16  # the next write indexed the one left out
    assert [e.first_index for e in ml.read_from_index(0, 1 << 20)] == [0, 1, 2]
    await ml.close()
    reopened = FileManagedLedger.open("t", str(tmp_path), CONFIG, None)
    assert [e.first_index for e in reopened.read_from_index(0, 1 << 20)] == [0, 1, 2]
    await reopened.close()


async def test_a_failed_write_whose_entry_cannot_be_cut_off_still_fails_and_is_dropped_at_open(tmp_path, monkeypatch,
                                                                                             caplog):
    """The flush fails (EIO) and cutting the entry off the log fails too: the write is still failed (before, the error
    escaped the group commit and it was never answered), later writes go to a new ledger, and the entry is not
    served, now or after the ledger is opened again."""
    ml = FileManagedLedger.open("t", str(tmp_path), CONFIG, None)
    assert await (await append(ml)) == Position(0, 0)
    good = os.path.getsize(tmp_path / "0.log")
    ml.inject_write_failures(1)

    def ftruncate(fd: int, length: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    with monkeypatch.context() as patch:
        patch.setattr(framed_file.os, "ftruncate", ftruncate)
        failed = await append(ml, b"y" * 100)
        with pytest.raises(LedgerWriteError):
            await asyncio.wait_for(failed, 5)
    assert "cannot cut the failed entries off" in caplog.text  # the control: the cut was refused
    assert os.path.getsize(tmp_path / "0.log") > good  # the failed entry is still in the file
    assert await (await append(ml)) == Position(1, 0)
    assert [(e.first_index, bytes(e.data)) for e in ml.read_from_index(0, 1 << 20)] == [(0, b"x" * 100),
                                                                                        (1, b"x" * 100)]
    await ml.close()
    reopened = FileManagedLedger.open("t", str(tmp_path), CONFIG, None)
    assert [(e.first_index, bytes(e.data)) for e in reopened.read_from_index(0, 1 << 20)] == [(0, b"x" * 100),
                                                                                              (1, b"x" * 100)]
    await reopened.close()
