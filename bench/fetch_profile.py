"""What a full Fetch across thousands of partitions that hold little data costs the broker, and where that time
goes: the question behind fetch sessions (KIP-227), whose incremental fetches leave unchanged partitions out of both
request and response.

One broker gets `topics` x `partitions` partitions with one record each. One client sends `rounds` Fetch v11
requests naming every partition at its end (max_wait_ms 0: each answers at once, every partition empty, the work a
consumer with nothing new causes per poll), and for comparison as many naming one partition; broker CPU is read from
/proc around each series. Then the broker starts again under bench.profiled_kop and the full fetches are repeated
with its event-loop thread profiled (cProfile) for just that series.

    python -m bench.fetch_profile                          # 1,000 topics x 10 partitions
    python -m bench.fetch_profile --topics 100 --rounds 20 # a quick look
"""
import argparse
import os
import pstats
import shutil
import signal
import socket
import struct
import sys
import tempfile
import time
from dataclasses import dataclass

from bench.partitions import Spec, create_all, log, produce_to_all, read_exact, seconds_until_serving, topic_names
from bench.procstat import cpu_seconds
from bench.report import Table
from integration.broker_process import BrokerProcess
from integration.fetch_requests import FETCH_VERSION, fetch_request
from integration.waiting import wait_until

TOP = 12
WARM_UP = 2  # requests before each timed series


@dataclass(frozen=True, slots=True)
class Series:
    requests: int
    wall_s: float
    broker_cpu_s: float
    response_bytes: int  # of one answer

    def per_request_ms(self) -> tuple[float, float]:
        return 1e3 * self.wall_s / self.requests, 1e3 * self.broker_cpu_s / self.requests


def fetch_series(port: int, pid: int, partitions: list[tuple[str, int, int]], rounds: int) -> Series:
    """`rounds` Fetch requests for `partitions` (topic, partition, offset), one at a time on one connection."""
    request = fetch_request(partitions, max_bytes=64 << 20)
    size = 0
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        for warm_up in (True, False):
            cpu0, started = cpu_seconds(pid), time.perf_counter()
            for i in range(WARM_UP if warm_up else rounds):
                request.with_header(correlation_id=i, client_id="bench-fetch")
                sock.sendall(request.encode(header=True, framed=True))
                size = struct.unpack(">i", read_exact(sock, 4))[0]
                read_exact(sock, size)
            wall, cpu = time.perf_counter() - started, cpu_seconds(pid) - cpu0
    return Series(rounds, wall, cpu, size)


def profile_table(stats_path: str, requests: int) -> Table:
    stats = pstats.Stats(stats_path)
    rows = sorted(stats.stats.items(), key=lambda item: -item[1][2])[:TOP]  # by own time
    total = stats.total_tt
    table = Table("the broker's event-loop thread during the full fetches (cProfile), by own time",
                  ["function", "own s", "own %", "calls per full fetch"])
    for (path, line, name), (_cc, calls, own, _cum, _callers) in rows:
        table.add(f"{name} ({_short(path)}:{line})", f"{own:.2f}", f"{100 * own / total:.1f}",
                  f"{calls / requests:,.0f}")
    table.notes.append(f"{total:.1f} s profiled in all, {1e3 * total / requests:.0f} ms per full fetch (cProfile slows "
                       "Python code down: the shares carry over, the times do not)")
    return table


def _short(path: str) -> str:
    for marker in ("site-packages/", "/lib/python3.11/", os.path.dirname(os.path.dirname(__file__)) + "/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


def run(spec: Spec, rounds: int) -> list[Table]:
    root = tempfile.mkdtemp(prefix="kop-bench-fetch-")
    stats_path = os.path.join(root, "fetch.prof")
    broker = BrokerProcess(f"{root}/data")
    try:
        broker.start()
        log(f"creating {spec.topics * spec.partitions:,} partitions and a record in each ...")
        create_all(broker.bootstrap, spec)
        produce_to_all(broker.bootstrap, spec)
        every = [(t, p, 1) for t in topic_names(spec) for p in range(spec.partitions)]
        log(f"{rounds} full fetches of {len(every):,} partitions, and {rounds} of one ...")
        full = fetch_series(broker.port, broker.proc.pid, every, rounds)
        one = fetch_series(broker.port, broker.proc.pid, every[:1], rounds)
        log("again, with the broker under cProfile ...")
        broker.stop(timeout=120)
        broker.program = (sys.executable, "-m", "bench.profiled_kop", stats_path)
        seconds_until_serving(broker, spec)
        broker.proc.send_signal(signal.SIGUSR1)
        fetch_series(broker.port, broker.proc.pid, every, rounds)
        broker.proc.send_signal(signal.SIGUSR2)
        if not wait_until(lambda: os.path.exists(stats_path), timeout=60):
            raise RuntimeError("the profiled broker wrote no statistics")
        table = Table(f"Fetch v{FETCH_VERSION}, every partition at its end, max_wait_ms 0, one connection",
                      ["request", "answer bytes", "ms per request (client)", "broker CPU ms per request"])
        for label, series in ((f"{len(every):,} partitions", full), ("1 partition", one)):
            wall_ms, cpu_ms = series.per_request_ms()
            table.add(label, f"{series.response_bytes:,}", f"{wall_ms:.1f}", f"{cpu_ms:.2f}")
        return [table, profile_table(stats_path, WARM_UP + rounds)]
    finally:
        broker.stop()
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.fetch_profile", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topics", type=int, default=Spec.topics)
    parser.add_argument("--partitions", type=int, default=Spec.partitions, help="per topic")
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    for table in run(Spec(args.topics, args.partitions, producers=min(100, args.topics)), args.rounds):
        print("\n".join([table.markdown(), *table.notes, ""]) if args.markdown else table.text())


if __name__ == "__main__":
    main()
