"""Only a partition that a transaction ever added reads its stored batches at load to rebuild its open transactions
and aborted index; every other partition loads without reading its log."""
from dedup import DedupConfig
from kop.ledger import FileLedgerConfig, FileManagedLedger
from kop.partition import PartitionLog
from kop.transactions.partition_index import PartitionTransactions
from protocol.errors import ErrorCode
from protocol.records import Record, build_batch, split_batches


def open_partition(path) -> PartitionLog:
    ledger = FileManagedLedger.open("t-0", str(path), FileLedgerConfig(fsync=False), None)
    return PartitionLog("t", 0, ledger, DedupConfig())


async def write_plain(partition: PartitionLog, count: int) -> None:
    for i in range(count):
        first = partition.ledger.written_end_index
        batch = build_batch([Record(offset=first, timestamp=1_700_000_000_000, key=None, value=b"v%d" % i)],
                            base_offset=first)
        await partition.ledger.add_entry(first, 1, b"", batch)


async def test_a_partition_no_transaction_added_is_not_read_at_load_and_one_added_is(tmp_path):
    partition = open_partition(tmp_path)
    await write_plain(partition, 5)
    await partition.ledger.close()

    partition = open_partition(tmp_path)
    assert not partition.may_hold_transactions
    assert partition.load_transactions() == 0  # nothing read
    await partition.expect_transactions()
    await partition.ledger.close()

    partition = open_partition(tmp_path)
    assert partition.may_hold_transactions  # durable across the restart
    assert partition.load_transactions() == 5  # every stored entry read
    await partition.ledger.close()


async def test_a_partition_loads_its_transactions_from_the_last_snapshot_and_the_entries_after_it(tmp_path):
    """1,210 transactional entries (aborts among them, one transaction left open): the load reads only the entries
    after the snapshot, and ends in the state a read of the whole log gives."""
    partition = open_partition(tmp_path)
    await partition.apply_dedup_policy(True)
    await partition.expect_transactions()
    for i in range(1210):
        records = [Record(offset=0, timestamp=1_700_000_000_000, key=None, value=b"v%d" % i)]
        header, view = split_batches(build_batch(records, producer_id=7, producer_epoch=0, base_sequence=i,
                                                 transactional=True))[0]
        assert (await partition.publish_normal(header, view)).error == ErrorCode.NONE
        if i % 100 == 99 and i < 1200:  # every 3rd transaction aborted; the last 10 records' one stays open
            assert (await partition.publish_control(7, 0, commit=i % 300 != 99)).error == ErrorCode.NONE
    expected = (dict(partition.transactions.open), list(partition.transactions.aborted))
    assert expected[0] and len(expected[1]) == 4  # control: an open transaction and aborted ones to restore
    await partition.close()

    partition = open_partition(tmp_path)
    read = partition.load_transactions()
    assert read == 1222 - 1000  # the entries after the snapshot (at the 1,000th) only
    assert (partition.transactions.open, partition.transactions.aborted) == expected
    whole = PartitionTransactions()
    assert whole.rebuild(partition.ledger) == 1222  # the whole log, as without a snapshot
    assert (whole.open, whole.aborted) == expected
    await partition.close()
