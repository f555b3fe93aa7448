"""The dedup core's own cost per batch, in process: what `PartitionLog` asks of `KafkaProducers` for each idempotent
batch (check, on_pushed, on_persisted), with deduplication enabled vs disabled, over producers that each send the
next batch in sequence (the common case). No broker, no I/O: this isolates the few microseconds that the
end-to-end benchmark (`bench.dedup_overhead`) can only see through the noise of a whole broker.

    python -m bench.dedup_core --batches 200000 --producers 4 --rounds 5
"""
import argparse
import asyncio
import logging
import time
from dataclasses import dataclass

from bench.report import Table, fmt
from bench.stats import interleaved_order, median
from dedup import Accept, DedupConfig, KafkaProducers, MessageDeduplication
from dedup.memory import InMemoryDedupLedger
from proto.kop_pb2 import MessageMetadata

_METADATA = MessageMetadata()


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


@dataclass(frozen=True, slots=True)
class CoreCost:
    batches: int
    producers: int
    off_us: list[float]
    on_us: list[float]

    @property
    def added_us(self) -> float:
        return median([on - off for on, off in zip(self.on_us, self.off_us)])


def measure(batches: int, producers: int, rounds: int) -> CoreCost:
    off: list[float] = []
    on: list[float] = []
    logging.disable(logging.INFO)  # the snapshot log lines are not what is measured
    try:
        for r in range(rounds):
            for variant in interleaved_order(2, r):
                enabled = variant == 1
                (on if enabled else off).append(asyncio.run(per_batch_us(enabled, batches, producers)))
    finally:
        logging.disable(logging.NOTSET)
    return CoreCost(batches, producers, off, on)


def table(cost: CoreCost, title: str = "Dedup core cost per batch (in process)") -> Table:
    t = Table(title, ["batches", "producers", "µs/batch dedup off", "µs/batch dedup on", "added µs/batch"])
    t.add(fmt(cost.batches), fmt(cost.producers), fmt(median(cost.off_us), 2), fmt(median(cost.on_us), 2),
          fmt(cost.added_us, 2))
    t.notes.append(f"{len(cost.on_us)} rounds, medians; check + on_pushed + on_persisted of KafkaProducers, "
                   f"next-in-sequence batches; 'off' still builds the producer name and the Accept")
    return t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=200_000)
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    result = table(measure(args.batches, args.producers, args.rounds))
    print(result.markdown() if args.markdown else result.text())


if __name__ == "__main__":
    main()
