"""Recovery time after kill -9: from starting the broker again to the first acknowledged produce on a partition
that holds many entries (one entry per idempotent batch), measured as the partition grows.

The partition is loaded by bench.pipelined_producer (single-record idempotent batches, several producers). At each
checkpoint the broker is killed with SIGKILL right after the last acknowledgement and started again, while a probe
sends the next batch of one of the producers (same producer id, epoch and next sequence, as a real idempotent
producer resumes) until it is acknowledged. A retriable error is retried; a sequence error would mean the dedup state
was not rebuilt, and is reported. Recovery should be bounded by the dedup snapshot interval (replay of the entries
after the last snapshot), not by the log's length. Goal: under 1 s.

    python -m bench.recovery --checkpoints 1000,100000,1000000 --restarts 3
"""
import argparse
import asyncio
import os
import re
import shutil
import socket
import struct
import tempfile
import threading
import time
from dataclasses import dataclass

from bench import machine
from bench.brokers import create_topic
from bench.pipelined_producer import BatchTemplate, PipelinedProducer, RequestTemplate, load_partition
from bench.procstat import directory_bytes
from bench.report import Table, fmt
from bench.stats import median
from integration.broker_process import BrokerProcess, free_port
from protocol.errors import ErrorCode

TOPIC = "bench-recovery"
GOAL_S = 1.0
# Produce errors a restarting broker may answer before the partition is ready; the probe retries them.
RETRIABLE = frozenset({ErrorCode.LEADER_NOT_AVAILABLE, ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.REQUEST_TIMED_OUT,
                       ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.KAFKA_STORAGE_ERROR,
                       ErrorCode.NOT_ENOUGH_REPLICAS, ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND})


@dataclass(frozen=True, slots=True)
class Restart:
    listening_s: float  # process start to the first accepted TCP connection
    first_ack_s: float  # process start to the first successful produce acknowledgement
    retriable_errors: int
    fatal_error: int  # NONE, or the Kafka error code that ended the probe (e.g. OUT_OF_ORDER_SEQUENCE_NUMBER)
    replayed: int | None  # entries the dedup recovery replayed after its snapshot (from the broker's log)
    producers: int | None  # producers the dedup state held after recovery (from the broker's log)


@dataclass(frozen=True, slots=True)
class Checkpoint:
    entries: int
    data_bytes: int
    load_s: float  # time to write the entries added since the previous checkpoint
    loaded: int
    restarts: list[Restart]


@dataclass(frozen=True, slots=True)
class RecoveryRun:
    empty_start_s: list[float]  # process start to listening with an empty data directory, per try
    checkpoints: list[Checkpoint]


def _probe_once(port: int, request: bytes, error_code_at: int, timeout_s: float) -> int:
    """Connect, send one produce request, return its error code; raises OSError if not (yet) possible."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.settimeout(timeout_s)
        sock.sendall(request)
        header = _recv_exact(sock, 4)
        frame = _recv_exact(sock, struct.unpack(">i", header)[0])
        return struct.unpack_from(">h", frame, error_code_at)[0]


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionResetError("broker closed the connection")
        buf += chunk
    return bytes(buf)


_REPLAYED = re.compile(rb"dedup replayed (\d+) entries")
_PRODUCERS = re.compile(rb"dedup enabled, (\d+) producers")


def _log_size(broker: BrokerProcess) -> int:
    try:
        return os.path.getsize(broker.log_path)
    except OSError:
        return 0


def _dedup_log_figures(broker: BrokerProcess, since: int) -> tuple[int | None, int | None]:
    """What the dedup core logged about its recovery after byte `since` of the broker's log (None if it did not)."""
    try:
        with open(broker.log_path, "rb") as f:
            f.seek(since)
            text = f.read()
    except OSError:
        return None, None
    replayed, producers = _REPLAYED.findall(text), _PRODUCERS.findall(text)
    return (sum(int(x) for x in replayed) if replayed else None,
            sum(int(x) for x in producers) if producers else None)


