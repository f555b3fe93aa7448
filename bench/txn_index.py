"""What a partition's aborted-transaction index costs as its aborted transactions grow, side by side with another
source tree (the code before the index was kept by ledger): the memory of the partition's transaction state, the
transaction snapshot (its size and the time to build it on the event loop, the largest of those taken along the way
and the last), the load after a crash (a kill -9 leaves the ledger as closing it without the partition does), and
the lookup a read_committed fetch makes (the aborted transactions among what a 64 KiB fetch at a random offset
returns), with the stored indexes cached and, after the load, read cold.

In process, on the real file ledger (fsync off: the cost measured is the index's, not the disk's), each tree with
its defaults (ledgers of 256 MiB; here a ledger also rolls once it holds 10,000 aborted transactions). One producer
in a hundred writes each transaction: one batch of one 10-byte record, then its ABORT marker. Each (tree, count)
runs in a process of its own, the trees alternating.

--consume N: a real broker of each tree and a real read_committed consumer. The topic's partition is written as
above (in process, by that tree's code, while the broker is stopped) with N aborted transactions alternating with N
committed ones; then the broker starts (timed: it loads the partition) and confluent-kafka reads the partition from
the beginning, read_uncommitted and read_committed alternating, rounds times.

    python -m bench.txn_index --aborts 100000,300000 --consume 50000 --before /tmp/kop-before
    (the tree before: git archive <commit> | tar -x -C /tmp/kop-before; BENCHMARKS.md has the figures)
"""
import argparse
import asyncio
import gc
import inspect
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

PRODUCERS = 100
SAMPLES = 10  # snapshots timed along the way
LOOKUPS = 1000
FETCH_BYTES = 64 << 10  # about 430 entries of these transactions: some 215 aborted ones listed
HERE = Path(__file__).resolve()


# ---- the probe: one tree, one count, in a process whose PYTHONPATH starts with that tree

def deep_size(root: object, exclude: list[object]) -> int:
    """Bytes of the objects reachable from root, each counted once; not through `exclude`, nor asyncio's objects,
    frames, types, modules or functions (the event loop would reach everything)."""
    seen = {id(o) for o in exclude}
    skip = (asyncio.Future, types.CoroutineType, types.FrameType, asyncio.AbstractEventLoop, type,
            types.ModuleType, types.FunctionType, types.MethodType)
    stack, total = [root], 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, skip):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        stack.extend(gc.get_referents(obj))
    return total


def open_partition(directory: str, cache):
    from dedup import DedupConfig
    from kop.ledger import FileManagedLedger, LedgerConfig
    from kop.partition import PartitionLog
    ledger = FileManagedLedger.open("bench-0", directory, LedgerConfig(fsync=False), None)
    if "index_cache" in inspect.signature(PartitionLog).parameters:
        return PartitionLog("bench", 0, ledger, DedupConfig(), index_cache=cache)
    return PartitionLog("bench", 0, ledger, DedupConfig())


async def maybe_await(value):
    return await value if inspect.isawaitable(value) else value


def state_bytes(partition, cache) -> int:
    gc.collect()
    return deep_size(partition.transactions, [partition.ledger, cache])


def time_snapshot(partition) -> tuple[float, int]:
    started = time.perf_counter()
    snapshot = partition.transactions.snapshot(partition.high_watermark)
    return (time.perf_counter() - started) * 1000, sum(len(k) + len(v) for k, v in snapshot.items())


async def settle(partition) -> None:
    """Wait for the index writes and the snapshot in flight (the tree before has no index writes)."""
    indexes = getattr(partition.transactions, "indexes", None)
    if indexes is not None:
        await indexes.wait_writes()
    flush = getattr(partition.transaction_snapshots, "flush", None) or partition.transaction_snapshots.close
    await flush()


