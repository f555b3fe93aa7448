"""Produce throughput and ack latency: a confluent-kafka (librdkafka) producer against a real `kop standalone`.

Each run gets a fresh broker and topic. Variants (idempotence off/on x compression none/lz4) run interleaved, round
after round, so that the ratios between them are measured side by side on a noisy machine; the table shows medians
over rounds and each variant's median per-round ratio to the first one.

    python -m bench.produce --records 200000 --size 100 --rounds 3
"""
import argparse
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from bench import machine
from bench.brokers import RDKAFKA_LOG, create_topic, running_broker
from bench.procstat import cpu_seconds, run_queue_seconds
from bench.report import Table, fmt
from bench.stats import interleaved_order, median, paired_ratios, percentile

PAYLOAD_POOL = 256  # distinct values per run, so compression sees varied input


@dataclass(frozen=True, slots=True)
class ProduceSpec:
    records: int = 200_000
    record_bytes: int = 100
    partitions: int = 4
    idempotence: bool = False
    compression: str = "none"
    linger_ms: int = 5
    rate: int = 0  # records/s to pace at; 0 = as fast as the client can
    client: tuple[tuple[str, str], ...] = ()  # extra librdkafka settings, e.g. (("max.in.flight", "5"),)
    headers: str = "none"  # "sequence": kop.producer.name + kop.sequence.id; "plain": two headers as large
    producers: int = 1  # > 1: that many producer processes share the records (to load the broker, not the client)
    driver: str = "confluent-kafka"  # or "java": the Java client (integration/java/KopProduceLoad.java), one process
    timeout_s: float = 300.0

    @property
    def label(self) -> str:
        paced = f", paced {self.rate:,}/s" if self.rate else ""
        extra = "".join(f", {k}={v}" for k, v in self.client)
        headers = "" if self.headers == "none" else f", {self.headers} headers"
        producers = f", {self.producers} producer processes" if self.producers > 1 else ""
        driver = "" if self.driver == "confluent-kafka" else f", {self.driver} client"
        return (f"idempotence {'on' if self.idempotence else 'off'}, {self.compression}{paced}{extra}{headers}"
                f"{producers}{driver}")

    @property
    def shape(self) -> str:
        size = f"{self.record_bytes // 1000} KB" if self.record_bytes >= 1000 else f"{self.record_bytes} B"
        return f"{self.records:,} x {size}"


@dataclass(frozen=True, slots=True)
class ProduceResult:
    spec: ProduceSpec
    seconds: float  # first produce() to the last delivery report
    delivered: int
    failed: int
    p50_ms: float  # produce() to its delivery callback (Message.latency(), read in the callback)
    p99_ms: float
    broker_cpu_s: float
    client_cpu_s: float = float("nan")  # the producer processes' CPU while producing (all their threads)
    broker_wait_s: float = float("nan")  # the broker's threads' time runnable but waiting for a core

    @property
    def records_per_s(self) -> float:
        return self.delivered / self.seconds

    @property
    def mb_per_s(self) -> float:
        return self.delivered * self.spec.record_bytes / self.seconds / 1e6

    @property
    def broker_busy(self) -> float:
        """Share of one core the broker used while the run lasted."""
        return self.broker_cpu_s / self.seconds

    @property
    def broker_waiting(self) -> float:
        """Share of the run the broker spent waiting for a core: high on a loaded machine."""
        return self.broker_wait_s / self.seconds

    @property
    def cpu_s_per_100k(self) -> float:
        return self.broker_cpu_s / self.delivered * 100_000 if self.delivered else float("nan")

    @property
    def client_cpu_s_per_100k(self) -> float:
        return self.client_cpu_s / self.delivered * 100_000 if self.delivered else float("nan")


