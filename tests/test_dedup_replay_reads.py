"""The dedup recovery's replay reads the partition in bounded steps, as the replicators do: about 1 MB at a time
(the first entry whatever its size), so recovering a partition of large batches never pulls hundreds of MB into
memory at once."""
from kop.dedup_storage import LedgerDedupStorage
from kop.ledger import Position
from tests.test_replication_reads import BIG, STEP_BYTES, fill, open_partition, watch_reads


async def test_the_replay_reads_about_one_megabyte_a_step_and_yields_every_entry(tmp_path):
    partition = await open_partition(tmp_path)
    await fill(partition, 30)  # 6 MB: 30 entries of 200 KB, fewer than one read's 100 entries
    sizes = watch_reads(partition)
    replayed = [entry async for entry in LedgerDedupStorage(partition.ledger).replay_after(Position(-1, -1))]
    assert len(replayed) == 30  # control: everything was read
    assert len(sizes) > 3 and max(sizes) <= STEP_BYTES + BIG + 1024
    await partition.close()
