"""Only a partition that a transaction ever added reads its stored batches at load to rebuild its open transactions
and aborted index; every other partition loads without reading its log."""
from dedup import DedupConfig
from kop.ledger import FileManagedLedger, LedgerConfig
from kop.partition import PartitionLog
from kop.transactions.partition_index import PartitionTransactions
from protocol.errors import ErrorCode
from protocol.records import Record, build_batch, split_batches


def open_partition(path, **config) -> PartitionLog:
    ledger = FileManagedLedger.open("t-0", str(path), LedgerConfig(**{"fsync": False, **config}), None)
    return PartitionLog("t", 0, ledger, DedupConfig())


def transactional_batch(first: int, count: int = 1):
    """(header, view) of producer 7's transactional batch of `count` records from sequence `first`."""
    records = [Record(offset=i, timestamp=1_700_000_000_000, key=None, value=b"v%d" % (first + i))
               for i in range(count)]
    return split_batches(build_batch(records, producer_id=7, producer_epoch=0, base_sequence=first,
                                     transactional=True))[0]


async def write_plain(partition: PartitionLog, count: int) -> None:
    for i in range(count):
        batch = build_batch([Record(offset=0, timestamp=1_700_000_000_000, key=None, value=b"v%d" % i)])
        assert (await partition.publish_normal(*split_batches(batch)[0])).error == ErrorCode.NONE


async def test_a_partition_no_transaction_added_is_not_read_at_load_and_one_added_is(tmp_path):
    partition = open_partition(tmp_path)
    await write_plain(partition, 5)
    await partition.ledger.close()

    partition = open_partition(tmp_path)
    assert not partition.may_hold_transactions
    assert await partition.load_transactions() == 0  # nothing read
    await partition.expect_transactions()
    await partition.ledger.close()

    partition = open_partition(tmp_path)
    assert partition.may_hold_transactions  # durable across the restart
    assert await partition.load_transactions() == 0  # the snapshot taken when transactions were enabled
    await partition.ledger.close()


async def test_a_partition_loads_its_transactions_from_the_last_snapshot_and_the_entries_after_it(tmp_path):
    """1,210 transactional entries (aborts among them, one transaction left open), then a crash (the ledger closed,
    not the partition): the load reads only the entries after the snapshot, and ends in the state a read of the
    whole log gives."""
    partition = open_partition(tmp_path)
    await partition.apply_dedup_policy(True)
    await partition.expect_transactions()
    for i in range(1210):
        assert (await partition.publish_normal(*transactional_batch(i))).error == ErrorCode.NONE
        if i % 100 == 99 and i < 1200:  # every 3rd transaction aborted; the last 10 records' one stays open
            assert (await partition.publish_control(7, 0, commit=i % 300 != 99)).error == ErrorCode.NONE
    expected = (dict(partition.transactions.open), await partition.transactions.indexes.listed())
    assert expected[0] and len(expected[1]) == 4  # control: an open transaction and aborted ones to restore
    await partition.transaction_snapshots.flush()  # the snapshot at the 1,000th entry is stored (and no later one)
    await partition.ledger.close()

    partition = open_partition(tmp_path)
    read = await partition.load_transactions()
    assert read == 1222 - 1000  # the entries after the snapshot (at the 1,000th) only
    assert (partition.transactions.open, await partition.transactions.indexes.listed()) == expected
    whole = PartitionTransactions(partition.ledger)
    assert await whole.load() == 1222  # the whole log, as without a snapshot
    assert (whole.open, await whole.indexes.listed()) == expected
    await partition.close()

    partition = open_partition(tmp_path)  # closed cleanly: its last snapshot is at its last entry
    assert await partition.load_transactions() == 0
    assert (partition.transactions.open, await partition.transactions.indexes.listed()) == expected
    await partition.close()


async def open_at_snapshot_then_committed(tmp_path) -> PartitionLog:
    """A partition whose snapshot (at the 1,000th entry) holds producer 7's transaction open, committed after it,
    followed by 5 plain entries; ledgers of 20 kB."""
    partition = open_partition(tmp_path, max_ledger_bytes=20_000)
    await partition.apply_dedup_policy(False)
    await partition.expect_transactions()
    for i in range(1000):
        assert (await partition.publish_normal(*transactional_batch(i))).error == ErrorCode.NONE
    await partition.transaction_snapshots.flush()  # the snapshot, with the transaction open, is stored
    assert partition.ledger.cursors["pulsar.transactions"].string_properties["txn.open"] == "7:0"
    assert (await partition.publish_control(7, 0, commit=True)).error == ErrorCode.NONE
    await write_plain(partition, 5)
    return partition


