"""OffsetCommit throughput: many groups committing offsets for several partitions each, as fast as the broker
answers. Every commit is durable (group-committed cursor-log fsync) before its response, unless --no-fsync.

Each of --groups groups commits --partitions offsets per OffsetCommit (v8, a simple commit with generation -1, as
assign-only consumers send), round after round with growing offsets (so every commit moves its cursor forward;
--backwards alternates forward and backward moves, which exercises cursor resets). Requests go out over
--connections sockets with up to --window in flight on each. Reports committed offsets per second, requests per
second, request latency percentiles and the broker's CPU time per 1000 commits, then checks that what OffsetFetch
returns is the last offset committed. Each partition has its own cursor log, so a request naming N partitions
waits for N group-committed fsyncs (run side by side, each shared with every other group's commit to that
partition).

    python -m bench.bench_commits --groups 50 --partitions 4 --seconds 10
    python -m bench.run --only commits      # the cases recorded in BENCHMARKS.md
"""
import argparse
import asyncio
import struct
import time
from dataclasses import dataclass

from bench.brokers import RDKAFKA_LOG, create_topic, running_broker
from bench.procstat import cpu_seconds
from bench.report import Table, fmt
from bench.stats import median, percentile
from protocol.api import REQUEST_CLASSES, RESPONSE_CLASSES

COMMIT_VERSION = 8
FETCH_VERSION = 8
TOPIC = "bench-commits"


@dataclass(frozen=True, slots=True)
class CommitSpec:
    groups: int
    partitions: int
    seconds: float = 10.0
    connections: int = 0  # 0: one per group, as consumers have
    window: int = 5  # requests in flight per connection
    backwards: bool = False
    fsync: bool = True

    @property
    def shape(self) -> str:
        plural = lambda n, word: f"{n} {word}{'' if n == 1 else 's'}"  # noqa: E731
        return f"{plural(self.groups, 'group')} x {plural(self.partitions, 'partition')}"

    @property
    def sockets(self) -> int:
        return self.connections or self.groups


@dataclass(frozen=True, slots=True)
class Result:
    commits: int
    requests: int
    seconds: float
    latencies_ms: list[float]
    broker_cpu_s: float
    errors: int
    mismatches: int = 0  # groups whose OffsetFetch did not return their last commit

    @property
    def commits_per_s(self) -> float:
        return self.commits / self.seconds

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.seconds

    @property
    def cpu_ms_per_1000(self) -> float:
        return self.broker_cpu_s / self.commits * 1000 * 1000 if self.commits else float("nan")

    def line(self) -> str:
        return (f"{self.commits_per_s:,.0f} commits/s ({self.requests_per_s:,.0f} requests/s) "
                f"over {self.seconds:.1f}s; latency p50 {percentile(self.latencies_ms, 0.5):.1f} ms, "
                f"p99 {percentile(self.latencies_ms, 0.99):.1f} ms; "
                f"broker CPU {self.cpu_ms_per_1000:.0f} ms per 1000 commits; errors {self.errors}")


def commit_request(group: str, partitions: int, offset: int, correlation_id: int) -> bytes:
    Req = REQUEST_CLASSES[8][COMMIT_VERSION]
    Part = Req.OffsetCommitRequestTopic.OffsetCommitRequestPartition
    request = Req(group_id=group, generation_id_or_member_epoch=-1, member_id="", group_instance_id=None,
                  topics=[Req.OffsetCommitRequestTopic(name=TOPIC, partitions=[
                      Part(partition_index=p, committed_offset=offset, committed_leader_epoch=-1,
                           committed_metadata=f"bench {offset}") for p in range(partitions)])])
    request.with_header(correlation_id=correlation_id, client_id="bench-commits")
    return bytes(request.encode(header=True, framed=True))


async def read_frame(reader: asyncio.StreamReader) -> bytes:
    size = struct.unpack(">i", await reader.readexactly(4))[0]
    return await reader.readexactly(size)


async def connection(host: str, port: int, groups: list[str], partitions: int, window: int, deadline: float,
                     backwards: bool, out: dict) -> None:
    """Commit for `groups` round-robin until the deadline, keeping `window` requests in flight."""
    reader, writer = await asyncio.open_connection(host, port)
    sent_at: dict[int, float] = {}
    last_offset: dict[str, int] = {}
    latencies, errors = out["latencies"], 0
    correlation = 0
    round_no = 0
    inflight = asyncio.Semaphore(window)
    done_sending = asyncio.Event()

    async def receive():
        nonlocal errors
        while not (done_sending.is_set() and not sent_at):
            frame = await read_frame(reader)
            response = RESPONSE_CLASSES[8].decode(frame, version=COMMIT_VERSION, header=True)
            started = sent_at.pop(response.header.correlation_id)
            latencies.append((time.perf_counter() - started) * 1000)
            errors += sum(1 for t in response.topics for p in t.partitions if p.error_code)
            out["requests"] += 1
            out["commits"] += sum(len(t.partitions) for t in response.topics)
            inflight.release()

    receiver = asyncio.create_task(receive())
    while time.perf_counter() < deadline:
        round_no += 1
        for group in groups:
            # forward by 10 each round; with --backwards every other round steps back by 5
            offset = round_no * 10 if not backwards or round_no % 2 else round_no * 10 - 15
            await inflight.acquire()
            correlation += 1
            data = commit_request(group, partitions, offset, correlation)
            sent_at[correlation] = time.perf_counter()
            last_offset[group] = offset
            writer.write(data)
            await writer.drain()
    done_sending.set()
    await receiver if sent_at else receiver.cancel()
    out["errors"] += errors
    out["last"].update(last_offset)
    writer.close()