async def write_aborts(partition, count: int, committed_too: bool = False) -> dict:
    """count aborted transactions (committed_too: each followed by a committed one of another producer)."""
    from protocol.records import Record, build_batch, split_batches
    sequences = [0] * PRODUCERS
    largest = (0.0, 0)
    pending = []
    started = time.perf_counter()
    for n in range(count * (1 + committed_too)):
        producer_id = n % PRODUCERS
        batch = build_batch([Record(offset=0, timestamp=1_700_000_000_000, key=None, value=b"0123456789")],
                            producer_id=producer_id, producer_epoch=0, base_sequence=sequences[producer_id],
                            transactional=True)
        sequences[producer_id] += 1
        pending.append(partition.publish_normal(*split_batches(batch)[0]))
        pending.append(partition.publish_control(producer_id, 0, commit=committed_too and n % 2 == 1))
        if len(pending) >= 2 * PRODUCERS:  # each producer once in flight: its batch, then its marker
            assert all(r.error == 0 for r in await asyncio.gather(*pending))
            pending = []
        if (n + 1) % max(count // SAMPLES, 1) == 0:
            assert all(r.error == 0 for r in await asyncio.gather(*pending))
            pending = []
            largest = max(largest, time_snapshot(partition))
    assert all(r.error == 0 for r in await asyncio.gather(*pending))
    return {"write_s": time.perf_counter() - started, "snapshot_max_ms": largest[0], "snapshot_max_bytes": largest[1]}


async def lookups(partition, offsets: list[int]) -> float:
    """Mean µs of the aborted-transaction lookup of a read_committed fetch of FETCH_BYTES at each offset."""
    spent = 0.0
    for offset in offsets:
        entries = partition.ledger.read_from_index(offset, FETCH_BYTES)
        upper = entries[-1].first_index + entries[-1].span
        started = time.perf_counter()
        if hasattr(partition, "aborted_transactions"):
            listed = await partition.aborted_transactions(entries[0], offset, upper)
        else:  # before: AbortedTxn objects; the fetch took (producer id, first offset) from each
            listed = [(t.producer_id, t.first_offset) for t in partition.transactions.aborted_between(offset, upper)]
        spent += time.perf_counter() - started
        assert listed, offset  # a third of the entries are an aborted transaction's batch
    return spent / len(offsets) * 1e6


async def count_aborted(partition) -> int:
    indexes = getattr(partition.transactions, "indexes", None)
    return len(await indexes.listed()) if indexes is not None else len(partition.transactions.aborted)


async def probe(count: int) -> dict:
    import kop
    cache_class = None
    try:
        from kop.transactions.index_cache import IndexCache as cache_class
    except ImportError:
        pass
    cache = cache_class() if cache_class is not None else None
    directory = tempfile.mkdtemp(prefix="kop-bench-txn-")
    try:
        partition = open_partition(directory, cache)
        await partition.apply_dedup_policy(False)
        await partition.expect_transactions()
        result = {"tree": str(Path(kop.__file__).parent.parent), "count": count}
        result.update(await write_aborts(partition, count))
        await settle(partition)
        result["ledgers"] = len(partition.ledger.internal_stats().ledgers)
        result["state_bytes"] = state_bytes(partition, cache)
        result["cache_bytes"] = cache.bytes if cache is not None else 0
        result["snapshot_end_ms"], result["snapshot_end_bytes"] = time_snapshot(partition)
        rng = random.Random(count)
        offsets = [rng.randrange(partition.high_watermark) for _ in range(LOOKUPS)]
        result["lookup_us"] = await lookups(partition, offsets)
        assert await count_aborted(partition) == count
        await settle(partition)
        await partition.ledger.close()  # a crash: the partition is not closed (no snapshot at close)

        cache = cache_class() if cache_class is not None else None
        partition = open_partition(directory, cache)
        started = time.perf_counter()
        result["load_entries"] = await maybe_await(partition.load_transactions())
        result["load_s"] = time.perf_counter() - started
        await partition.apply_dedup_policy(False)
        result["state_after_load_bytes"] = state_bytes(partition, cache)
        result["lookup_cold_us"] = await lookups(partition, offsets)
        result["lookup_after_load_us"] = await lookups(partition, offsets)
        await partition.close()
        return result
    finally:
        shutil.rmtree(directory, ignore_errors=True)


# ---- the consume probe: a real broker of the tree, a real consumer

CONSUME_TOPIC = "bench-txn-index"


def consume_once(bootstrap: str, isolation: str, broker_pid: int) -> dict:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition
    from bench.brokers import RDKAFKA_LOG
    from bench.procstat import cpu_seconds
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{isolation}", "enable.auto.commit": False,
                         "isolation.level": isolation, "enable.partition.eof": True, "logger": RDKAFKA_LOG})
    try:
        consumer.list_topics(CONSUME_TOPIC, timeout=30)
        cpu_before, started = cpu_seconds(broker_pid), time.perf_counter()
        consumer.assign([TopicPartition(CONSUME_TOPIC, 0, OFFSET_BEGINNING)])
        seen, deadline = 0, time.monotonic() + 600
        while time.monotonic() < deadline:
            messages = consumer.consume(num_messages=10_000, timeout=1.0)
            seen += sum(1 for m in messages if m.error() is None)
            if any(m.error() is not None and m.error().code() == KafkaError._PARTITION_EOF for m in messages):
                break
        return {"isolation": isolation, "records": seen, "seconds": time.perf_counter() - started,
                "cpu_s": cpu_seconds(broker_pid) - cpu_before}
    finally:
        consumer.close()


