"""What a full Fetch across thousands of partitions that hold little data costs the broker, and where that time
goes: the question behind fetch sessions (KIP-227), whose incremental fetches leave unchanged partitions out of both
request and response.

One broker gets `topics` x `partitions` partitions with one record each. One client sends `rounds` Fetch v11
requests naming every partition at its end (max_wait_ms 0: each answers at once, every partition empty, the work a
consumer with nothing new causes per poll) without a session (epoch -1, as librdkafka sends them); then as many
incremental fetches of a session holding every partition (made by one full fetch with epoch 0, as the Java client
and kafka-python do), naming none and answered none; and for comparison as many naming one partition. Broker CPU is
read from /proc around each series. Then the broker starts again under bench.profiled_kop and the full and the
incremental fetches are repeated with its event-loop thread profiled (cProfile), each series on its own.

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
from protocol.api import RESPONSE_CLASSES
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
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        return _series(sock, pid, rounds, lambda _i: request)


def session_series(port: int, pid: int, partitions: list[tuple[str, int, int]], rounds: int) -> Series:
    """A full fetch of `partitions` that makes a session, then `rounds` incremental fetches of it naming nothing."""
    full = fetch_request(partitions, max_bytes=64 << 20)
    full.session_epoch = 0
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        full.with_header(correlation_id=1, client_id="bench-fetch")
        sock.sendall(full.encode(header=True, framed=True))
        size = struct.unpack(">i", read_exact(sock, 4))[0]
        answer = RESPONSE_CLASSES[1].decode(read_exact(sock, size), version=FETCH_VERSION, header=True)
        if not answer.session_id:
            raise RuntimeError("the broker made no fetch session")
        epoch = 1

        def incremental(_i: int):
            nonlocal epoch
            request = fetch_request([], max_bytes=64 << 20)
            request.session_id, request.session_epoch = answer.session_id, epoch
            epoch += 1
            return request
        return _series(sock, pid, rounds, incremental)


def _series(sock: socket.socket, pid: int, rounds: int, request_for) -> Series:
    size = 0
    for warm_up in (True, False):
        cpu0, started = cpu_seconds(pid), time.perf_counter()
        for i in range(WARM_UP if warm_up else rounds):
            size = _exchange(sock, request_for(i), i)
        wall, cpu = time.perf_counter() - started, cpu_seconds(pid) - cpu0
    return Series(rounds, wall, cpu, size)


def _exchange(sock: socket.socket, request, correlation_id: int) -> int:
    """Send one request and read its answer; the answer's size."""
    request.with_header(correlation_id=correlation_id, client_id="bench-fetch")
    sock.sendall(request.encode(header=True, framed=True))
    size = struct.unpack(">i", read_exact(sock, 4))[0]
    read_exact(sock, size)
    return size


def profile_table(stats_path: str, requests: int, what: str) -> Table:
    stats = pstats.Stats(stats_path)
    rows = sorted(stats.stats.items(), key=lambda item: -item[1][2])[:TOP]  # by own time
    total = stats.total_tt
    table = Table(f"the broker's event-loop thread during the {what} (cProfile), by own time",
                  ["function", "own s", "own %", "calls per request"])
    for (path, line, name), (_cc, calls, own, _cum, _callers) in rows:
        table.add(f"{name} ({_short(path)}:{line})", f"{own:.2f}", f"{100 * own / total:.1f}",
                  f"{calls / requests:,.0f}")
    table.notes.append(f"{total:.1f} s profiled in all, {1e3 * total / requests:.0f} ms per request (cProfile slows "
                       "Python code down: the shares carry over, the times do not)")
    return table


def _short(path: str) -> str:
    for marker in ("site-packages/", "/lib/python3.11/", os.path.dirname(os.path.dirname(__file__)) + "/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


def run(spec: Spec, rounds: int) -> list[Table]:
    root = tempfile.mkdtemp(prefix="kop-bench-fetch-")
    broker = BrokerProcess(f"{root}/data")
    try:
        broker.start()
        log(f"creating {spec.topics * spec.partitions:,} partitions and a record in each ...")
        create_all(broker.bootstrap, spec)
        produce_to_all(broker.bootstrap, spec)
        every = [(t, p, 1) for t in topic_names(spec) for p in range(spec.partitions)]
        log(f"{rounds} full fetches of {len(every):,} partitions, {rounds} incremental ones, and {rounds} of one ...")
        full = fetch_series(broker.port, broker.proc.pid, every, rounds)
        incremental = session_series(broker.port, broker.proc.pid, every, rounds)
        one = fetch_series(broker.port, broker.proc.pid, every[:1], rounds)
        log("again, with the broker under cProfile ...")
        broker.stop(timeout=120)
        profiles = []
        for what, series in (("full fetches", fetch_series), ("incremental fetches", session_series)):
            stats_path = os.path.join(root, f"{len(profiles)}.prof")
            broker.program = (sys.executable, "-m", "bench.profiled_kop", stats_path)
            seconds_until_serving(broker, spec)
            broker.proc.send_signal(signal.SIGUSR1)
            series(broker.port, broker.proc.pid, every, rounds)
            broker.proc.send_signal(signal.SIGUSR2)
            if not wait_until(lambda: os.path.exists(stats_path), timeout=60):
                raise RuntimeError("the profiled broker wrote no statistics")
            broker.stop(timeout=120)
            # the incremental series' profile also holds the one full fetch that makes its session
            profiles.append(profile_table(stats_path, WARM_UP + rounds, what))
        table = Table(f"Fetch v{FETCH_VERSION}, every partition at its end, max_wait_ms 0, one connection",
                      ["request", "answer bytes", "ms per request (client)", "broker CPU ms per request"])
        for label, series in ((f"full, {len(every):,} partitions (no session)", full),
                              (f"incremental, a session of {len(every):,} partitions, nothing new", incremental),
                              ("full, 1 partition", one)):
            wall_ms, cpu_ms = series.per_request_ms()
            table.add(label, f"{series.response_bytes:,}", f"{wall_ms:.1f}", f"{cpu_ms:.2f}")
        return [table, *profiles]
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
