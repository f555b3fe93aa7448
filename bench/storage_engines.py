"""The PostgreSQL engine against the file engine, same run: produce and consume throughput, and CPU per MB of the
broker and (for PostgreSQL) of the database server.

Each round runs both engines one after the other (ABBA order over rounds), each on a fresh broker and topic (a fresh
database for PostgreSQL, on one server started for the whole run from Debian's binaries, fsync on). The producer is
confluent-kafka with idempotence on, acks=all; the consumer reads everything from the beginning with assign().

    python -m bench.storage_engines --records 200000 --size 100 --rounds 3
"""
import argparse
import os
from dataclasses import dataclass, replace

from bench import machine
from bench.brokers import create_topic, postgres_for_run, running_broker
from bench.consume import ConsumeResult, consume_all
from bench.procstat import cpu_seconds
from bench.produce import ProduceResult, ProduceSpec, produce
from bench.report import Table, fmt
from bench.stats import interleaved_order, median
from integration.postgres_server import PostgresServer

ENGINES = ("file", "postgresql")


@dataclass(frozen=True, slots=True)
class EngineRun:
    engine: str
    produced: ProduceResult
    produce_db_cpu_s: float  # the PostgreSQL server's CPU while producing (0 for the file engine)
    consumed: ConsumeResult
    consume_db_cpu_s: float


def server_cpu_seconds(server: PostgresServer | None) -> float:
    """CPU seconds of the PostgreSQL postmaster and all its children (one backend per connection)."""
    if server is None:
        return 0.0
    with open(os.path.join(server.data, "postmaster.pid")) as f:
        postmaster = int(f.readline())
    total = cpu_seconds(postmaster)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2:].split()[1]) == postmaster:
                total += cpu_seconds(int(entry))
    return total


def run_engine(engine: str, spec: ProduceSpec, server: PostgresServer, database: str) -> EngineRun:
    db = server if engine == "postgresql" else None
    config = {"storage": server.create_database(database)} if db is not None else {}
    topic = "bench-engines"
    with running_broker(config) as broker:
        create_topic(broker.bootstrap, topic, spec.partitions)
        before = server_cpu_seconds(db)
        produced = produce(broker.bootstrap, topic, spec, broker.proc.pid)
        middle = server_cpu_seconds(db)
        consumed = consume_all(broker.bootstrap, topic, spec.partitions, produced.delivered + spec.partitions,
                               broker.proc.pid)
        after = server_cpu_seconds(db)
    return EngineRun(engine, produced, middle - before, consumed, after - middle)


def run(spec: ProduceSpec, rounds: int, progress=print) -> dict[str, list[EngineRun]]:
    results: dict[str, list[EngineRun]] = {e: [] for e in ENGINES}
    with postgres_for_run() as server:
        for r in range(rounds):
            for i in interleaved_order(len(ENGINES), r):
                engine = ENGINES[i]
                result = run_engine(engine, spec, server, f"bench_{r}_{engine}")
                results[engine].append(result)
                progress(f"  round {r + 1}/{rounds} {spec.shape} {engine}: produce "
                         f"{result.produced.records_per_s:,.0f} rec/s, consume "
                         f"{result.consumed.records_per_s:,.0f} rec/s")
    return results


def table(spec: ProduceSpec, results: dict[str, list[EngineRun]]) -> Table:
    t = Table(f"{spec.shape}, {spec.partitions} partitions, {spec.label}",
              ["engine", "produce rec/s", "produce MB/s", "broker CPU s/MB", "PostgreSQL CPU s/MB",
               "consume rec/s", "consume MB/s", "broker CPU s/MB (consume)", "PostgreSQL CPU s/MB (consume)"])
    for engine, runs in results.items():
        mb = spec.records * spec.record_bytes / 1e6
        t.add(engine, fmt(median([r.produced.records_per_s for r in runs])),
              fmt(median([r.produced.mb_per_s for r in runs]), 1),
              fmt(median([r.produced.broker_cpu_s / mb for r in runs]), 3),
              fmt(median([r.produce_db_cpu_s / mb for r in runs]), 3),
              fmt(median([r.consumed.records_per_s for r in runs])),
              fmt(median([r.consumed.mb_per_s for r in runs]), 1),
              fmt(median([r.consumed.broker_cpu_s / mb for r in runs]), 3),
              fmt(median([r.consume_db_cpu_s / mb for r in runs]), 3))
    failed = sum(r.produced.failed for runs in results.values() for r in runs)
    t.notes.append(f"{len(next(iter(results.values())))} rounds, medians; failed deliveries: {failed}")
    return t


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.storage_engines", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    spec = replace(ProduceSpec(args.records, args.size, args.partitions), idempotence=True)
    print(machine.describe())
    results = run(spec, args.rounds)
    table_ = table(spec, results)
    print(table_.markdown() if args.markdown else table_.text())
    if args.markdown:  # text() carries its notes already
        print("\n".join(f"\n_{note}_" for note in table_.notes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
