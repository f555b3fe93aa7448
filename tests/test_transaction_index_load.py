"""Only a partition that a transaction ever added reads its stored batches at load to rebuild its open transactions
and aborted index; every other partition loads without reading its log."""
from dedup import DedupConfig
from kop.ledger import LedgerConfig, FileManagedLedger
from kop.partition import PartitionLog
from protocol.records import Record, build_batch


def open_partition(path) -> PartitionLog:
    ledger = FileManagedLedger.open("t-0", str(path), LedgerConfig(fsync=False), None)
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