async def test_retention_keeps_the_entries_after_the_transaction_snapshot_until_its_own_snapshots_pass_them(
        tmp_path):
    """Every closed ledger is past retention, but a load replays the entries after the transaction snapshot (there
    the commit closes the transaction open in it): retention keeps them, snapshots again, and deletes them once both
    records the cursor keeps stand past them. After a restart the transaction stays ended."""
    partition = await open_at_snapshot_then_committed(tmp_path)
    end = partition.high_watermark
    await partition.enforce_retention(1 << 62, 1000, -1)
    assert partition.log_start_offset < end  # control: held back by the snapshot's records
    for _ in range(4):  # each pass snapshots again; the cursor keeps its last two records
        await partition.transaction_snapshots.flush()
        await partition.enforce_retention(1 << 62, 1000, -1)
    assert partition.log_start_offset == end and partition.last_stable_offset == end
    await partition.close()

    partition = open_partition(tmp_path, max_ledger_bytes=20_000)
    await partition.load_transactions()
    assert partition.transactions.open == {}
    assert partition.last_stable_offset == partition.high_watermark == end
    await partition.close()


async def test_a_transaction_open_at_a_snapshot_that_delete_records_passed_does_not_come_back_open(tmp_path):
    """DeleteRecords past the snapshot and the commit after it, then a crash: the load cannot read the commit (the
    entries after the snapshot are gone for readers), so the transaction, whose first batch went too, must not come
    back open: it would hold the LSO for ever."""
    partition = await open_at_snapshot_then_committed(tmp_path)
    end = partition.high_watermark
    assert await partition.ledger.delete_before(end) == end
    await partition.ledger.close()  # a crash: no snapshot at close

    partition = open_partition(tmp_path, max_ledger_bytes=20_000)
    assert await partition.load_transactions() == 0  # control: nothing after the snapshot is read
    assert partition.transactions.open == {}
    assert partition.last_stable_offset == partition.high_watermark == end
    await partition.close()


async def test_a_transactional_batch_that_waited_for_earlier_writes_is_refused_if_its_transaction_ended_meanwhile(
        tmp_path):
    """A batch overlapping writes in flight waits for them (PIP-6's Unknown) before it is judged again; if a marker
    of its producer was handed to the ledger meanwhile, its transaction is over and storing it after the marker would
    open one no one ends: INVALID_TXN_STATE (without the check, the judgement of its sequence alone answers)."""
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(2) as executor:
        ledger = FileManagedLedger.open("t-0", str(tmp_path), LedgerConfig(fsync=True), executor)
        partition = PartitionLog("t", 0, ledger, DedupConfig())
        await partition.apply_dedup_policy(True)
        await partition.expect_transactions()

        ledger.hold_flushes(True)
        in_flight = partition.publish_normal(*transactional_batch(0, 5))
        overlapping = partition.publish_normal(*transactional_batch(3, 4))  # not a retry of the one in flight: it waits
        marker = partition.publish_control(7, 0, commit=False)
        ledger.hold_flushes(False)
        assert (await in_flight).error == ErrorCode.NONE and (await marker).error == ErrorCode.NONE
        assert (await overlapping).error == ErrorCode.INVALID_TXN_STATE
        assert partition.transactions.open == {}
        await partition.close()