def _start_in_background(broker: BrokerProcess, timeout_s: float) -> tuple[threading.Thread, list[BaseException]]:
    """broker.start() in a thread, so the caller can probe the port more often than start() polls it."""
    failures: list[BaseException] = []

    def start() -> None:
        try:
            broker.start(timeout=timeout_s)
        except BaseException as exc:  # the caller checks the list
            failures.append(exc)

    thread = threading.Thread(target=start, daemon=True)
    thread.start()
    return thread, failures


def empty_broker_start_s(timeout_s: float = 60.0) -> float:
    """Process start to the first accepted connection of a broker with an empty data directory: the part of every
    restart that is Python start-up and imports rather than recovery."""
    root = tempfile.mkdtemp(prefix="kop-bench-empty-")
    broker = BrokerProcess(os.path.join(root, "data"), port=free_port())
    try:
        t0 = time.perf_counter()
        starter, failures = _start_in_background(broker, timeout_s)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not failures:
            try:
                socket.create_connection(("127.0.0.1", broker.port), timeout=1.0).close()
                elapsed = time.perf_counter() - t0
                starter.join(timeout_s)
                return elapsed
            except OSError:
                time.sleep(0.002)
        raise RuntimeError(f"empty broker did not listen: {failures[0] if failures else 'timeout'}")
    finally:
        broker.stop()
        shutil.rmtree(root, ignore_errors=True)


def restart_and_probe(broker: BrokerProcess, producer: PipelinedProducer, timeout_s: float = 120.0) -> Restart:
    """kill -9 the broker, start it again and time the first acknowledged produce of producer's next sequence."""
    broker.kill()
    log_from = _log_size(broker)
    batch = BatchTemplate(producer.identity, producer.value).batch(producer.next_sequence)
    template = RequestTemplate(TOPIC, producer.partition, bytes(batch))
    request = template.request(1, bytes(batch))
    t0 = time.perf_counter()
    starter, started = _start_in_background(broker, timeout_s)
    listening = None
    retriable = 0
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if started:
                raise RuntimeError(f"broker did not start: {started[0]}")
            try:
                code = _probe_once(broker.port, request, template.error_code_at, timeout_s=10.0)
            except OSError:
                time.sleep(0.002)
                continue
            listening = listening or time.perf_counter() - t0
            if code == ErrorCode.NONE or code not in RETRIABLE:
                elapsed = time.perf_counter() - t0
                producer.next_sequence += 1 if code == ErrorCode.NONE else 0
                return Restart(listening, elapsed, retriable, code, *_dedup_log_figures(broker, log_from))
            retriable += 1
            time.sleep(0.002)
        raise TimeoutError(f"no acknowledged produce within {timeout_s}s of the restart")
    finally:
        starter.join(timeout_s)


async def _grow(producers: list[PipelinedProducer], port: int, count: int):
    """Connect the producers (new producer ids the first time, then resuming their sequences), write count entries
    spread over them, disconnect. Streams belong to one event loop, so all of it runs in one asyncio.run."""
    for p in producers:
        p.port = port
    await asyncio.gather(*(p.connect(p.identity) for p in producers))
    try:
        return await load_partition("127.0.0.1", port, TOPIC, 0, count, producers=producers)
    finally:
        await asyncio.gather(*(p.close() for p in producers))


