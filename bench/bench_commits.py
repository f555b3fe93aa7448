"""OffsetCommit throughput: many groups committing offsets for several partitions each, as fast as the broker
answers. Every commit is durable (group-committed cursor-log fsync) before its response, unless --no-fsync.

Each of --groups groups commits --partitions offsets per OffsetCommit (v8, a simple commit with generation -1, as
assign-only consumers send), round after round with growing offsets (so every commit moves its cursor forward;
--backwards alternates forward and backward moves, which exercises cursor resets). Requests go out over
--connections sockets with up to --window in flight on each. Reports committed offsets per second, requests per
second, request latency percentiles and the broker's CPU time per 1000 commits, then checks that what OffsetFetch
returns is the last offset committed.

    python -m bench.bench_commits --groups 50 --partitions 4 --seconds 10
"""
import argparse
import asyncio
import os
import shutil
import struct
import tempfile
import time
from dataclasses import dataclass

from integration.broker_process import BrokerProcess
from protocol.api import REQUEST_CLASSES, RESPONSE_CLASSES

COMMIT_VERSION = 8
FETCH_VERSION = 8
TOPIC = "bench-commits"


@dataclass(frozen=True, slots=True)
class Result:
    commits: int
    requests: int
    seconds: float
    latencies_ms: list[float]
    broker_cpu_s: float
    errors: int

    def line(self) -> str:
        lat = sorted(self.latencies_ms)
        pct = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] if lat else float("nan")  # noqa: E731
        return (f"{self.commits / self.seconds:,.0f} commits/s ({self.requests / self.seconds:,.0f} requests/s) "
                f"over {self.seconds:.1f}s; latency p50 {pct(0.5):.1f} ms, p99 {pct(0.99):.1f} ms; "
                f"broker CPU {self.broker_cpu_s / self.commits * 1000 * 1000:.0f} ms per 1000 commits; "
                f"errors {self.errors}")


def cpu_seconds(pid: int | None) -> float:
    if pid is None:
        return float("nan")
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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


async def run(host: str, port: int, pid: int, args) -> tuple[Result, int]:
    groups = [f"bench-group-{i}" for i in range(args.groups)]
    out = {"latencies": [], "requests": 0, "commits": 0, "errors": 0, "last": {}}
    shares = [groups[i::args.connections] for i in range(args.connections)]
    cpu0, t0 = cpu_seconds(pid), time.perf_counter()
    deadline = t0 + args.seconds
    await asyncio.gather(*(connection(host, port, share, args.partitions, args.window, deadline, args.backwards, out)
                           for share in shares if share))
    seconds = time.perf_counter() - t0
    result = Result(out["commits"], out["requests"], seconds, out["latencies"], cpu_seconds(pid) - cpu0,
                    out["errors"])
    return result, await verify(host, port, out["last"], args.partitions)


def prepare_topic(bootstrap: str, partitions: int, records: int) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(TOPIC, partitions, 1)])[TOPIC].result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for i in range(records):
        producer.produce(TOPIC, value=b"x" * 100, partition=i % partitions)
        if i % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=50)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--connections", type=int, default=0, help="sockets (default: one per group, as consumers)")
    parser.add_argument("--window", type=int, default=5, help="requests in flight per connection")
    parser.add_argument("--records", type=int, default=20_000, help="records in the topic (commits point into it)")
    parser.add_argument("--backwards", action="store_true", help="every other round commits an earlier offset")
    parser.add_argument("--no-fsync", action="store_true", help="broker with fsync=false (not durable)")
    parser.add_argument("--bootstrap", help="HOST:PORT of a running broker instead of starting one (e.g. to profile "
                                            "it); its topic must not exist yet")
    parser.add_argument("--broker-pid", type=int, help="with --bootstrap: the broker's pid, for its CPU time")
    args = parser.parse_args()
    args.connections = args.connections or args.groups
    if args.bootstrap:
        host, _, port = args.bootstrap.rpartition(":")
        prepare_topic(args.bootstrap, args.partitions, args.records)
        result, mismatches = asyncio.run(run(host, int(port), args.broker_pid, args))
        report(args, result, mismatches)
        return
    root = tempfile.mkdtemp(prefix="kop-bench-commits-")
    broker = BrokerProcess(f"{root}/data", config={"fsync": "false"} if args.no_fsync else {})
    try:
        broker.start()
        prepare_topic(broker.bootstrap, args.partitions, args.records)
        result, mismatches = asyncio.run(run("127.0.0.1", broker.port, broker.proc.pid, args))
    finally:
        broker.stop()
        shutil.rmtree(root, ignore_errors=True)
    report(args, result, mismatches)


def report(args, result: Result, mismatches: int) -> None:
    print(f"{args.groups} groups x {args.partitions} partitions, {args.connections} connections x window "
          f"{args.window}, fsync {'off' if args.no_fsync else 'on'}{', backwards' if args.backwards else ''}:")
    print("  " + result.line())
    print(f"  OffsetFetch check: {args.groups - mismatches}/{args.groups} groups read back their last commit")
    if mismatches or result.errors:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
