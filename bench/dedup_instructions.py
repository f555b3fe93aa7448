"""What deduplication costs per single-record batch, counted in instructions rather than timed, with valgrind's
callgrind (which counts every instruction a process executes, all threads), deduplication disabled vs enabled:

* the broker: a `kop standalone` under callgrind while an idempotent librdkafka producer sends single-record batches
  (`brokerDeduplicationEnabled=false` and `=true`, interleaved): the instructions of a whole batch, request to
  response. How many requests the broker finds waiting per wake-up still varies from run to run, and with it the
  count per record, by a per cent or two;
* the partition path (`bench.dedup_core.partition_path_us` in a process of its own under callgrind): everything the
  broker does per batch below the Produce handler, where all of deduplication's work is, without network or timing,
  so its count is exact. Its on-off difference over the broker's count per batch is the added share.

Timing cannot resolve a few per cent on a shared 2-core machine (one run's broker CPU per record differs from the
next by 10-20 %, whatever the code). Instructions leave out what they do not show (cache misses, branch
mispredictions), so this complements the timed benchmarks (`bench.dedup_overhead`, `bench.dedup_core`).

    python -m bench.dedup_instructions --records 1500 --rounds 2     # needs valgrind (not a project dependency)
"""
import argparse
import asyncio
import logging
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass

from bench import produce_instructions
from bench.dedup_core import partition_path_us
from bench.report import Table, fmt
from bench.stats import interleaved_order, median
from integration.broker_process import REPO

PARTITIONS = 4


def instructions_per_record(dedup: bool, records: int) -> float:
    """Instructions the broker executes per record, from the first record produced to the last acknowledged."""
    return produce_instructions.instructions_per_record(
        {"fsync": "false", "brokerDeduplicationEnabled": str(dedup).lower()}, records)


def partition_path_instructions(dedup: bool, batches: int, producers: int = PARTITIONS) -> float:
    """Instructions per batch of a whole process that runs the partition path for `batches` batches. Start-up and
    building the batches are counted too: only a difference between two such counts means something."""
    with tempfile.TemporaryDirectory(prefix="kop-bench-callgrind-") as root:
        out = os.path.join(root, "callgrind.out")
        subprocess.run([*produce_instructions.valgrind(out), sys.executable, "-m", "bench.dedup_instructions",
                        "--inner", "on" if dedup else "off", "--records", str(batches), "--producers", str(producers)],
                       check=True, capture_output=True, timeout=1800, cwd=REPO)
        return produce_instructions.totals(out) / batches


@dataclass(frozen=True, slots=True)
class Counts:
    records: int
    batches: int  # of the partition path
    off: list[float]  # broker instructions per record
    on: list[float]
    path_added: float  # partition path, instructions per batch, on - off

    @property
    def added(self) -> float:
        """The partition path's added instructions over the broker's instructions per batch with dedup off."""
        return self.path_added / median(self.off)


def measure(records: int, rounds: int, batches: int, progress=print) -> Counts:
    produce_instructions.require_valgrind()
    off: list[float] = []
    on: list[float] = []
    for r in range(rounds):
        for variant in interleaved_order(2, r):
            count = instructions_per_record(variant == 1, records)
            (on if variant == 1 else off).append(count)
            progress(f"  round {r + 1}/{rounds} broker, dedup {'on' if variant else 'off'}: "
                     f"{count:,.0f} instructions/record")
    path_added = partition_path_instructions(True, batches) - partition_path_instructions(False, batches)
    progress(f"  partition path: dedup on adds {path_added:,.0f} instructions/batch")
    return Counts(records, batches, off, on, path_added)


def table(counts: Counts, title: str = "Instructions per single-record batch (callgrind)") -> Table:
    t = Table(title, ["records", "broker, dedup off", "broker, dedup on", "broker on-off", "partition path on-off",
                      "added share"])
    t.add(f"{counts.records:,} x 100 B", fmt(median(counts.off)), fmt(median(counts.on)),
          fmt(median(counts.on) - median(counts.off)), fmt(counts.path_added), f"{counts.added:+.1%}")
    spread = lambda values: f"{min(values):,.0f}..{max(values):,.0f}"  # noqa: E731
    t.notes.append(f"broker: {len(counts.on)} rounds, medians (off {spread(counts.off)}, on {spread(counts.on)}), "
                   f"all threads, fsync=false, {PARTITIONS} partitions, librdkafka idempotent producer with "
                   f"batch.num.messages=1; partition path: {counts.batches:,} batches, {PARTITIONS} producers, "
                   "exact; added share = partition path on-off / broker off")
    return t


def _inner(dedup: bool, batches: int, producers: int) -> None:
    """The process callgrind counts for the partition path (its start-up and the batches' building too, the same
    with dedup on or off)."""
    logging.disable(logging.INFO)
    asyncio.run(partition_path_us([dedup], batches, producers))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.dedup_instructions", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1500, help="records per broker run (batches of the partition "
                                                                  "path with --inner)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batches", type=int, default=20_000, help="batches of the partition path")
    parser.add_argument("--producers", type=int, default=PARTITIONS, help=argparse.SUPPRESS)
    parser.add_argument("--inner", choices=["off", "on"], help=argparse.SUPPRESS)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    if args.inner:
        _inner(args.inner == "on", args.records, args.producers)
        return 0
    t = table(measure(args.records, args.rounds, args.batches))
    print(t.markdown() + "\n\n" + "\n".join(f"_{n}_" for n in t.notes) if args.markdown else t.text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
