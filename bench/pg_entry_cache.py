"""The PostgreSQL engine's entry cache bounded against unbounded: a broker's memory after it takes over a large set
of partitions, and a cold read of all of them from offset 0.

One broker loads a topic into a fresh database and stops. Then, each round, a broker with the cache bounded
(`managed.ledger.cache.bytes`) and one holding every entry (`-1`) take the partitions over in turn (ABBA order over
rounds): the time from the start of the process to /ready (every partition loaded), its resident memory (VmRSS) then,
a confluent-kafka consumer reading every partition from offset 0 (assign(), no group), and the memory after that
read; the cache's own byte count from /metrics beside it.

    python -m bench.pg_entry_cache --records 40000 --size 10000 --partitions 16 --cache-mb 32 --rounds 3
"""
import argparse
import shutil
import tempfile
import time
import urllib.request
from dataclasses import dataclass, replace

from prometheus_client.parser import text_string_to_metric_families

from bench import machine
from bench.brokers import create_topic, postgres_for_run, running_broker
from bench.consume import ConsumeResult, consume_all
from bench.procstat import rss_bytes
from bench.produce import ProduceSpec, produce
from bench.report import Table, fmt, print_tables
from bench.stats import interleaved_order, median
from integration.broker_process import BrokerProcess

TOPIC = "bench-entry-cache"
MiB = 1 << 20


@dataclass(frozen=True, slots=True)
class TakeoverRun:
    mode: str
    ready_s: float  # process start to /ready 200
    rss_ready: int
    cache_ready: int  # the entry cache's bytes (kop_managed_ledger_cache_bytes) at /ready
    consumed: ConsumeResult
    rss_read: int  # after the cold read
    cache_read: int


def http_get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""
    except OSError:
        return 0, b""


def cache_bytes(broker: BrokerProcess) -> int:
    _, body = http_get(broker.admin_url + "/metrics")
    for family in text_string_to_metric_families(body.decode()):
        if family.name == "kop_managed_ledger_cache_bytes":
            return int(family.samples[0].value)
    return -1


def take_over(mode: str, cache: str, database: str, spec: ProduceSpec, expected: int) -> TakeoverRun:
    root = tempfile.mkdtemp(prefix="kop-bench-")
    broker = BrokerProcess(f"{root}/data", admin_port=0, config={"storage": database,
                                                                 "managed.ledger.cache.bytes": cache})
    try:
        started = time.perf_counter()
        broker.start(timeout=300)
        deadline = time.monotonic() + 300
        while http_get(broker.admin_url + "/ready")[0] != 200:
            if time.monotonic() > deadline:
                raise TimeoutError("the broker was not ready within 300 s")
            time.sleep(0.05)
        ready_s = time.perf_counter() - started
        rss_ready, cache_ready = rss_bytes(broker.proc.pid), cache_bytes(broker)
        consumed = consume_all(broker.bootstrap, TOPIC, spec.partitions, expected, broker.proc.pid)
        return TakeoverRun(mode, ready_s, rss_ready, cache_ready, consumed, rss_bytes(broker.proc.pid),
                           cache_bytes(broker))
    finally:
        broker.stop()
        shutil.rmtree(root, ignore_errors=True)


def run(spec: ProduceSpec, cache_mb: int, rounds: int, progress=print) -> dict[str, list[TakeoverRun]]:
    modes = {f"bounded ({cache_mb} MiB)": str(cache_mb * MiB), "unbounded (-1)": "-1"}
    results: dict[str, list[TakeoverRun]] = {mode: [] for mode in modes}
    with postgres_for_run() as server:
        database = server.create_database("bench_entry_cache")
        with running_broker({"storage": database}) as loader:
            create_topic(loader.bootstrap, TOPIC, spec.partitions)
            produced = produce(loader.bootstrap, TOPIC, spec, loader.proc.pid)
        progress(f"  loaded {produced.delivered:,} records ({produced.delivered * spec.record_bytes / 1e6:,.0f} MB)")
        expected = produced.delivered + spec.partitions  # and the warm-up records
        names = list(modes)
        for r in range(rounds):
            for i in interleaved_order(len(names), r):
                result = take_over(names[i], modes[names[i]], database, spec, expected)
                results[names[i]].append(result)
                progress(f"  round {r + 1}/{rounds} {names[i]}: ready {result.ready_s:.1f} s, RSS "
                         f"{result.rss_ready / MiB:,.0f} MiB, read {result.consumed.mb_per_s:,.1f} MB/s, RSS "
                         f"{result.rss_read / MiB:,.0f} MiB")
    return results


def table(spec: ProduceSpec, results: dict[str, list[TakeoverRun]]) -> Table:
    t = Table(f"takeover of {spec.shape} over {spec.partitions} partitions, then a cold read from offset 0",
              ["cache", "ready s", "RSS at ready MiB", "cache at ready MiB", "cold read MB/s", "cold read rec/s",
               "RSS after read MiB", "cache after read MiB"])
    for mode, runs in results.items():
        t.add(mode, fmt(median([r.ready_s for r in runs]), 1), fmt(median([r.rss_ready / MiB for r in runs])),
              fmt(median([r.cache_ready / MiB for r in runs]), 1), fmt(median([r.consumed.mb_per_s for r in runs]), 1),
              fmt(median([r.consumed.records_per_s for r in runs])), fmt(median([r.rss_read / MiB for r in runs])),
              fmt(median([r.cache_read / MiB for r in runs]), 1))
    t.notes.append(f"{len(next(iter(results.values())))} rounds, medians")  # text() shows it; BENCHMARKS.md says it
    return t


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pg_entry_cache", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=40_000)
    parser.add_argument("--size", type=int, default=10_000)
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--cache-mb", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    spec = replace(ProduceSpec(args.records, args.size, args.partitions), idempotence=True)
    print(machine.describe())
    results = run(spec, args.cache_mb, args.rounds)
    print_tables([table(spec, results)], args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
