"""What a dedup snapshot costs as the number of producer names on one partition grows: the snapshot's size, the time
to take it (the copy of the state taken on the event loop, then the packing and the durable cursor write that follow
off it), the longest stall of the event loop meanwhile, the recovery of the state after a crash (reopening the
ledger, whose cursor log is scanned, and loading the snapshot), and the memory each name holds. In process, on the real file ledger (fsync on
for the snapshot and the recovery; the entries that set the state up are written without it).

Two kinds of names: Kafka idempotent producers (a name and its five recent batches each, as kop snapshots them) and
application-chosen names (`kop.producer.name` headers: a name and its sequence only).

    python -m bench.dedup_snapshot --names 10000,100000
"""
import argparse
import asyncio
import gc
import logging
import os
import tempfile
import time
import tracemalloc
from dataclasses import dataclass

from bench.report import Table, fmt
from dedup import DEDUP_CURSOR_NAME, DedupConfig, KafkaProducers, MessageDeduplication
from kop.dedup_storage import LedgerDedupStorage
from kop.ledger.file_ledger import LedgerConfig, FileManagedLedger
from proto.kop_pb2 import MessageMetadata

BATCHES_PER_PRODUCER = 5  # Kafka's window: what a snapshot keeps of each producer
PARTITION = "bench-partition-0"


@dataclass(frozen=True, slots=True)
class SnapshotCost:
    kind: str
    names: int
    record_bytes: int
    build_ms: float  # the copy of the state a snapshot takes on the event loop
    write_ms: float  # from the start of the snapshot to its durable cursor record
    max_stall_ms: float  # the longest the event loop did not run a ticker meanwhile
    recovery_ms: float  # reopen the ledger and rebuild the dedup state from the snapshot
    bytes_per_name: float  # memory of the dedup state, per name


async def _load(kind: str, names: int, directory: str, config: DedupConfig) -> float:
    """Write the entries that give the partition `names` names (fsync off); returns the dedup state's memory per
    name."""
    ledger = FileManagedLedger.open(PARTITION, directory, LedgerConfig(fsync=False), None)
    dedup = MessageDeduplication(LedgerDedupStorage(ledger), config)
    producers = KafkaProducers(dedup) if kind == "kafka" else None
    await dedup.check_status(True)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    offset = 0
    for n in range(names):
        for seq in range(BATCHES_PER_PRODUCER if producers is not None else 1):
            if producers is not None:
                accept = producers.check(n, 0, seq, 0)
                metadata = MessageMetadata(producer_name=accept.producer_name, sequence_id=seq,
                                           highest_sequence_id=seq, producer_id=n, producer_epoch=0)
                pending = producers.on_pushed(accept, offset, offset, 0)
                position = await ledger.add_entry(offset, 1, metadata.SerializeToString(), b"x")
                producers.on_persisted(pending, position)
            else:
                name = f"ingest-job/part-{n:05d}.jsonl"
                dedup.is_duplicate(name, 1000 + seq, 1000 + seq)
                metadata = MessageMetadata(producer_name=name, sequence_id=1000 + seq)
                position = await ledger.add_entry(offset, 1, metadata.SerializeToString(), b"x")
                dedup.record_persisted(name, 1000 + seq, 1000 + seq, position, idle=True)
            offset += 1
    gc.collect()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    await ledger.close()
    return sum(s.size_diff for s in after.compare_to(before, "filename")
               if "dedup" in s.traceback[0].filename) / names


async def _open(kind: str, directory: str, config: DedupConfig) -> tuple[FileManagedLedger, MessageDeduplication]:
    ledger = FileManagedLedger.open(PARTITION, directory, LedgerConfig(fsync=True), None)
    dedup = MessageDeduplication(LedgerDedupStorage(ledger), config)
    if kind == "kafka":
        KafkaProducers(dedup)
    await dedup.check_status(True)
    return ledger, dedup


async def _snapshot(dedup: MessageDeduplication) -> tuple[float, float, float]:
    """(build ms, durable write ms, longest loop stall ms) of one snapshot."""
    start = time.perf_counter()
    dedup._take_snapshot()  # what _start_snapshot does on the loop: copy the state (packing it is timed below)
    build_ms = (time.perf_counter() - start) * 1000
    stalls: list[float] = []
    stop = asyncio.Event()

    async def ticker() -> None:
        last = time.perf_counter()
        while not stop.is_set():
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            stalls.append(now - last)
            last = now

    ticking = asyncio.ensure_future(ticker())
    await asyncio.sleep(0.01)
    start = time.perf_counter()
    assert dedup.snapshot_now()
    await dedup.flush_snapshot()
    write_ms = (time.perf_counter() - start) * 1000
    stop.set()
    await ticking
    return build_ms, write_ms, max(stalls) * 1000


async def _measure(kind: str, names: int, directory: str) -> SnapshotCost:
    config = DedupConfig(entries_interval=1 << 40, max_producers=names)
    bytes_per_name = await _load(kind, names, directory, config)
    ledger, dedup = await _open(kind, directory, config)  # replays every entry: no snapshot yet
    build_ms, write_ms, stall_ms = await _snapshot(dedup)
    record_bytes = os.path.getsize(os.path.join(directory, "cursors.log"))
    await ledger.close()  # nothing more to replay: the snapshot is at the last entry
    start = time.perf_counter()
    ledger, recovered = await _open(kind, directory, config)
    recovery_ms = (time.perf_counter() - start) * 1000
    assert len(recovered.persisted) == names
    await ledger.close()
    return SnapshotCost(kind, names, record_bytes, build_ms, write_ms, stall_ms, recovery_ms, bytes_per_name)


def run(names: list[int]) -> Table:
    logging.getLogger("dedup").setLevel(logging.WARNING)
    table = Table("Dedup snapshot cost by number of names (one partition, fsync on)",
                  ["names", "kind", "snapshot bytes", "copy ms", "pack + durable write ms", "loop stall ms",
                   "recovery ms", "memory B/name"])
    for count in names:
        for kind in ("application", "kafka"):
            with tempfile.TemporaryDirectory(prefix="kop-bench-snap-") as directory:
                cost = asyncio.run(_measure(kind, count, directory))
            table.add(fmt(count), kind, fmt(cost.record_bytes), fmt(cost.build_ms, 1), fmt(cost.write_ms, 1),
                      fmt(cost.max_stall_ms, 1), fmt(cost.recovery_ms, 1), fmt(cost.bytes_per_name))
    table.notes.append("kafka = idempotent producers (a name and 5 recent batches each); application = "
                       "kop.producer.name names (a name and its sequence)")
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--names", default="10000,100000", help="comma-separated numbers of names")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    table = run([int(n) for n in args.names.split(",")])
    print(table.markdown() if args.markdown else table.text())


if __name__ == "__main__":
    main()
