"""The cleaner's rewrite of real ledger files: the latest record per key stays at its offset, every batch keeps its
producer fields and lastOffsetDelta (an emptied one stays, empty), compressed batches stay compressed, a committed
transaction's records are compacted and an aborted one's removed while an undecided one stays whole, markers stay,
tombstones go only past the horizon, and an installed rewrite survives a reopen while an unfinished one is
removed."""
import os

from kop.compaction.rewrite import CompactionJob, compact
from kop.ledger import LedgerConfig, FileManagedLedger
from protocol.compression import GZIP, NONE
from protocol.records import Record, build_batch, build_control_batch, iter_records, split_batches

CONFIG = LedgerConfig(max_ledger_bytes=1 << 20)
T0 = 1_700_000_000_000


def batch(first: int, items: list[tuple[bytes, bytes | None]], *, producer_id: int = -1, sequence: int = -1,
          compression: int = NONE, transactional: bool = False) -> bytes:
    records = [Record(offset=first + i, timestamp=T0 + first + i, key=k, value=v) for i, (k, v) in enumerate(items)]
    epoch = 0 if producer_id >= 0 else -1
    return build_batch(records, base_offset=first, producer_id=producer_id, producer_epoch=epoch,
                       base_sequence=sequence, compression=compression, transactional=transactional)


async def write(ml: FileManagedLedger, data: bytes) -> None:
    (header, _), = split_batches(data)
    await ml.add_entry(header.base_offset, header.last_offset_delta + 1, b"meta", data)


def job(ml: FileManagedLedger, horizon_ms: int) -> CompactionJob:
    return CompactionJob("t", "test", tuple(ml.closed_ledgers()), horizon_ms, CONFIG.max_entry_bytes, True)


def stored(ml: FileManagedLedger) -> list[tuple[int, bytes | None, bytes | None]]:
    return [(r.offset, r.key, r.value) for e in ml.read_from_index(0, 1 << 30) for r in iter_records(e.data)]


async def test_a_rewrite_keeps_offsets_producer_fields_and_the_latest_record_per_key(tmp_path):
    ml = FileManagedLedger.open("t", str(tmp_path), CONFIG, None)
    await write(ml, batch(0, [(b"a", b"a0"), (b"b", b"b0")], producer_id=7, sequence=0))
    await write(ml, batch(2, [(b"a", b"a1"), (b"c", b"c1"), (None, b"nokey")], producer_id=7, sequence=2,
                          compression=GZIP))
    await write(ml, batch(5, [(b"b", b"b2")], producer_id=9, sequence=0, transactional=True))
    await write(ml, batch(6, [(b"b", None), (b"c", b"c3")]))
    ml._start_new_ledger()  # close it: only closed ledgers are cleaned
    before = ml.read_from_index(0, 1 << 30)
    result = compact(job(ml, horizon_ms=0))  # tombstones stay: their ledger is younger than the horizon
    # the transactional batch's marker is not in the range: it is read but supersedes nothing, and stays whole
    assert (result.keys, result.records_read, result.records_removed) == (3, 8, 3)
    assert all(ml.install_compacted(r) for r in result.rewritten)
    assert stored(ml) == [(2, b"a", b"a1"), (4, None, b"nokey"), (5, b"b", b"b2"), (6, b"b", None), (7, b"c", b"c3")]
    after = ml.read_from_index(0, 1 << 30)
    assert [(e.position, e.first_index, e.span, e.metadata) for e in after] == \
        [(e.position, e.first_index, e.span, e.metadata) for e in before]
    headers = [split_batches(e.data)[0][0] for e in after]
    old = [split_batches(e.data)[0][0] for e in before]
    for new, was in zip(headers, old):
        assert (new.base_offset, new.last_offset_delta, new.producer_id, new.producer_epoch, new.base_sequence,
                new.max_timestamp) == (was.base_offset, was.last_offset_delta, was.producer_id, was.producer_epoch,
                                       was.base_sequence, was.max_timestamp)
    assert headers[0].records_count == 0 and headers[0].compression == NONE  # emptied, kept for its producer
    assert headers[1].compression == GZIP and headers[1].records_count == 2
    assert bytes(after[2].data) == bytes(before[2].data)  # transactional: whole
    await ml.close()
    ml = FileManagedLedger.open("t", str(tmp_path), CONFIG, None)  # the rewrite is what a reopen finds
    assert stored(ml)[-3:] == [(5, b"b", b"b2"), (6, b"b", None), (7, b"c", b"c3")]
    await ml.close()


async def test_tombstones_go_past_the_horizon_and_an_unfinished_rewrite_is_removed_at_open(tmp_path):
    ml = FileManagedLedger.open("t", str(tmp_path), CONFIG, None)
    await write(ml, batch(0, [(b"a", b"a0"), (b"a", None), (b"b", b"b0")]))
    ml._start_new_ledger()
    unfinished = compact(job(ml, horizon_ms=1 << 62))  # every closed ledger is past this horizon
    assert unfinished.tombstones_removed == 1
    (rewrite,) = unfinished.rewritten
    await ml.close()  # a crash before the install: the rewrite is on disk, not in place
    assert os.path.exists(rewrite.log_path)
    ml = FileManagedLedger.open("t", str(tmp_path), CONFIG, None)
    assert not os.path.exists(rewrite.log_path) and not os.path.exists(rewrite.idx_path)
    assert stored(ml) == [(0, b"a", b"a0"), (1, b"a", None), (2, b"b", b"b0")]  # the original, whole
    result = compact(job(ml, horizon_ms=1 << 62))
    assert all(ml.install_compacted(r) for r in result.rewritten)
    assert stored(ml) == [(2, b"b", b"b0")]
    await ml.close()


