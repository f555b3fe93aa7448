"""A regression check of the produce path in a few minutes: this tree's broker beside an older commit's, on the same
workloads in the same run, alternating which goes first, reported as new/old ratios (throughput and broker CPU per
record), never as absolute times.

The older commit is exported (`git archive`) into a temporary directory and its broker started from there with this
tree's Python and libraries, so only kop's own code differs. The workloads are small versions of the ones the
performance goals are stated on (bench.peers): idempotent 1 KB and 100 B records, one record per request (the
per-request cost), and a producer paced at 20,000 records/s (the ack latency). `--instructions` adds the broker's
instruction count per single-record request under callgrind for both trees (bench.produce_instructions; needs
valgrind, and about a minute and a half per tree).

    make bench-quick                                   # against main (BENCH_AGAINST=<commit> for another)
    python -m bench.quick --against 26e950a --rounds 3 [--instructions]
"""
import argparse
import contextlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

from bench import machine, produce_instructions
from bench.brokers import create_topic
from bench.produce import ProduceResult, ProduceSpec, produce
from bench.report import Table, fmt
from bench.stats import interleaved_order, median, paired_ratios
from integration.broker_process import REPO, BrokerProcess

TOPIC = "bench-quick"
PARTITIONS = 4
TREES = ("old", "new")


def workloads(scale: float = 1.0) -> list[tuple[str, ProduceSpec]]:
    n = lambda records: max(500, int(records * scale))  # noqa: E731 - a local shorthand
    single = (("batch.num.messages", "1"),)
    return [("produce 1 KB, idempotent", ProduceSpec(n(40_000), 1000, PARTITIONS, idempotence=True)),
            ("produce 100 B, idempotent", ProduceSpec(n(150_000), 100, PARTITIONS, idempotence=True)),
            ("one record per request, idempotent", ProduceSpec(n(6_000), 100, PARTITIONS, idempotence=True,
                                                                linger_ms=0, client=single)),
            ("paced 20k records/s of 1 KB", ProduceSpec(n(40_000), 1000, PARTITIONS, idempotence=True,
                                                         rate=20_000))]


@contextlib.contextmanager
def exported(commit: str) -> Iterator[str]:
    """The tree of `commit` in a temporary directory (removed afterwards)."""
    root = tempfile.mkdtemp(prefix="kop-bench-old-")
    try:
        archive = subprocess.run(["git", "-C", REPO, "archive", commit], check=True, capture_output=True,
                                 timeout=120).stdout
        subprocess.run(["tar", "-x", "-C", root], input=archive, check=True, timeout=120)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def measure(tree: str, spec: ProduceSpec) -> ProduceResult:
    """A fresh broker of the kop in `tree` (its directory), one run of spec against it."""
    root = tempfile.mkdtemp(prefix="kop-bench-quick-")
    broker = BrokerProcess(f"{root}/data", cwd=tree)
    try:
        broker.start()
        create_topic(broker.bootstrap, TOPIC, PARTITIONS)
        return produce(broker.bootstrap, TOPIC, spec, broker.proc.pid)
    finally:
        broker.stop()
        shutil.rmtree(root, ignore_errors=True)


@dataclass
class Compared:
    name: str
    old: list[ProduceResult]
    new: list[ProduceResult]


def run(old_tree: str, rounds: int, scale: float, progress=print) -> list[Compared]:
    trees = {"old": old_tree, "new": REPO}
    results = []
    for name, spec in workloads(scale):
        runs: dict[str, list[ProduceResult]] = {"old": [], "new": []}
        for r in range(rounds):
            for i in interleaved_order(2, r):
                which = TREES[i]
                runs[which].append(measure(trees[which], spec))
                m = runs[which][-1]
                progress(f"  round {r + 1}/{rounds} {name}, {which}: {m.records_per_s:,.0f} rec/s, "
                         f"{m.cpu_s_per_100k:.2f} CPU s/100k, p99 {m.p99_ms:.1f} ms")
        results.append(Compared(name, runs["old"], runs["new"]))
    return results


def table(results: list[Compared], against: str, instructions: tuple[float, float] | None) -> Table:
    t = Table(f"This tree / {against}, side by side ({machine.describe()}, {machine.source_tree(REPO)})",
              ["workload", "rec/s old", "rec/s new", "new/old throughput", "new/old CPU per record",
               "p99 ms old / new"])
    for c in results:
        t.add(c.name, fmt(median([m.records_per_s for m in c.old])), fmt(median([m.records_per_s for m in c.new])),
              f"{median(paired_ratios([m.records_per_s for m in c.new], [m.records_per_s for m in c.old])):.2f}",
              f"{median(paired_ratios([m.cpu_s_per_100k for m in c.new], [m.cpu_s_per_100k for m in c.old])):.2f}",
              f"{median([m.p99_ms for m in c.old]):.1f} / {median([m.p99_ms for m in c.new]):.1f}")
    if instructions is not None:
        old, new = instructions
        t.add("instructions per single-record request", fmt(old), fmt(new), "-", f"{new / old:.2f}", "-")
    t.notes.append(f"{len(results[0].old) if results else 0} rounds, medians of per-round ratios; a fresh broker per "
                   f"run, old and new alternating; fsync and dedup on; confluent-kafka, acks=all, {PARTITIONS} "
                   "partitions, linger.ms 5 (0 for one record per request)")
    return t


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.quick", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", default="main", help="the older commit (default: main)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every workload's record count")
    parser.add_argument("--instructions", action="store_true", help="also count instructions per single-record "
                                                                    "request under callgrind (needs valgrind)")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    with exported(args.against) as old_tree:
        results = run(old_tree, args.rounds, args.scale)
        counts = None
        if args.instructions:
            produce_instructions.require_valgrind()
            config = {"fsync": "false"}
            program = (sys.executable, "-m", "kop.cli")
            counts = (produce_instructions.instructions_per_record(config, 1500, program=program, cwd=old_tree),
                      produce_instructions.instructions_per_record(config, 1500, program=program, cwd=REPO))
    t = table(results, args.against, counts)
    print(t.markdown() + "\n\n" + "\n".join(f"_{n}_" for n in t.notes) if args.markdown else t.text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
