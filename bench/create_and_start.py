"""Creating a topic of many partitions, and starting an empty broker, on the PostgreSQL engine and the file engine,
same run. With --against TREE, the kop of another source tree (a checkout of another commit) runs beside this one's
in every round, so before and after are compared under the same load.

Each round starts, for every (tree, engine), a fresh broker (a fresh database on one PostgreSQL server started for
the run from Debian's binaries) and times it from process start until its Kafka port accepts connections (the
coordinator shards are loaded by then); then one CreateTopics request for a topic of --partitions partitions, timed
until the answer is in. The order of the variants alternates over rounds (ABBA).

    python -m bench.create_and_start --partitions 2000 --rounds 3
    python -m bench.create_and_start --partitions 2000 --rounds 3 --against /tmp/kop-main
"""
import argparse
import math
import time
from datetime import datetime
from dataclasses import dataclass

from bench import machine
from bench.brokers import create_topic, postgres_for_run, running_broker
from bench.procstat import cpu_seconds
from bench.report import Table, fmt
from bench.stats import interleaved_order, median
from integration.postgres_server import PostgresServer

ENGINES = ("file", "postgresql")
CREATE_TIMEOUT_S = 300.0


@dataclass(frozen=True, slots=True)
class Variant:
    tree: str | None  # None: this tree
    engine: str

    @property
    def label(self) -> str:
        return f"{self.engine}, {'this tree' if self.tree is None else self.tree}"


@dataclass(frozen=True, slots=True)
class Timing:
    start_s: float  # process start until the Kafka port accepts connections
    coordinators_s: float  # of which the coordinator shards and the rest of the start after the topics (its log)
    create_s: float  # one CreateTopics request, until its answer
    create_cpu_s: float  # the broker's CPU seconds meanwhile (less at the mercy of other jobs than the wall time)


def after_topics_loaded(log_path: str) -> float:
    """Seconds from the broker's "loaded N topics" line to its "kop listening" line: the coordinators' start (on
    PostgreSQL, taking the group and transaction shards over), free of the interpreter's start-up. NaN when either
    line is missing."""
    stamps = {}
    with open(log_path) as f:
        for line in f:
            for key, marker in (("loaded", " kop.topics: loaded "), ("listening", " kop.broker: kop listening ")):
                if marker in line and key not in stamps:
                    stamps[key] = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
    if len(stamps) < 2:
        return math.nan
    return (stamps["listening"] - stamps["loaded"]).total_seconds()


def run_variant(variant: Variant, partitions: int, server: PostgresServer, database: str) -> Timing:
    config = {"storage": server.create_database(database)} if variant.engine == "postgresql" else {}
    started = time.monotonic()
    with running_broker(config, tree=variant.tree) as broker:
        start_s = time.monotonic() - started
        coordinators_s = after_topics_loaded(broker.log_path)
        started, cpu = time.monotonic(), cpu_seconds(broker.proc.pid)
        create_topic(broker.bootstrap, "bench-create", partitions, timeout_s=CREATE_TIMEOUT_S,
                     client={"socket.timeout.ms": int(CREATE_TIMEOUT_S * 1000)})  # a loaded machine: past 60 s
        return Timing(start_s, coordinators_s, time.monotonic() - started, cpu_seconds(broker.proc.pid) - cpu)


def run(variants: list[Variant], partitions: int, rounds: int, progress=print) -> dict[Variant, list[Timing]]:
    results: dict[Variant, list[Timing]] = {v: [] for v in variants}
    with postgres_for_run() as server:
        for r in range(rounds):
            for i in interleaved_order(len(variants), r):
                variant = variants[i]
                timing = run_variant(variant, partitions, server, f"bench_{r}_{i}")
                results[variant].append(timing)
                progress(f"  round {r + 1}/{rounds} {variant.label}: start {timing.start_s:.2f} s "
                         f"(coordinators {timing.coordinators_s:.2f} s), "
                         f"create {partitions} partitions {timing.create_s:.2f} s ({timing.create_cpu_s:.2f} CPU s)")
    return results


def table(partitions: int, results: dict[Variant, list[Timing]]) -> Table:
    t = Table(f"an empty broker's start, and one topic of {partitions:,} partitions created",
              ["engine, kop", "start (s)", "of which coordinators (s)", "create (s)", "partitions/s", "broker CPU s (create)"])
    for variant, timings in results.items():
        create_s = median([x.create_s for x in timings])
        t.add(variant.label, fmt(median([x.start_s for x in timings]), 2),
              fmt(median([x.coordinators_s for x in timings]), 2), fmt(create_s, 2),
              fmt(partitions / create_s), fmt(median([x.create_cpu_s for x in timings]), 2))
    t.notes.append(f"{len(next(iter(results.values())))} rounds, medians; start: process start until the Kafka port "
                   "accepts connections; coordinators: from the broker's 'loaded N topics' log line to its 'kop "
                   "listening' line")
    return t


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.create_and_start", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--against", metavar="TREE", help="also run the kop of this source tree, side by side")
    parser.add_argument("--engines", default=",".join(ENGINES), help="comma-separated, of: " + ", ".join(ENGINES))
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    trees = [None] if args.against is None else [args.against, None]
    engines = [e for e in args.engines.split(",") if e]
    if not engines or set(engines) - set(ENGINES):
        parser.error(f"--engines: one or more of {', '.join(ENGINES)}")
    variants = [Variant(tree, engine) for tree in trees for engine in engines]
    print(machine.describe())
    results = run(variants, args.partitions, args.rounds)
    table_ = table(args.partitions, results)
    print(table_.markdown() if args.markdown else table_.text())
    if args.markdown:
        print("\n".join(f"\n_{note}_" for note in table_.notes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