def payloads(record_bytes: int, seed: int = 7) -> list[bytes]:
    """Values about half compressible: random bytes followed by repeated text."""
    rng = random.Random(seed)
    half = record_bytes // 2
    filler = (b"kop benchmark record " * (record_bytes // 21 + 1))[:record_bytes - half]
    return [rng.randbytes(half) + filler for _ in range(PAYLOAD_POOL)]


# Header keys per spec.headers: the two sequence-id headers, or two others of the same size that kop does not read.
HEADER_KEYS = {"sequence": ("kop.producer.name", "kop.sequence.id"), "plain": ("app.producer.name", "app.sequence.id")}


def record_headers(spec: ProduceSpec, i: int, partition: int, producer: int = 0) -> list[tuple[str, bytes]] | None:
    """Record i's headers: name "bench/{producer}/{partition}" and id i (each name's ids rise on its partition)."""
    if spec.headers == "none":
        return None
    name_key, id_key = HEADER_KEYS[spec.headers]
    return [(name_key, b"bench/%d/%d" % (producer, partition)), (id_key, b"%d" % i)]


def all_headers(spec: ProduceSpec, count: int, producer: int = 0) -> list[list[tuple[str, bytes]] | None]:
    """Every record's headers, built before the clock starts: the run measures the broker's work on them, not the
    Python loop that would build them (librdkafka still copies them into each record)."""
    return [record_headers(spec, i, i % spec.partitions, producer) for i in range(count)]


def producer_config(bootstrap: str, spec: ProduceSpec) -> dict:
    return {"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": spec.linger_ms,
            "enable.idempotence": spec.idempotence, "compression.type": spec.compression,
            "logger": RDKAFKA_LOG, **dict(spec.client)}


class BrokerMeter:
    """The broker's CPU and run-queue wait from when it is made until `used()`."""

    def __init__(self, pid: int) -> None:
        self.pid, self.cpu, self.wait = pid, cpu_seconds(pid), run_queue_seconds(pid)

    def used(self) -> tuple[float, float]:
        return cpu_seconds(self.pid) - self.cpu, run_queue_seconds(self.pid) - self.wait


class _Sender:
    """One confluent-kafka producer, warmed up outside the clock (metadata, connections, the producer id), and the
    latency of each record it delivered."""

    def __init__(self, bootstrap: str, topic: str, spec: ProduceSpec) -> None:
        from confluent_kafka import Producer
        self.producer = Producer(producer_config(bootstrap, spec))
        self.topic, self.spec = topic, spec
        self.latencies: list[float] = []
        self.failures: list[str] = []
        for p in range(spec.partitions):
            self.producer.produce(topic, b"warm-up", partition=p)
        if self.producer.flush(30) != 0:
            raise RuntimeError("warm-up records were not delivered within 30 s")

    def _on_delivery(self, err, msg) -> None:
        if err is not None:
            self.failures.append(str(err))
        else:
            self.latencies.append(msg.latency())

    def send(self, values: list[bytes], headers: list, deadline: float) -> int:
        """Produce len(headers) records, record i to partition i % partitions, paced at spec.rate if set, and
        flush; returns how many were left undelivered."""
        spec, producer = self.spec, self.producer
        start = time.perf_counter()
        for i in range(len(headers)):
            if i % 100 == 0:
                # Delivery callbacks run only inside poll(), and the latency is read there: poll often, and when
                # pacing wait in poll() rather than sleep, so callbacks are not held back by our own loop.
                producer.poll(0)
                while spec.rate and (ahead := start + i / spec.rate - time.perf_counter()) > 0:
                    producer.poll(ahead)  # returns early when it served a callback
            while True:
                try:
                    producer.produce(self.topic, values[i % PAYLOAD_POOL], partition=i % spec.partitions,
                                     on_delivery=self._on_delivery, headers=headers[i])
                    break
                except BufferError:  # the client's queue is full: serve delivery reports until there is room
                    producer.poll(0.005)
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{spec.label}: queue still full after {spec.timeout_s}s") from None
        return producer.flush(max(1.0, deadline - time.monotonic()))

    def close(self) -> None:
        del self.producer  # closes its connections while the broker is still up


def produce(bootstrap: str, topic: str, spec: ProduceSpec, broker_pid: int) -> ProduceResult:
    """Produce spec.records to topic (round-robin over its partitions) and measure; the topic must exist."""
    if spec.driver == "java":
        return produce_with_java(bootstrap, topic, spec, broker_pid)
    if spec.producers > 1:
        return produce_in_processes(bootstrap, topic, spec, broker_pid)
    sender = _Sender(bootstrap, topic, spec)
    values = payloads(spec.record_bytes)
    headers = all_headers(spec, spec.records)
    deadline = time.monotonic() + spec.timeout_s
    broker = BrokerMeter(broker_pid)
    client_before = time.process_time()
    start = time.perf_counter()
    remaining = sender.send(values, headers, deadline)
    seconds = time.perf_counter() - start
    broker_cpu, broker_wait = broker.used()
    client_cpu = time.process_time() - client_before
    sender.close()
    if remaining:
        raise TimeoutError(f"{spec.label}: {remaining} records undelivered after {spec.timeout_s}s")
    latencies = sender.latencies
    return ProduceResult(spec, seconds, len(latencies), len(sender.failures),
                         percentile(latencies, 0.50) * 1000, percentile(latencies, 0.99) * 1000, broker_cpu,
                         client_cpu, broker_wait)


def _produce_share(bootstrap: str, topic: str, spec: ProduceSpec, producer_index: int, count: int, ready,
                   results) -> None:
    """One producer process of produce_in_processes: warm up, wait for the others (`ready`, a barrier), produce
    `count` records as fast as librdkafka takes them, and put (delivered, failed, latencies, CPU s) on `results`."""
    sender = _Sender(bootstrap, topic, spec)
    values = payloads(spec.record_bytes, seed=producer_index)
    headers = all_headers(spec, count, producer_index)
    ready.wait(60)
    deadline = time.monotonic() + spec.timeout_s
    cpu_before = time.process_time()
    remaining = sender.send(values, headers, deadline)
    cpu = time.process_time() - cpu_before
    sender.close()
    results.put((len(sender.latencies), len(sender.failures) + remaining, sender.latencies, cpu))


def produce_in_processes(bootstrap: str, topic: str, spec: ProduceSpec, broker_pid: int) -> ProduceResult:
    """spec.records shared by spec.producers producer processes, each its own confluent-kafka producer, started
    together once all are connected: enough clients that the broker, not one Python loop, sets the pace."""
    import multiprocessing
    if spec.rate:
        raise ValueError("pacing is for one producer process")
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: no librdkafka threads forked
    ready, results = context.Barrier(spec.producers + 1), context.Queue()
    share = spec.records // spec.producers
    workers = [context.Process(target=_produce_share, args=(bootstrap, topic, spec, w, share, ready, results))
               for w in range(spec.producers)]
    for worker in workers:
        worker.start()
    try:
        ready.wait(120)
        broker = BrokerMeter(broker_pid)
        start = time.perf_counter()
        shares = [results.get(timeout=spec.timeout_s + 30) for _ in workers]
        seconds = time.perf_counter() - start
        broker_cpu, broker_wait = broker.used()
    finally:
        for worker in workers:
            worker.join(30)
            if worker.is_alive():
                worker.kill()
    latencies = [latency for _d, _f, share_latencies, _c in shares for latency in share_latencies]
    failed = sum(f for _d, f, _l, _c in shares)
    if failed:
        raise RuntimeError(f"{spec.label}: {failed} records failed or undelivered")
    return ProduceResult(spec, seconds, sum(d for d, _f, _l, _c in shares), failed,
                         percentile(latencies, 0.50) * 1000, percentile(latencies, 0.99) * 1000, broker_cpu,
                         sum(c for _d, _f, _l, c in shares), broker_wait)


def produce_with_java(bootstrap: str, topic: str, spec: ProduceSpec, broker_pid: int) -> ProduceResult:
    """spec.records from the Java client (KopProduceLoad.java, built by `make java`), which costs far less CPU per
    record than a Python loop: the clock runs from the moment it is told to start, once warmed up."""
    import json
    import subprocess
    from integration import java_harness
    from integration.java_client import JVM_OPTIONS
    if spec.rate or spec.client:
        raise ValueError("the Java load takes no pacing and no librdkafka settings")
    props = {"acks": "all", "linger.ms": spec.linger_ms, "enable.idempotence": str(spec.idempotence).lower(),
             "compression.type": spec.compression}
    command = ["java", *JVM_OPTIONS, "-cp", java_harness.classpath(), "KopProduceLoad", "--bootstrap", bootstrap,
               "--topic", topic, "--count", str(spec.records), "--size", str(spec.record_bytes),
               "--partitions", str(spec.partitions), "--headers", spec.headers,
               *(arg for k, v in props.items() for arg in ("--prop", f"{k}={v}"))]
    with subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as load:
        try:
            assert load.stdin is not None and load.stdout is not None
            ready = load.stdout.readline()
            if json.loads(ready or "{}").get("type") != "ready":
                raise RuntimeError(f"the Java load did not start: {ready!r}")
            broker = BrokerMeter(broker_pid)
            load.stdin.write("go\n")
            load.stdin.flush()
            summary = json.loads(load.stdout.readline() or "{}")
            broker_cpu, broker_wait = broker.used()
            load.wait(spec.timeout_s)
        finally:
            if load.poll() is None:
                load.kill()
    if summary.get("type") != "summary":
        raise RuntimeError(f"the Java load ended without a summary: {summary!r}")
    if summary["failed"] or summary["acked"] != spec.records:
        raise RuntimeError(f"{spec.label}: {summary['failed']} failed, {summary['acked']} of {spec.records} acked")
    return ProduceResult(spec, summary["seconds"], summary["acked"], summary["failed"], summary["p50_ms"],
                         summary["p99_ms"], broker_cpu, summary["cpu_s"], broker_wait)


def produce_on_fresh_broker(spec: ProduceSpec, broker_config: dict[str, str] | None = None,
                            topic: str = "bench-produce", tree: str | None = None) -> ProduceResult:
    with running_broker(broker_config, tree=tree) as broker:
        create_topic(broker.bootstrap, topic, spec.partitions)
        return produce(broker.bootstrap, topic, spec, broker.proc.pid)


def run_interleaved(specs: Sequence[ProduceSpec], rounds: int, broker_configs: Sequence[dict] | None = None,
                    progress=print, labels: Sequence[str] | None = None,
                    trees: Sequence[str | None] | None = None) -> list[list[ProduceResult]]:
    """results[v][r]: variant v in round r. Round r runs the variants forward or backward (ABBA). `trees`: per
    variant, another source tree whose kop to run (None: this one)."""
    configs = list(broker_configs) if broker_configs else [{}] * len(specs)
    trees = list(trees) if trees else [None] * len(specs)
    labels = list(labels) if labels else [s.label for s in specs]
    results: list[list[ProduceResult]] = [[] for _ in specs]
    for r in range(rounds):
        for v in interleaved_order(len(specs), r):
            result = produce_on_fresh_broker(specs[v], configs[v], tree=trees[v])
            results[v].append(result)
            progress(f"  round {r + 1}/{rounds} {specs[v].shape} {labels[v]}: {result.records_per_s:,.0f} rec/s, "
                     f"broker {result.cpu_s_per_100k:.2f} CPU s/100k ({result.broker_busy:.0%} busy, "
                     f"{result.broker_waiting:.0%} waiting for a core), "
                     f"client {result.client_cpu_s_per_100k:.2f} CPU s/100k")
    return results


def table(results: list[list[ProduceResult]], title: str, labels: Sequence[str] | None = None) -> Table:
    """Medians over rounds; 'vs first' is the median per-round throughput ratio to the first variant."""
    t = Table(title, ["variant", "records", "rec/s", "MB/s", "p50 ms", "p99 ms", "broker CPU s",
                      "broker busy", "broker waiting", "CPU s/100k rec", "client CPU s/100k rec", "rec/s vs first",
                      "CPU/rec vs first"])
    baseline = results[0]
    for i, runs in enumerate(results):
        rate_ratio = median(paired_ratios([r.records_per_s for r in runs], [b.records_per_s for b in baseline]))
        cpu_ratio = median(paired_ratios([r.cpu_s_per_100k for r in runs], [b.cpu_s_per_100k for b in baseline]))
        t.add(labels[i] if labels else runs[0].spec.label, runs[0].spec.shape,
              fmt(median([r.records_per_s for r in runs])), fmt(median([r.mb_per_s for r in runs]), 1),
              fmt(median([r.p50_ms for r in runs]), 1), fmt(median([r.p99_ms for r in runs]), 1),
              fmt(median([r.broker_cpu_s for r in runs]), 2),
              f"{median([r.broker_busy for r in runs]):.0%}", f"{median([r.broker_waiting for r in runs]):.0%}",
              fmt(median([r.cpu_s_per_100k for r in runs]), 2),
              fmt(median([r.client_cpu_s_per_100k for r in runs]), 2), f"{rate_ratio:.3f}", f"{cpu_ratio:.3f}")
    failed = sum(r.failed for runs in results for r in runs)
    t.notes.append(f"{len(results[0])} rounds, medians; failed deliveries: {failed}")
    return t


VARIANTS = [(False, "none"), (True, "none"), (False, "lz4"), (True, "lz4")]


def variant_specs(base: ProduceSpec) -> list[ProduceSpec]:
    return [replace(base, idempotence=idem, compression=comp) for idem, comp in VARIANTS]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.produce", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=100, help="record value bytes")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--linger-ms", type=int, default=5)
    parser.add_argument("--rate", type=int, default=0, help="pace at this many records/s (0 = unpaced)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--client", action="append", default=[], metavar="KEY=VALUE",
                        help="extra librdkafka setting for every variant (repeatable)")
    choices = "; ".join(f"{i}=idempotence {'on' if idem else 'off'} {comp}" for i, (idem, comp) in enumerate(VARIANTS))
    parser.add_argument("--variants", default="all", help=f"comma-separated indexes into: {choices}")
    parser.add_argument("--fsync", choices=["true", "false"], default="true", help="broker fsync (default true)")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    client = tuple(tuple(kv.split("=", 1)) for kv in args.client)
    base = ProduceSpec(args.records, args.size, args.partitions, linger_ms=args.linger_ms, rate=args.rate,
                       client=client)
    specs = variant_specs(base)
    if args.variants != "all":
        specs = [specs[int(i)] for i in args.variants.split(",")]
    results = run_interleaved(specs, args.rounds, [{"fsync": args.fsync}] * len(specs))
    t = table(results, f"produce ({machine.describe()}, fsync={args.fsync})")
    print(t.markdown() if args.markdown else t.text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