async def test_a_marker_of_an_earlier_coordinator_epoch_is_refused_also_after_a_restart(tmp_path):
    """In a cluster a transaction's markers carry the epoch of its state log shard's coordinator: once a later
    coordinator (epoch 3) has marked a producer's transaction here, a late marker of the one before (epoch 2), which
    could end the producer's next transaction, is refused: TRANSACTION_COORDINATOR_FENCED. The epochs are rebuilt from
    the stored markers, and from the snapshot after 1,000 entries."""
    partition = open_partition(tmp_path)
    await partition.apply_dedup_policy(True)
    await partition.expect_transactions()
    assert (await partition.publish_normal(*transactional_batch(0))).error == ErrorCode.NONE
    assert (await partition.publish_control(7, 0, commit=True, coordinator_epoch=2)).error == ErrorCode.NONE
    assert (await partition.publish_normal(*transactional_batch(1))).error == ErrorCode.NONE
    assert (await partition.publish_control(7, 0, commit=True, coordinator_epoch=3)).error == ErrorCode.NONE
    assert (await partition.publish_normal(*transactional_batch(2))).error == ErrorCode.NONE  # the next one, open
    late = await partition.publish_control(7, 0, commit=False, coordinator_epoch=2)
    assert late.error == ErrorCode.TRANSACTION_COORDINATOR_FENCED
    assert 7 in partition.transactions.open  # still open: the late marker did not end it
    await partition.close()

    partition = open_partition(tmp_path)
    await partition.load_transactions()
    assert partition.transactions.coordinator_epochs == {7: 3}
    assert (await partition.publish_control(7, 0, commit=False, coordinator_epoch=2)).error == \
        ErrorCode.TRANSACTION_COORDINATOR_FENCED
    assert (await partition.publish_control(7, 0, commit=True, coordinator_epoch=3)).error == ErrorCode.NONE
    for i in range(3, 1003):  # past a snapshot, which must carry the epochs too
        assert (await partition.publish_normal(*transactional_batch(i))).error == ErrorCode.NONE
    await partition.close()

    partition = open_partition(tmp_path)
    assert await partition.load_transactions() < 1000  # from the snapshot
    assert partition.transactions.coordinator_epochs == {7: 3}
    await partition.close()


async def test_a_marker_sent_again_with_nothing_written_since_is_stored_once_also_after_a_restart(tmp_path):
    """A coordinator resends a marker whose answer it lost (a crash, a failed flush) though it was stored: it closes
    nothing, so it is answered without a second control record, live, after a restart (rebuilt from the log) and
    from a snapshot. The same marker after the producer's next batch, the other result, or a later coordinator's
    (which must be stored to fence the earlier one after a restart) are written."""
    partition = open_partition(tmp_path)
    await partition.apply_dedup_policy(True)
    await partition.expect_transactions()
    assert (await partition.publish_normal(*transactional_batch(0))).error == ErrorCode.NONE
    assert (await partition.publish_control(7, 0, commit=False)).error == ErrorCode.NONE
    assert partition.high_watermark == 2
    assert (await partition.publish_control(7, 0, commit=False)).error == ErrorCode.NONE
    assert partition.high_watermark == 2  # not written again
    await partition.ledger.close()  # a crash: no snapshot at close

    partition = open_partition(tmp_path)
    await partition.apply_dedup_policy(True)
    assert await partition.load_transactions() == 2  # control: rebuilt from the stored batch and marker
    assert (await partition.publish_control(7, 0, commit=False)).error == ErrorCode.NONE
    assert partition.high_watermark == 2
    assert (await partition.publish_control(7, 0, commit=True)).error == ErrorCode.NONE  # another result
    assert partition.high_watermark == 3
    assert (await partition.publish_normal(*transactional_batch(1))).error == ErrorCode.NONE
    assert (await partition.publish_control(7, 0, commit=True)).error == ErrorCode.NONE  # the next transaction's
    assert partition.high_watermark == 5
    assert (await partition.publish_control(7, 0, commit=True, coordinator_epoch=1)).error == ErrorCode.NONE
    assert partition.high_watermark == 6  # a later coordinator's
    await partition.close()  # a clean close: the snapshot at the last entry carries the last markers

    partition = open_partition(tmp_path)
    await partition.apply_dedup_policy(True)
    assert await partition.load_transactions() == 0  # control: from the snapshot alone
    assert (await partition.publish_control(7, 0, commit=True, coordinator_epoch=1)).error == ErrorCode.NONE
    assert partition.high_watermark == 6
    await partition.close()


async def test_a_marker_sent_again_while_it_is_being_written_is_written_once(tmp_path):
    """A coordinator on another broker whose WriteTxnMarkers timed out sends it again while the partition's disk is
    slow: both requests get the one write's outcome."""
    partition = open_partition(tmp_path)
    await partition.apply_dedup_policy(True)
    await partition.expect_transactions()
    assert (await partition.publish_normal(*transactional_batch(0))).error == ErrorCode.NONE
    partition.ledger.hold_flushes(True)
    first = partition.publish_control(7, 0, commit=True, coordinator_epoch=2)
    again = partition.publish_control(7, 0, commit=True, coordinator_epoch=2)
    assert not first.done() and not again.done()  # control: the marker's write is held
    partition.ledger.hold_flushes(False)
    assert (await first).error == ErrorCode.NONE and (await again).error == ErrorCode.NONE
    assert partition.high_watermark == 2
    assert partition.transactions.open == {}
    await partition.close()