def run(checkpoints: list[int], restarts: int, connections: int = 32, broker_config: dict[str, str] | None = None,
        keep: bool = False, tail: int = 999, progress=print) -> "RecoveryRun":
    """Grow one partition to each checkpoint's entry count; at each, kill -9 and restart `restarts` times, each time
    after writing `tail` more entries (999: one short of the default snapshot interval, the longest replay)."""
    baseline = [empty_broker_start_s() for _ in range(max(1, restarts))]
    progress(f"  an empty broker listens after {median(baseline) * 1000:,.0f} ms (median of {len(baseline)})")
    root = tempfile.mkdtemp(prefix="kop-bench-recovery-")
    broker = BrokerProcess(os.path.join(root, "data"), config=dict(broker_config or {}))
    results = []
    try:
        broker.start()
        create_topic(broker.bootstrap, TOPIC, 1)
        producers = [PipelinedProducer("127.0.0.1", broker.port, TOPIC) for _ in range(connections)]
        entries = 0
        for target in sorted(checkpoints):
            loaded = asyncio.run(_grow(producers, broker.port, max(0, target - entries)))
            entries = max(entries, target)
            size = directory_bytes(broker.data_dir)
            progress(f"  {entries:,} entries ({size / 1e6:,.0f} MB): loaded {loaded.entries:,} in "
                     f"{loaded.seconds:.1f}s ({loaded.entries_per_s:,.0f}/s)")
            rounds = []
            for i in range(restarts):
                if tail:
                    entries += asyncio.run(_grow(producers, broker.port, tail)).entries
                restart = restart_and_probe(broker, producers[i % len(producers)])
                entries += 1 if restart.fatal_error == 0 else 0
                rounds.append(restart)
                progress(f"    restart {i + 1}/{restarts}: listening after {restart.listening_s * 1000:,.0f} ms, "
                         f"first ack after {restart.first_ack_s * 1000:,.0f} ms; dedup replayed {restart.replayed} "
                         f"entries, {restart.producers} producers"
                         + (f", ended by error {restart.fatal_error}" if restart.fatal_error else ""))
            results.append(Checkpoint(entries, directory_bytes(broker.data_dir), loaded.seconds, loaded.entries,
                                      rounds))
        return RecoveryRun(baseline, results)
    finally:
        broker.stop()
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
        else:
            progress(f"  data kept in {root}")


def table(result: RecoveryRun, title: str) -> Table:
    checkpoints = result.checkpoints
    t = Table(title, ["entries", "data", "load", "listening ms", "first ack ms", "first ack max ms",
                      "retried", "dedup replayed", "producers", f"< {GOAL_S:g} s"])
    for c in checkpoints:
        ok = [r for r in c.restarts if r.fatal_error == ErrorCode.NONE]
        first_ack = median([r.first_ack_s * 1000 for r in ok])
        t.add(f"{c.entries:,}", f"{c.data_bytes / 1e6:,.0f} MB",
              f"{c.loaded:,} in {c.load_s:,.0f} s", fmt(median([r.listening_s * 1000 for r in c.restarts])),
              fmt(first_ack), fmt(max((r.first_ack_s * 1000 for r in ok), default=float("nan"))),
              str(sum(r.retriable_errors for r in c.restarts)),
              "/".join("-" if r.replayed is None else str(r.replayed) for r in c.restarts),
              "/".join("-" if r.producers is None else str(r.producers) for r in c.restarts),
              "yes" if ok and len(ok) == len(c.restarts) and first_ack < GOAL_S * 1000 else "no")
        failed = [r.fatal_error for r in c.restarts if r.fatal_error]
        if failed:
            t.notes.append(f"{c.entries:,} entries: probes ended by error codes {failed}")
    t.notes.append(f"{len(checkpoints[0].restarts)} kill -9 restarts per checkpoint, medians; one entry = one "
                   "single-record idempotent batch; times from process start (Python start-up included); "
                   "'entries' counts the log at the last restart")
    t.notes.append(f"for comparison, a broker with an empty data directory listens after "
                   f"{median(result.empty_start_s) * 1000:,.0f} ms (median of {len(result.empty_start_s)}): Python "
                   "start-up and imports, paid by every restart")
    return t


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.recovery", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoints", default="1000,100000,1000000",
                        help="comma-separated entry counts at which to kill and restart")
    parser.add_argument("--restarts", type=int, default=3)
    parser.add_argument("--connections", type=int, default=32, help="loading producers (one connection each)")
    parser.add_argument("--tail", type=int, default=999,
                        help="entries written just before each kill (999: one short of a dedup snapshot)")
    parser.add_argument("--fsync", choices=["true", "false"], default="true")
    parser.add_argument("--keep", action="store_true", help="keep the data directory")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    checkpoints = [int(x) for x in args.checkpoints.split(",")]
    results = run(checkpoints, args.restarts, args.connections, {"fsync": args.fsync}, keep=args.keep,
                  tail=args.tail)
    t = table(results, f"recovery after kill -9 ({machine.describe()}, fsync={args.fsync})")
    print(t.markdown() if args.markdown else t.text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
