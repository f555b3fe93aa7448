"""What deduplication costs per batch, in process, with deduplication enabled vs disabled, over producers that each
send the next batch in sequence (the common case). No broker and no network: this isolates the microseconds that the
end-to-end benchmark (`bench.dedup_overhead`) can only see through the noise of a whole broker. Two rows:

* the dedup core: what `PartitionLog` asks of `KafkaProducers` for each idempotent batch (check, on_pushed,
  on_persisted), timed around those calls only;
* the partition path: `PartitionLog.publish_normal` on a `FileManagedLedger` (fsync off) with up to 5 batches in
  flight per producer, so everything the broker does per batch below the Produce handler is in it: the decision,
  offsets, the entry's metadata, the append, the durable callback, and the dedup snapshots (every 1000 entries)
  written to the real cursor log. Timed as the thread's CPU time, window by window.

The two variants run side by side in one process, batch by batch (the core) or window by window (the partition path),
in alternating order: this machine's speed drifts by 10-20 % from one run to the next, and a slow moment is then
charged to both.

    python -m bench.dedup_core --batches 200000 --producers 4 --rounds 5
"""
import argparse
import asyncio
import gc
import logging
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass

from bench.report import Table, fmt
from bench.stats import median
from dedup import Accept, DedupConfig, KafkaProducers, MessageDeduplication
from dedup.memory import InMemoryDedupLedger
from kop.ledger.file_ledger import LedgerConfig, FileManagedLedger
from kop.partition import PartitionLog
from proto.kop_pb2 import MessageMetadata
from protocol.records import Record, build_batch, split_batches

_METADATA = MessageMetadata()
IN_FLIGHT = 5  # per producer, as Kafka clients pipeline idempotent batches
VARIANTS = (False, True)  # dedup off, on


class _Core:
    """One variant of the dedup core, on an in-memory ledger whose own append is left out of the clock."""

    def __init__(self, enabled: bool, producers: int) -> None:
        self.enabled = enabled
        self.ledger = InMemoryDedupLedger()
        self.dedup = MessageDeduplication(self.ledger, DedupConfig())  # snapshots every 1000 entries, as the broker
        self.kafka = KafkaProducers(self.dedup)
        self.sequences = [0] * producers
        self.spent = 0.0

    def batch(self, i: int, producer_id: int) -> None:
        clock = time.perf_counter
        start = clock()
        decision = self.kafka.check(producer_id, 0, self.sequences[producer_id], 0)
        if not isinstance(decision, Accept):
            raise AssertionError(f"batch {i} was not accepted: {decision}")
        pending = self.kafka.on_pushed(decision, i, i, 0)
        self.spent += clock() - start
        position = self.ledger.append(_METADATA, i, i)
        start = clock()
        self.kafka.on_persisted(pending, position)
        self.spent += clock() - start
        self.sequences[producer_id] += 1


async def core_us(variants: Sequence[bool], batches: int, producers: int) -> list[float]:
    """Microseconds of dedup work per batch for each variant (dedup enabled or not), batch by batch side by side."""
    runs = [_Core(enabled, producers) for enabled in variants]
    for run in runs:
        await run.dedup.check_status(run.enabled)
    for i in range(batches):
        for run in runs if i % 2 == 0 else runs[::-1]:
            run.batch(i, i % producers)
        if i % 1000 == 999:
            for run in runs:  # the snapshot the 1000th entry started (its properties were taken in the clock)
                await run.dedup.flush_snapshot()
    for run in runs:
        await run.dedup.close()
    return [run.spent / batches * 1e6 for run in runs]


def _single_record_batches(batches: int, producers: int) -> list:
    """(header, view) of each batch, built before the clock starts: one 100-byte record each, round robin over the
    producers, each producer's sequences in order."""
    record = Record(0, int(time.time() * 1000), None, b"x" * 100)
    return [split_batches(build_batch([record], producer_id=i % producers, producer_epoch=0,
                                      base_sequence=i // producers))[0]
            for i in range(batches)]


class _Partition:
    """One variant of the partition path: a PartitionLog on a file ledger of its own."""

    def __init__(self, enabled: bool, directory: str) -> None:
        self.enabled = enabled
        ledger = FileManagedLedger.open("bench-0", directory, LedgerConfig(fsync=False), None)
        self.partition = PartitionLog("bench", 0, ledger, DedupConfig())
        self.spent = 0.0

    async def window(self, work: list) -> None:
        start = time.thread_time()
        results = [self.partition.publish_normal(header, view) for header, view in work]
        for result in results:
            stored = await result
            if stored.error:
                raise AssertionError(f"a batch was not stored: {stored}")
        await self.partition.dedup.flush_snapshot()  # a snapshot this window started is charged to it
        self.spent += time.thread_time() - start


async def partition_path_us(variants: Sequence[bool], batches: int, producers: int) -> list[float]:
    """CPU microseconds per batch of PartitionLog.publish_normal through to the durable result, fsync off, for each
    variant (dedup enabled or not), window by window side by side."""
    work = _single_record_batches(batches, producers)
    # Out of the garbage collector's sight: a broker holds no such heap of batches, and a full collection that walks
    # them would be charged to whichever variant happened to trigger it.
    gc.collect()
    gc.freeze()
    try:
        with tempfile.TemporaryDirectory(prefix="kop-bench-dedup-") as directory:
            runs = [_Partition(enabled, f"{directory}/{i}") for i, enabled in enumerate(variants)]
            for run in runs:
                await run.partition.apply_dedup_policy(run.enabled)
            size = IN_FLIGHT * producers
            for w, first in enumerate(range(0, batches, size)):
                for run in runs if w % 2 == 0 else runs[::-1]:
                    await run.window(work[first:first + size])
            for run in runs:
                await run.partition.close()
    finally:
        gc.unfreeze()
    return [run.spent / batches * 1e6 for run in runs]


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


PATHS = {"dedup core": core_us, "partition path": partition_path_us}


def measure(batches: int, producers: int, rounds: int, partition_batches: int | None = None) -> list[Cost]:
    """Both rows, each round a side-by-side run of both variants. The partition path runs `partition_batches`
    (default: a quarter of `batches`): its batches are built up front."""
    counts = {"dedup core": batches, "partition path": partition_batches or max(batches // 4, 1)}
    costs = []
    logging.disable(logging.INFO)  # the snapshot log lines are not what is measured
    try:
        for what, path in PATHS.items():
            off: list[float] = []
            on: list[float] = []
            for _ in range(rounds):
                off_us, on_us = asyncio.run(path(VARIANTS, counts[what], producers))
                off.append(off_us)
                on.append(on_us)
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
    t.notes.append(f"{len(costs[0].on_us)} rounds, medians (added: of the per-round differences and ratios); off and "
                   "on side by side in each round; single-record next-in-sequence batches; dedup core = check + "
                   "on_pushed + on_persisted of KafkaProducers; partition path = PartitionLog.publish_normal to the "
                   "durable result on a file ledger, fsync off, snapshots to the cursor log included, thread CPU "
                   "time")
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