async def verify(host: str, port: int, expected: dict[str, int], partitions: int) -> int:
    """Mismatches between OffsetFetch and the last offset committed per group."""
    reader, writer = await asyncio.open_connection(host, port)
    Req = REQUEST_CLASSES[9][FETCH_VERSION]
    request = Req(require_stable=False, groups=[Req.OffsetFetchRequestGroup(group_id=g, topics=None)
                                                for g in expected])
    request.with_header(correlation_id=1, client_id="bench-commits")
    writer.write(bytes(request.encode(header=True, framed=True)))
    await writer.drain()
    response = RESPONSE_CLASSES[9].decode(await read_frame(reader), version=FETCH_VERSION, header=True)
    writer.close()
    bad = 0
    for group in response.groups:
        offsets = [p.committed_offset for t in group.topics for p in t.partitions]
        if offsets != [expected[group.group_id]] * partitions:
            bad += 1
    return bad


async def run(host: str, port: int, pid: int | None, spec: CommitSpec) -> Result:
    groups = [f"bench-group-{i}" for i in range(spec.groups)]
    out = {"latencies": [], "requests": 0, "commits": 0, "errors": 0, "last": {}}
    shares = [groups[i::spec.sockets] for i in range(spec.sockets)]
    cpu = (lambda: cpu_seconds(pid)) if pid else (lambda: float("nan"))  # noqa: E731
    cpu0, t0 = cpu(), time.perf_counter()
    deadline = t0 + spec.seconds
    await asyncio.gather(*(connection(host, port, share, spec.partitions, spec.window, deadline, spec.backwards, out)
                           for share in shares if share))
    seconds = time.perf_counter() - t0
    broker_cpu = cpu() - cpu0
    mismatches = await verify(host, port, out["last"], spec.partitions)
    return Result(out["commits"], out["requests"], seconds, out["latencies"], broker_cpu, out["errors"], mismatches)


def prepare_topic(bootstrap: str, partitions: int, records: int) -> None:
    from confluent_kafka import Producer
    create_topic(bootstrap, TOPIC, partitions)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "logger": RDKAFKA_LOG})
    for i in range(records):
        producer.produce(TOPIC, value=b"x" * 100, partition=i % partitions)
        if i % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0


def measure(spec: CommitSpec, records_per_partition: int = 1000) -> Result:
    """One run against a fresh broker."""
    with running_broker(None if spec.fsync else {"fsync": "false"}) as broker:
        prepare_topic(broker.bootstrap, spec.partitions, spec.partitions * records_per_partition)
        return asyncio.run(run("127.0.0.1", broker.port, broker.proc.pid, spec))


def table(runs: list[tuple[CommitSpec, list[Result]]], title: str) -> Table:
    t = Table(title, ["groups x partitions", "sockets x window", "commits/s", "requests/s", "p50 ms", "p99 ms",
                      "broker busy", "CPU ms/1000 commits", "errors", "read back"])
    for spec, results in runs:
        t.add(spec.shape, f"{spec.sockets} x {spec.window}", fmt(median([r.commits_per_s for r in results])),
              fmt(median([r.requests_per_s for r in results])),
              fmt(median([percentile(r.latencies_ms, 0.5) for r in results]), 1),
              fmt(median([percentile(r.latencies_ms, 0.99) for r in results]), 1),
              f"{median([r.broker_cpu_s / r.seconds for r in results]):.0%}",
              fmt(median([r.cpu_ms_per_1000 for r in results])),
              str(sum(r.errors for r in results)),
              f"{sum(spec.groups - r.mismatches for r in results)}/{spec.groups * len(results)}")
    rounds = len(runs[0][1]) if runs else 0
    t.notes.append(f"{rounds} run(s) of {runs[0][0].seconds:.0f} s per case, medians; OffsetCommit v8 with "
                   f"generation -1, every commit fsynced before its response" if runs else "")
    return t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=50)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--connections", type=int, default=0, help="sockets (default: one per group, as consumers)")
    parser.add_argument("--window", type=int, default=5, help="requests in flight per connection")
    parser.add_argument("--records", type=int, default=1000, help="records per partition (commits point into them)")
    parser.add_argument("--backwards", action="store_true", help="every other round commits an earlier offset")
    parser.add_argument("--no-fsync", action="store_true", help="broker with fsync=false (not durable)")
    parser.add_argument("--bootstrap", help="HOST:PORT of a running broker instead of starting one (e.g. to profile "
                                            "it); its topic must not exist yet")
    parser.add_argument("--broker-pid", type=int, help="with --bootstrap: the broker's pid, for its CPU time")
    args = parser.parse_args()
    spec = CommitSpec(args.groups, args.partitions, args.seconds, args.connections, args.window, args.backwards,
                      not args.no_fsync)
    if args.bootstrap:
        host, _, port = args.bootstrap.rpartition(":")
        prepare_topic(args.bootstrap, spec.partitions, spec.partitions * args.records)
        result = asyncio.run(run(host, int(port), args.broker_pid, spec))
    else:
        result = measure(spec, args.records)
    print(f"{spec.shape}, {spec.sockets} connections x window {spec.window}, fsync {'on' if spec.fsync else 'off'}"
          f"{', backwards' if spec.backwards else ''}:")
    print("  " + result.line())
    print(f"  OffsetFetch check: {spec.groups - result.mismatches}/{spec.groups} groups read back their last commit")
    if result.mismatches or result.errors:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
