"""The bounded descriptor pool behind every ledger file, alone and under managed ledgers that outnumber it."""
import os

import pytest

from kop.ledger import LedgerConfig, FileManagedLedger
from kop.ledger.file_pool import FilePool


def test_the_pool_never_holds_more_than_its_capacity_and_reopens_on_use(tmp_path):
    pool = FilePool(capacity=2)
    files = []
    for i in range(5):
        f = pool.create(str(tmp_path / f"{i}.bin"))
        os.pwrite(f.fd(), b"file %d" % i, 0)
        files.append(f)
        assert pool.open_count <= 2
    assert [f.is_open for f in files] == [False, False, False, True, True]
    for i, f in enumerate(files):  # each closed one is opened again, not emptied
        assert os.pread(f.fd(), 16, 0) == b"file %d" % i
        assert pool.open_count <= 2
    assert pool.opens == 10  # reading 0, 1, 2 again closed 3 and 4 (least recently used) before their turn


def test_a_pinned_file_keeps_its_descriptor_and_a_close_waits_for_the_last_unpin(tmp_path):
    pool = FilePool(capacity=1)
    pinned = pool.create(str(tmp_path / "pinned"))
    fd = pinned.pin()
    others = [pool.create(str(tmp_path / f"other{i}")) for i in range(3)]
    for other in others:
        other.fd()
    assert pinned.fd() == fd and os.fstat(fd)  # never closed to make room
    assert pool.open_count == 2  # over capacity only by the pinned file
    pinned.close()
    assert pinned.is_open  # a write still waits on it
    pinned.unpin()
    assert not pinned.is_open
    with pytest.raises(ValueError):
        pinned.fd()


def test_reopening_never_empties_a_file(tmp_path):
    pool = FilePool(capacity=1)
    a = pool.create(str(tmp_path / "a"))
    os.pwrite(a.fd(), b"kept", 0)
    pool.create(str(tmp_path / "b")).fd()  # closes a
    assert not a.is_open
    assert os.pread(a.fd(), 4, 0) == b"kept"


async def test_many_managed_ledgers_share_a_small_pool_across_restarts(tmp_path):
    """Forty partitions, three ledgers each (one per open) and a cursor log, on a pool of eight descriptors: every
    entry and cursor move is made durable and read back, and the pool stays bounded (plus the files a pending fsync
    pins)."""
    config = LedgerConfig(fsync=True)
    pool = FilePool(capacity=8)
    names = [f"p{i}" for i in range(40)]
    for round_ in range(3):
        ledgers = [FileManagedLedger.open(n, str(tmp_path / n), config, None, files=pool) for n in names]
        futures = [ml.add_entry(ml.written_end_index, 1, b"", b"r%d-%s" % (round_, n.encode()))
                   for ml, n in zip(ledgers, names)]
        assert pool.open_count <= 8 + len(ledgers)  # pinned until their fsync
        for future in futures:
            await future
        assert pool.open_count <= 8
        for ml, n in zip(ledgers, names):
            assert [bytes(e.data) for e in ml.read_from_index(0, 1 << 20)] == \
                [b"r%d-%s" % (r, n.encode()) for r in range(round_ + 1)]
            cursor = ml.open_cursor("group")
            if round_:
                assert cursor.properties == {"round": round_ - 1}  # the cursor log came back through the pool too
            await cursor.mark_delete(ml.last_confirmed, {"round": round_})
        assert pool.open_count <= 8
        for ml in ledgers:
            await ml.close()
        assert pool.open_count == 0
    ledger_files = sum(name.endswith(".log") and name != "cursors.log"
                       for n in names for name in os.listdir(tmp_path / n))
    assert ledger_files >= 3 * len(names)  # far more ledgers than the pool could ever hold open
