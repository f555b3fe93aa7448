"""What one broker spends per connection, per idempotent producer and per consumer group, and that it gives it
back: each population is created, held live, measured and closed three times over, and the broker's memory after
each round must stay flat (nothing grows without bound).

A group is a classic consumer group with one live member on its own connection (JoinGroup, SyncGroup, OffsetCommit,
a Heartbeat every 3 s; bench/group_members.py). Every round rejoins the same groups, as a
restarted application does; each round's idempotent producers are new ones (Kafka gives every producer start a new
id), kept by the broker up to its per-partition producer limit.

    python -m bench.connections                                      # 10,000 / 1,000 / 1,000
    python -m bench.connections --connections 1000 --producers 100 --groups 100 --rounds 2 --hold 10
    python -m bench.connections --rounds 4 --trace /tmp/kop-rounds   # where memory that stays comes from

--trace runs the broker under tracemalloc (bench/traced_kop.py, several times slower, so not for the cost figures)
from the end of round 1, takes a snapshot after each later round and prints the traced total after each and what grew
most over the last round.
"""
import argparse
import os
import signal
import socket
import struct
import sys
import time
import tracemalloc
from dataclasses import dataclass

from bench.brokers import running_broker
from bench.group_members import GroupLoad
from bench.procstat import open_descriptors, rss_bytes
from bench.report import Table
from integration.idem_raw import RawKafka, idempotent_batch
from protocol.api import REQUEST_CLASSES
from protocol.errors import ErrorCode

API_VERSIONS = 18
TOPIC = "bench-state"


@dataclass(frozen=True)
class Spec:
    connections: int = 10_000
    producers: int = 1_000
    groups: int = 1_000
    rounds: int = 3
    hold_s: float = 30.0  # everything live, heartbeating: RSS sampled at its start and end
    heartbeat_ms: int = 3_000  # Kafka's consumer default, as its session timeout of 45 s
    trace: str | None = None  # snapshot files' prefix: run the broker under tracemalloc


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def api_versions_frame(correlation_id: int) -> bytes:
    request = REQUEST_CLASSES[API_VERSIONS][3](client_software_name="bench", client_software_version="1")
    request.with_header(correlation_id=correlation_id, client_id="bench")
    return request.encode(header=True, framed=True)


def read_answer(sock: socket.socket) -> None:
    size = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))[0]
    if len(sock.recv(size, socket.MSG_WAITALL)) != size:
        raise ConnectionError("short answer")


def open_connections(port: int, count: int) -> list[socket.socket]:
    """`count` connections, each with an ApiVersions answered (so the broker holds each as a live client)."""
    socks = []
    for i in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        sock.sendall(api_versions_frame(i))
        socks.append(sock)
    for sock in socks:
        read_answer(sock)
    return socks


def register_producers(port: int, count: int) -> None:
    """`count` idempotent producers, each with an id from InitProducerId and one batch stored under it."""
    with RawKafka(port, timeout=30) as raw:
        for i in range(count):
            identity = raw.init_producer_id()
            batch = idempotent_batch([b"v%d" % i], producer_id=identity.producer_id, epoch=identity.producer_epoch,
                                     base_sequence=0)
            answer = raw.produce(TOPIC, 0, batch)
            if answer.error_code != ErrorCode.NONE:
                raise RuntimeError(f"produce answered {answer.error_code}")


def wait_for_closes(pid: int, descriptors: int, timeout_s: float = 120.0) -> None:
    """Until the broker has seen every closed connection go (its descriptors back to `descriptors` or fewer) and
    its memory has settled (less than 1 MiB of change over two seconds), so the next figure is not this release."""
    deadline = time.monotonic() + timeout_s
    while open_descriptors(pid) > descriptors and time.monotonic() < deadline:
        time.sleep(0.2)
    previous = rss_bytes(pid)
    while time.monotonic() < deadline:
        time.sleep(2)
        now = rss_bytes(pid)
        if abs(now - previous) < 2**20:
            return
        previous = now


def hold(pid: int, groups: GroupLoad, seconds: float) -> tuple[int, int]:
    """RSS at the start and the end of `seconds` with every connection open and every member heartbeating."""
    start = rss_bytes(pid)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
        groups.check()
    return start, rss_bytes(pid)


def snapshot(pid: int, prefix: str, number: int, timeout_s: float = 300.0) -> tracemalloc.Snapshot:
    """Have the traced broker write its snapshot `number` (bench.traced_kop, tracing since the signal before) and
    read it once it is whole."""
    os.kill(pid, signal.SIGUSR1)
    path, size, deadline = f"{prefix}.{number}", -1, time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(2)
        if os.path.exists(path) and os.path.getsize(path) == size:
            return tracemalloc.Snapshot.load(path)
        size = os.path.getsize(path) if os.path.exists(path) else -1
    raise TimeoutError(f"no snapshot {path} from the broker")


