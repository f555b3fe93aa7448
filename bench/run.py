"""Run kop's benchmarks and print their tables.

    python -m bench.run                 # quick set: produce, consume, dedup overhead (a few minutes)
    python -m bench.run --full          # bigger runs, more rounds, and recovery after kill -9 with 1M entries
    python -m bench.run --markdown      # tables as Markdown, ready for BENCHMARKS.md
    python -m bench.run --only dedup    # one or more of: peers, produce, latency, consume, dedup, recovery, commits
"""
import argparse
import os
import sys
import time
from dataclasses import dataclass, replace

from bench import bench_commits, consume, dedup_core, dedup_overhead, machine, peers, produce, recovery
from bench.bench_commits import CommitSpec
from bench.produce import ProduceSpec
from bench.report import Table

SECTIONS = ["peers", "produce", "latency", "consume", "dedup", "recovery", "commits"]


@dataclass(frozen=True, slots=True)
class Plan:
    produce_small: ProduceSpec  # 100 B records
    produce_large: ProduceSpec  # 10 KB records
    produce_rounds: int
    paced: ProduceSpec  # ack latency at a steady rate below saturation
    consume_small: ProduceSpec
    consume_large: ProduceSpec
    consume_rounds: int
    dedup_records: int
    dedup_single_records: int
    dedup_rounds: int
    recovery_checkpoints: tuple[int, ...]
    recovery_restarts: int
    commits: tuple[CommitSpec, ...]  # consumer-group offset commits: many groups, few partitions, and the reverse
    commit_rounds: int
    peers_scale: float  # of bench.peers' workloads (kop beside Tansu)
    peers_rounds: int


# one consumer's commitSync (latency of one durable commit), then throughput with many groups or many partitions
COMMIT_CASES = (CommitSpec(1, 1, window=1), CommitSpec(50, 4), CommitSpec(200, 1), CommitSpec(10, 100))


QUICK = Plan(produce_small=ProduceSpec(500_000, 100), produce_large=ProduceSpec(40_000, 10_000), produce_rounds=3,
             paced=ProduceSpec(60_000, 100, idempotence=True, rate=20_000),
             consume_small=ProduceSpec(500_000, 100), consume_large=ProduceSpec(40_000, 10_000), consume_rounds=3,
             dedup_records=1_000_000, dedup_single_records=10_000, dedup_rounds=7,
             recovery_checkpoints=(), recovery_restarts=0, commits=COMMIT_CASES, commit_rounds=1,
             peers_scale=0.5, peers_rounds=3)
FULL = Plan(produce_small=ProduceSpec(1_000_000, 100), produce_large=ProduceSpec(100_000, 10_000), produce_rounds=5,
            paced=ProduceSpec(200_000, 100, idempotence=True, rate=20_000),
            consume_small=ProduceSpec(2_000_000, 100), consume_large=ProduceSpec(100_000, 10_000), consume_rounds=5,
            dedup_records=1_000_000, dedup_single_records=30_000, dedup_rounds=7,
            recovery_checkpoints=(1_000, 100_000, 1_000_000), recovery_restarts=3, commits=COMMIT_CASES,
            commit_rounds=3, peers_scale=1.0, peers_rounds=3)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_peers(plan: Plan) -> list[Table]:
    log(f"kop beside Tansu, {plan.peers_rounds} rounds")
    return [peers.table(peers.run(plan.peers_rounds, plan.peers_scale, progress=log))]


def run_produce(plan: Plan) -> list[Table]:
    tables = []
    for base in (plan.produce_small, plan.produce_large):
        log(f"produce {base.shape}: idempotence off/on x compression none/lz4, {plan.produce_rounds} rounds")
        results = produce.run_interleaved(produce.variant_specs(base), plan.produce_rounds, progress=log)
        tables.append(produce.table(results, f"Produce, {base.shape}, acks=all, linger.ms 5, 4 partitions"))
    return tables


