"""What rebuilding a partition's PIP-33 snapshot cache costs when the partition is loaded (after a restart): the
read of every entry from the furthest-behind replicated group's position to the end, looking for the SNAPSHOT
markers stored there. In process, on the real file ledger: records of 100 bytes in batches of one, a SNAPSHOT marker
after every 500 entries (a snapshot period's worth of data), then the cache is rebuilt from the first entry, the
worst case (a replicated group that never committed past offset 0).

    python -m bench.snapshot_rebuild --entries 100000,1000000
"""
import argparse
import asyncio
import shutil
import tempfile
import time

from bench.report import Table, fmt
from dedup import DedupConfig
from kop.ledger.file_ledger import FileManagedLedger, LedgerConfig
from kop.partition import PartitionLog
from kop.replication.snapshots import SnapshotController, SnapshotSettings, message_id
from proto.kop_pb2 import ClusterMessageId, MarkerType, ReplicatedSubscriptionsSnapshot
from protocol.records import Record, build_batch, split_batches

EVERY = 500  # entries between snapshots
SETTINGS = SnapshotSettings(frequency_s=1.0, timeout_s=30.0, max_cached=10)


async def fill(partition: PartitionLog, entries: int) -> None:
    header, view = split_batches(build_batch([Record(offset=0, timestamp=1_000, key=None, value=b"x" * 100)]))[0]
    for first in range(0, entries, EVERY):
        await asyncio.gather(*(partition.publish_normal(header, view) for _ in range(min(EVERY, entries - first))))
        local = partition.ledger.last_confirmed
        snapshot = ReplicatedSubscriptionsSnapshot(snapshot_id=str(first), local_message_id=message_id(local),
                                                   clusters=[ClusterMessageId(cluster="west",
                                                                              message_id=message_id(local))])
        await partition.publish_marker(MarkerType.REPLICATED_SUBSCRIPTION_SNAPSHOT, snapshot.SerializeToString(),
                                       replicate_to=("east",))


async def rebuild_seconds(entries: int) -> tuple[float, int]:
    directory = tempfile.mkdtemp(prefix="kop-rebuild-")
    try:
        config = LedgerConfig(fsync=False)
        ledger = FileManagedLedger.open("bench-partition-0", directory, config, None)
        partition = PartitionLog("bench", 0, ledger, DedupConfig())
        await partition.apply_dedup_policy(False)
        await fill(partition, entries)
        await partition.close()
        ledger = FileManagedLedger.open("bench-partition-0", directory, config, None)  # as after a restart
        partition = PartitionLog("bench", 0, ledger, DedupConfig())
        await partition.apply_dedup_policy(False)
        controller = SnapshotController(partition, "east", lambda: ["west"], lambda remote: True, SETTINGS)
        started = time.perf_counter()
        await controller._rebuild(0)  # what the controller's first tick does
        seconds = time.perf_counter() - started
        await partition.close()
        return seconds, len(controller.recent)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", default="100000,1000000", help="entries in the partition, comma-separated")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    table = Table("Rebuilding the snapshot cache of one partition", ["entries", "markers", "seconds", "entries/s",
                                                                     "snapshots cached"])
    for entries in (int(n) for n in args.entries.split(",")):
        seconds, cached = asyncio.run(rebuild_seconds(entries))
        table.add(fmt(entries), fmt(-(-entries // EVERY)), fmt(seconds, 2), fmt(entries / seconds), fmt(cached))
    print(table.markdown() if args.markdown else table.text())


if __name__ == "__main__":
    main()