async def fill_partition(directory: str, count: int) -> None:
    partition = open_partition(directory, None)
    await partition.apply_dedup_policy(True)  # as the broker loads it: its snapshots spare the broker a replay
    await partition.expect_transactions()
    await write_aborts(partition, count, committed_too=True)
    await partition.close()


def consume_probe(count: int, rounds: int) -> dict:
    from bench.brokers import create_topic
    from integration.broker_process import BrokerProcess
    import kop
    root = tempfile.mkdtemp(prefix="kop-bench-txn-")
    broker = BrokerProcess(f"{root}/data")
    try:
        broker.start()
        create_topic(broker.bootstrap, CONSUME_TOPIC, 1)
        broker.stop()
        directory = f"{root}/data/ledgers/public/default/{CONSUME_TOPIC}-partition-0"
        assert os.path.isdir(directory), directory
        asyncio.run(fill_partition(directory, count))
        started = time.perf_counter()
        broker.start()
        result = {"tree": str(Path(kop.__file__).parent.parent), "count": count,
                  "start_s": time.perf_counter() - started, "reads": []}
        for r in range(rounds):
            for isolation in (("read_uncommitted", "read_committed") if r % 2 == 0
                              else ("read_committed", "read_uncommitted")):
                result["reads"].append(consume_once(broker.bootstrap, isolation, broker.proc.pid))
        return result
    finally:
        broker.stop()
        shutil.rmtree(root, ignore_errors=True)


# ---- the driver

def run_probe(tree: Path, *args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, str(HERE), *args], env=env, cwd=tree, check=True, capture_output=True,
                         text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def consume_table(results: list[dict], names: dict[str, str]):
    from bench.report import Table, fmt
    from bench.stats import median
    t = Table("read_committed consume of a partition with many aborted transactions, one broker", [
        "aborted txns", "code", "broker start s", "read_uncommitted s", "read_committed s",
        "read_committed / read_uncommitted", "broker CPU s uncommitted / committed"])
    for r in results:
        by = {level: [x for x in r["reads"] if x["isolation"] == level]
              for level in ("read_uncommitted", "read_committed")}
        assert all(x["records"] == r["count"] for x in by["read_committed"])  # the committed half
        assert all(x["records"] == 2 * r["count"] for x in by["read_uncommitted"])
        seconds = {level: median([x["seconds"] for x in runs]) for level, runs in by.items()}
        cpu = {level: median([x["cpu_s"] for x in runs]) for level, runs in by.items()}
        t.add(f"{r['count']:,}", names[r["tree"]], f"{r['start_s']:.2f}", f"{seconds['read_uncommitted']:.2f}",
              f"{seconds['read_committed']:.2f}", f"{seconds['read_committed'] / seconds['read_uncommitted']:.3f}",
              f"{cpu['read_uncommitted']:.2f} / {cpu['read_committed']:.2f}")
    t.notes.append("each aborted transaction (one 10-byte record and its marker) is followed by a committed one: "
                   "both read the whole partition, read_committed keeps half the records; time to its end and "
                   "broker CPU, medians of the rounds")
    return t


