"""What deduplication costs per batch, in process, with deduplication enabled vs disabled, over producers that each
send the next batch in sequence (the common case). No broker and no network: this isolates the microseconds that the
end-to-end benchmark (`bench.dedup_overhead`) can only see through the noise of a whole broker. Two rows:

* the dedup core: what `PartitionLog` asks of `KafkaProducers` for each idempotent batch (check, on_pushed,
  on_persisted), timed around those calls only;
* the partition path: `PartitionLog.publish_normal` on a `FileManagedLedger` (fsync off) with up to 5 batches in
  flight per producer, so everything the broker does per batch below the Produce handler is in it: the decision,
  offsets, the entry's metadata, the append, the durable callback, and the dedup snapshots (every 1000 entries)
  written to the real cursor log. Timed as the thread's CPU for the whole loop.

    python -m bench.dedup_core --batches 200000 --producers 4 --rounds 5
"""
import argparse
import asyncio
import gc
import logging
import tempfile
import time
from dataclasses import dataclass

from bench.report import Table, fmt
from bench.stats import interleaved_order, median
from dedup import Accept, DedupConfig, KafkaProducers, MessageDeduplication
from dedup.memory import InMemoryDedupLedger
from kop.ledger.file_ledger import FileLedgerConfig, FileManagedLedger
from kop.partition import PartitionLog
from proto.kop_pb2 import MessageMetadata
from protocol.records import Record, build_batch, split_batches

_METADATA = MessageMetadata()
IN_FLIGHT = 5  # per producer, as Kafka clients pipeline idempotent batches


async def per_batch_us(enabled: bool, batches: int, producers: int) -> float:
    """Microseconds of dedup work per batch; the in-memory ledger's own append is left out of the clock."""
    ledger = InMemoryDedupLedger()
    dedup = MessageDeduplication(ledger, DedupConfig())  # snapshots every 1000 entries, as the broker's default
    kafka = KafkaProducers(dedup)
    await dedup.check_status(enabled)
    sequences = [0] * producers
    clock = time.perf_counter
    spent = 0.0
    for i in range(batches):
        producer_id = i % producers
        start = clock()
        decision = kafka.check(producer_id, 0, sequences[producer_id], 0)
        if not isinstance(decision, Accept):
            raise AssertionError(f"batch {i} was not accepted: {decision}")
        pending = kafka.on_pushed(decision, i, i, 0)
        spent += clock() - start
        position = ledger.append(_METADATA, i, i)
        start = clock()
        kafka.on_persisted(pending, position)
        spent += clock() - start
        sequences[producer_id] += 1
        if i % 1000 == 999:
            await dedup.flush_snapshot()  # the snapshot the 1000th entry started (its properties were taken above)
    await dedup.close()
    return spent / batches * 1e6


def _single_record_batches(batches: int, producers: int) -> list:
    """(header, view) of each batch, built before the clock starts: one 100-byte record each, round robin over the
    producers, each producer's sequences in order."""
    record = Record(0, int(time.time() * 1000), None, b"x" * 100)
    return [split_batches(build_batch([record], producer_id=i % producers, producer_epoch=0,
                                      base_sequence=i // producers))[0]
            for i in range(batches)]


async def partition_path_us(enabled: bool, batches: int, producers: int) -> float:
    """CPU microseconds per batch of PartitionLog.publish_normal through to the durable result, fsync off."""
    work = _single_record_batches(batches, producers)
    # Out of the garbage collector's sight: a broker holds no such heap of batches, and a full collection that walks
    # them would be charged to whichever variant happened to trigger it.
    gc.collect()
    gc.freeze()
    try:
        return await _timed_partition_path(enabled, work, producers)
    finally:
        gc.unfreeze()


async def _timed_partition_path(enabled: bool, work: list, producers: int) -> float:
    with tempfile.TemporaryDirectory(prefix="kop-bench-dedup-") as directory:
        ledger = FileManagedLedger.open("bench-0", directory, FileLedgerConfig(fsync=False), None)
        partition = PartitionLog("bench", 0, ledger, DedupConfig())
        await partition.apply_dedup_policy(enabled)
        window = IN_FLIGHT * producers
        in_flight: list[asyncio.Future] = []
        start = time.thread_time()
        for header, view in work:
            in_flight.append(partition.publish_normal(header, view))
            if len(in_flight) == window:
                await _all_stored(in_flight)
        await _all_stored(in_flight)
        spent = time.thread_time() - start
        await partition.close()
    return spent / len(work) * 1e6


async def _all_stored(in_flight: list[asyncio.Future]) -> None:
    for future in in_flight:
        result = await future
        if result.error:
            raise AssertionError(f"a batch was not stored: {result}")
    in_flight.clear()


@dataclass(frozen=True, slots=True)
class Cost:
    what: str
    batches: int
    producers: int
    off_us: list[float]
    on_us: list[float]

    @property
    def added_us(self) -> float:
        return median([on - off for on, off in zip(self.on_us, self.off_us)])

    @property
    def added(self) -> float:
        """The added time as a fraction of the 'off' time, per round, median."""
        return median([on / off - 1 for on, off in zip(self.on_us, self.off_us)])


PATHS = {"dedup core": per_batch_us, "partition path": partition_path_us}


def measure(batches: int, producers: int, rounds: int, partition_batches: int | None = None) -> list[Cost]:
    """Both rows, dedup off and on interleaved (ABBA) round by round. The partition path runs `partition_batches`
    (default: a quarter of `batches`): its batches are built up front."""
    counts = {"dedup core": batches, "partition path": partition_batches or max(batches // 4, 1)}
    costs = []
    logging.disable(logging.INFO)  # the snapshot log lines are not what is measured
    try:
        for what, path in PATHS.items():
            off: list[float] = []
            on: list[float] = []
            for r in range(rounds):
                for variant in interleaved_order(2, r):
                    enabled = variant == 1
                    (on if enabled else off).append(asyncio.run(path(enabled, counts[what], producers)))
            costs.append(Cost(what, counts[what], producers, off, on))
    finally:
        logging.disable(logging.NOTSET)
    return costs


def table(costs: list[Cost], title: str = "Dedup cost per batch (in process)") -> Table:
    t = Table(title, ["what", "batches", "producers", "µs/batch dedup off", "µs/batch dedup on", "added µs/batch",
                      "added"])
    for c in costs:
        t.add(c.what, fmt(c.batches), fmt(c.producers), fmt(median(c.off_us), 2), fmt(median(c.on_us), 2),
              fmt(c.added_us, 2), f"{c.added:+.1%}")
    t.notes.append(f"{len(costs[0].on_us)} rounds, medians (added: of the per-round differences and ratios); "
                   "single-record next-in-sequence batches; dedup core = check + on_pushed + on_persisted of "
                   "KafkaProducers; partition path = PartitionLog.publish_normal to the durable result on a file "
                   "ledger, fsync off, snapshots to the cursor log included, thread CPU time")
    return t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=200_000, help="batches per run of the dedup core")
    parser.add_argument("--partition-batches", type=int, help="batches per run of the partition path "
                                                              "(default: a quarter of --batches)")
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    result = table(measure(args.batches, args.producers, args.rounds, args.partition_batches))
    print(result.markdown() if args.markdown else result.text())


if __name__ == "__main__":
    main()