def marker(offset: int, producer_id: int, commit: bool) -> bytes:
    return build_control_batch(base_offset=offset, producer_id=producer_id, producer_epoch=0, commit=commit,
                               coordinator_epoch=0, timestamp_ms=T0 + offset)


async def test_transactions_are_compacted_once_decided_and_aborted_ones_removed(tmp_path):
    """Before, every transactional batch stayed whole: a transactionally written compacted topic (Kafka Streams'
    changelogs with exactly-once) never shrank."""
    ml = FileManagedLedger.open("t", str(tmp_path), CONFIG, None)
    await write(ml, batch(0, [(b"a", b"a0"), (b"b", b"b0")], producer_id=1, sequence=0, transactional=True))
    await write(ml, batch(2, [(b"x", b"aborted")], producer_id=2, sequence=0, transactional=True))
    await write(ml, marker(3, 1, commit=True))
    await write(ml, batch(4, [(b"a", b"a1")], producer_id=1, sequence=2, transactional=True))
    await write(ml, marker(5, 2, commit=False))
    await write(ml, marker(6, 1, commit=True))
    await write(ml, batch(7, [(b"b", b"open")], producer_id=3, sequence=0, transactional=True))  # no marker yet
    await write(ml, batch(8, [(b"x", b"x1")]))
    ml._start_new_ledger()
    result = compact(job(ml, horizon_ms=0))
    assert (result.keys, result.records_removed, result.aborted_removed) == (3, 2, 1)
    assert all(ml.install_compacted(r) for r in result.rewritten)
    # a0 superseded by the committed a1; the aborted x goes; b0 stays: the open transaction's b may still abort
    data = [(r.offset, r.key, r.value) for e in ml.read_from_index(0, 1 << 30)
            if not split_batches(e.data)[0][0].is_control for r in iter_records(e.data)]
    assert data == [(1, b"b", b"b0"), (4, b"a", b"a1"), (7, b"b", b"open"), (8, b"x", b"x1")]
    headers = [split_batches(e.data)[0][0] for e in ml.read_from_index(0, 1 << 30)]
    assert [(h.base_offset, h.is_transactional, h.is_control, h.records_count) for h in headers] == [
        (0, True, False, 1), (2, True, False, 0), (3, True, True, 1), (4, True, False, 1), (5, True, True, 1),
        (6, True, True, 1), (7, True, False, 1), (8, False, False, 1)]
    # a second pass once the open transaction aborts removes its record too
    await write(ml, marker(9, 3, commit=False))
    ml._start_new_ledger()
    again = compact(job(ml, horizon_ms=0))
    assert again.aborted_removed == 1


async def test_a_crash_between_the_logs_rename_and_the_index_and_list_updates_reads_the_rewrite(tmp_path):
    """The rename of the log is the commit point: a crash right after it leaves the rewrite under the original's
    index (positions of the longer, original entries) and a ledger list with the original's size. On reopen the index
    is checked against the log and rebuilt, so every reader gets the rewrite, entry by entry at its offsets, and a
    pass over it again finds nothing more to remove."""
    ml = FileManagedLedger.open("t", str(tmp_path), CONFIG, None)
    for n in range(4):  # key a superseded in each batch but the last; b only once
        await write(ml, batch(2 * n, [(b"a", b"a%d" % n + b"x" * 100), (b"b" if n == 0 else b"c%d" % n, b"v")]))
    ml._start_new_ledger()
    (ledger,) = ml.closed_ledgers()
    with open(ledger.idx_path, "rb") as f:
        original_index = f.read()
    (rewrite,) = compact(job(ml, horizon_ms=0)).rewritten
    assert rewrite.size < ledger.size
    await ml.close()
    os.replace(rewrite.log_path, ledger.log_path)  # the install's first step, then the crash
    with open(ledger.idx_path, "rb") as f:
        assert f.read() == original_index  # the control: the original index still names the original positions
    ml = FileManagedLedger.open("t", str(tmp_path), CONFIG, None)
    assert not os.path.exists(rewrite.idx_path)  # the unrenamed index is removed, never read
    expected = [(1, b"b", b"v"), (3, b"c1", b"v"), (5, b"c2", b"v"), (6, b"a", b"a3" + b"x" * 100), (7, b"c3", b"v")]
    assert stored(ml) == expected
    assert [e.first_index for e in ml.read_from_index(0, 1 << 30)] == [0, 2, 4, 6]
    again = compact(job(ml, horizon_ms=0))
    assert (again.records_removed, again.rewritten) == (0, [])
    await ml.close()