def table(results: list[dict], names: dict[str, str]) -> str:
    from bench.report import Table, fmt
    t = Table("aborted-transaction index, one partition", [
        "aborted txns", "code", "write s", "ledgers", "txn state MiB", "index cache MiB",
        "largest snapshot MB (build ms)", "last snapshot MB (build ms)", "load after crash s (entries read)",
        "lookup µs", "lookup µs after load: cold / warm"])
    mib = 1 << 20
    for r in results:
        t.add(f"{r['count']:,}", names[r["tree"]], f"{r['write_s']:.0f}", fmt(r["ledgers"]),
              fmt(r["state_bytes"] / mib, 2),
              fmt(r["cache_bytes"] / mib, 2),
              f"{r['snapshot_max_bytes'] / 1e6:.3f} ({r['snapshot_max_ms']:.1f})",
              f"{r['snapshot_end_bytes'] / 1e6:.3f} ({r['snapshot_end_ms']:.1f})",
              f"{r['load_s']:.2f} ({r['load_entries']:,})", fmt(r["lookup_us"], 1),
              f"{fmt(r['lookup_cold_us'], 1)} / {fmt(r['lookup_after_load_us'], 1)}")
    t.notes.append(f"write s: the aborted transactions written, the snapshots every 1,000 entries included; txn "
                   f"state: the partition's transaction state (open transactions, the indexes in memory; deep size); "
                   f"the index cache is shared by all partitions (bounded); lookups: {LOOKUPS:,} fetches of "
                   f"{FETCH_BYTES >> 10} KiB at random offsets (µs per fetch)")
    return t


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.txn_index", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--aborts", default="100000,1000000", help="aborted transactions, comma-separated")
    parser.add_argument("--consume", type=int, default=0, help="aborted transactions of the consume runs (0: none)")
    parser.add_argument("--rounds", type=int, default=3, help="consume rounds (each isolation level once)")
    parser.add_argument("--before", type=Path, help="a source tree to measure side by side (the code before)")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--probe", type=int, help=argparse.SUPPRESS)  # one measurement, in this process
    parser.add_argument("--consume-probe", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.probe is not None:
        print(json.dumps(asyncio.run(probe(args.probe))))
        return 0
    if args.consume_probe is not None:
        print(json.dumps(consume_probe(args.consume_probe, args.rounds)))
        return 0
    trees = {str(HERE.parent.parent): "now"}
    if args.before is not None:
        trees[str(args.before.resolve())] = "before"
    runs = [("--probe", int(c)) for c in args.aborts.split(",") if c] + \
        ([("--consume-probe", args.consume)] if args.consume else [])
    results: dict[str, list[dict]] = {"--probe": [], "--consume-probe": []}
    for i, (mode, count) in enumerate(runs):
        for tree in list(trees) if i % 2 == 0 else list(reversed(trees)):
            print(f"  {trees[tree]}: {mode[2:]} {count:,} aborted transactions ...", file=sys.stderr, flush=True)
            results[mode].append(run_probe(Path(tree), mode, str(count), "--rounds", str(args.rounds)))
            print(json.dumps(results[mode][-1]), file=sys.stderr, flush=True)  # the figures as measured
    tables = []
    for mode, render in (("--probe", table), ("--consume-probe", consume_table)):
        if results[mode]:
            results[mode].sort(key=lambda r: (r["count"], trees[r["tree"]] != "before"))
            tables.append(render(results[mode], trees))
    from bench.report import print_tables
    print_tables(tables, args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