def print_growth(snapshots: list[tracemalloc.Snapshot], top: int = 15) -> None:
    """The traced total after each round, and what grew most over the last round. The first snapshot still differs
    from later ones by what each round replaces (a cursor keeps its last two records: round 1's, untraced, give way)."""
    log("traced memory after rounds 2..: " + ", ".join(f"{sum(s.size for s in snap.statistics('filename')):,} B"
                                                       for snap in snapshots))
    log("grown most over the last round (tracemalloc, by line):")
    for stat in snapshots[-1].compare_to(snapshots[-2], "lineno")[:top]:
        log(f"  {stat}")


def run(spec: Spec) -> Table:
    """Round 1 on a fresh broker gives the cost of each (RSS growth while they are created); every round then holds
    them all live for `hold_s` and ends with all of them closed, giving the broker's RSS then. Later rounds' growth
    figures would mix in memory the broker is still giving back from the round before, so they are not shown."""
    table = Table("per connection, producer and group on one broker (RSS)",
                  ["round", "per connection", "per idempotent producer", "per group", "RSS held live",
                   "heartbeats (rejoins)", "slowest heartbeat", "RSS after closing all"])
    mib = lambda n: f"{n / 2**20:+.1f} MiB"  # noqa: E731
    # room for the idle connections, the members' and the benchmark's own (kop's default max.connections is 10,000)
    config = {"max.connections": str(spec.connections + spec.groups + 100)}
    program = (sys.executable, "-m", "bench.traced_kop", spec.trace) if spec.trace else None
    snapshots = []
    with running_broker(config, program=program) as broker:
        pid = broker.proc.pid
        with RawKafka(broker.port) as raw:
            raw.create_topic(TOPIC, 1)
        base, base_descriptors = rss_bytes(pid), open_descriptors(pid)
        for round_ in range(spec.rounds):
            log(f"round {round_ + 1}: {spec.producers:,} producers, {spec.groups:,} groups ...")
            before = rss_bytes(pid)
            register_producers(broker.port, spec.producers)
            per_producer = (rss_bytes(pid) - before) / spec.producers
            groups = GroupLoad(broker.port, TOPIC, spec.groups, heartbeat_ms=spec.heartbeat_ms)
            try:
                before = rss_bytes(pid)
                groups.start()
                per_group = (rss_bytes(pid) - before) / spec.groups
                log(f"round {round_ + 1}: {spec.connections:,} connections, then {spec.hold_s:.0f} s held ...")
                before = rss_bytes(pid)
                socks = open_connections(broker.port, spec.connections)
                per_connection = (rss_bytes(pid) - before) / spec.connections
                held_from, held_to = hold(pid, groups, spec.hold_s)
                for sock in socks:
                    sock.close()
            finally:
                groups.stop()
            wait_for_closes(pid, base_descriptors + 16)
            costs = (f"{per_connection / 1024:.1f} KiB", f"{per_producer / 1024:.2f} KiB",
                     f"{per_group / 1024:.2f} KiB") if round_ == 0 else ("", "", "")
            table.add(str(round_ + 1), *costs, f"{mib(held_from - base)} to {mib(held_to - base)}",
                      f"{groups.stats.heartbeats:,} ({groups.stats.rejoins})",
                      f"{groups.stats.slowest_heartbeat_s:.1f} s", mib(rss_bytes(pid) - base))
            if spec.trace and round_ == 0:
                os.kill(pid, signal.SIGUSR1)  # tracing starts: round 1 allocated what is allocated once
            elif spec.trace:
                snapshots.append(snapshot(pid, spec.trace, round_))
    if len(snapshots) >= 2:
        print_growth(snapshots)
    return table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--connections", type=int, default=Spec.connections)
    parser.add_argument("--producers", type=int, default=Spec.producers)
    parser.add_argument("--groups", type=int, default=Spec.groups)
    parser.add_argument("--rounds", type=int, default=Spec.rounds)
    parser.add_argument("--hold", type=float, default=Spec.hold_s, help="seconds each round holds everything live")
    parser.add_argument("--heartbeat-ms", type=int, default=Spec.heartbeat_ms)
    parser.add_argument("--trace", metavar="PREFIX", help="trace the broker's allocations, snapshots to PREFIX.N")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    table = run(Spec(args.connections, args.producers, args.groups, args.rounds, args.hold, args.heartbeat_ms, args.trace))
    print(table.markdown() if args.markdown else table.text())


if __name__ == "__main__":
    main()