def run_latency(plan: Plan) -> list[Table]:
    specs = [replace(plan.paced, idempotence=False), plan.paced]
    log(f"ack latency paced at {plan.paced.rate:,} records/s, {plan.produce_rounds} rounds")
    results = produce.run_interleaved(specs, plan.produce_rounds, progress=log)
    return [produce.table(results, f"Produce ack latency below saturation, {plan.paced.shape}")]


def run_consume(plan: Plan) -> list[Table]:
    runs = []
    for spec in (plan.consume_small, plan.consume_large):
        log(f"consume {spec.shape}, {plan.consume_rounds} rounds")
        runs.append((spec, consume.run(spec.records, spec.record_bytes, spec.partitions, plan.consume_rounds,
                                       progress=log)))
    return [consume.table(runs, "Consume from the beginning, assign(), 4 partitions")]


def run_dedup(plan: Plan) -> list[Table]:
    log(f"dedup overhead, {plan.dedup_rounds} rounds")
    overheads = [dedup_overhead.measure(w, plan.dedup_rounds, progress=log)
                 for w in dedup_overhead.workloads(plan.dedup_records, plan.dedup_single_records)]
    title = "Dedup overhead: idempotent producer, brokerDeduplicationEnabled off vs on"
    core = dedup_core.measure(batches=200_000, producers=4, rounds=5)
    return [dedup_overhead.table(overheads, title), dedup_core.table(core)]


def run_recovery(plan: Plan) -> list[Table]:
    if not plan.recovery_checkpoints:
        return []
    log(f"recovery after kill -9 at {', '.join(f'{c:,}' for c in plan.recovery_checkpoints)} entries")
    result = recovery.run(list(plan.recovery_checkpoints), plan.recovery_restarts, progress=log)
    return [recovery.table(result, "Recovery after kill -9: process start to first acknowledged produce")]


def run_commits(plan: Plan) -> list[Table]:
    runs = []
    for spec in plan.commits:
        log(f"offset commits, {spec.shape}, {plan.commit_rounds} round(s) of {spec.seconds:.0f} s")
        results = []
        for r in range(plan.commit_rounds):
            results.append(bench_commits.measure(spec))
            log(f"  round {r + 1}/{plan.commit_rounds}: {results[-1].line()}")
        runs.append((spec, results))
    return [bench_commits.table(runs, "OffsetCommit throughput, durable (fsync on), one socket per group")]


RUNNERS = {"peers": run_peers, "produce": run_produce, "latency": run_latency, "consume": run_consume, "dedup": run_dedup,
           "recovery": run_recovery, "commits": run_commits}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--full", action="store_true", help="bigger runs, more rounds, and the recovery benchmark")
    parser.add_argument("--markdown", action="store_true", help="print Markdown tables for BENCHMARKS.md")
    parser.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated subset of {SECTIONS}")
    args = parser.parse_args(argv)
    sections = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in sections if s not in RUNNERS]
    if unknown:
        parser.error(f"unknown sections {unknown}; choose from {SECTIONS}")
    plan = FULL if args.full else QUICK
    command = "python -m bench.run " + " ".join(a for a in (argv if argv is not None else sys.argv[1:]))
    started = time.monotonic()
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    header = (f"{command.strip()} | {machine.today()} | {machine.describe()} | {machine.source_tree(repo)} | "
              f"load average at start {os.getloadavg()[0]:.1f}")
    print(f"<!-- {header} -->" if args.markdown else header, flush=True)
    for section in sections:
        for t in RUNNERS[section](plan):
            if args.markdown:
                print(f"\n**{t.title}**\n\n{t.markdown()}\n")
                print("\n".join(f"_{n}_" for n in t.notes))
            else:
                print(f"\n{t.text()}")
            sys.stdout.flush()
    footer = f"done in {time.monotonic() - started:,.0f} s, load average at end {os.getloadavg()[0]:.1f}"
    print(f"<!-- {footer} -->" if args.markdown else footer)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
