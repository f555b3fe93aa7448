"""The event loop while a PostgreSQL-engine compaction pass runs in a thread of the broker's process: how often a
1 ms timer gets to run during the pass (and its longest extra delay), beside the same loop idle for as long, with
the pass yielding the interpreter lock every 2 ms (what kop does) and, as the control, never (a thread holding the
lock until the interpreter's switch interval takes it away).

In process, on entries built in memory as the engine holds them (three closed ledgers, each batch ten 300-byte
records over 100 keys, so nearly every record goes); the rounds alternate the two ways.

    python -m bench.pg_compaction_lag --batches 3000 --rounds 3
"""
import argparse
import asyncio
import statistics
import time

from kop.compaction import rewrite
from kop.compaction.rewrite import CompactionJob, compact
from kop.ledger.framed_file import unframe
from kop.ledger.ledger_file import decode_entry, encode_entry
from kop.ledger.rewrites import LedgerSnapshot
from protocol.records import Record, build_batch

RECORDS_PER_BATCH = 10
TICK_S = 0.001


def snapshots(batches: int) -> tuple[LedgerSnapshot, ...]:
    out, offset = [], 0
    for ledger_id in range(3):
        raws, size = [], 0
        for entry_id in range(batches // 3):
            records = [Record(offset=offset + i, timestamp=1, key=b"k%d" % ((offset + i) % 100), value=b"x" * 300)
                       for i in range(RECORDS_PER_BATCH)]
            data = build_batch(records, base_offset=offset)
            raw = decode_entry(entry_id, unframe(encode_entry(offset, RECORDS_PER_BATCH, b"m", data)))
            raws.append(raw)
            size += len(raw.data)
            offset += RECORDS_PER_BATCH
        out.append(LedgerSnapshot.in_memory(ledger_id, raws, size, 0))
    return tuple(out)


async def ticks_until(done) -> tuple[int, float]:
    """1 ms timer ticks until done(), and the longest extra delay of one (s)."""
    ticks, worst = 0, 0.0
    while not done():
        started = time.perf_counter()
        await asyncio.sleep(TICK_S)
        worst = max(worst, time.perf_counter() - started - TICK_S)
        ticks += 1
    return ticks, worst


async def one_round(job: CompactionJob, yield_every_s: float) -> dict:
    rewrite.YIELD_EVERY_S = yield_every_s
    started = time.perf_counter()
    task = asyncio.ensure_future(asyncio.to_thread(compact, job))
    ticks, worst = await ticks_until(task.done)
    seconds = time.perf_counter() - started
    assert task.result().records_removed > 0
    end = time.perf_counter() + seconds
    idle_ticks, idle_worst = await ticks_until(lambda: time.perf_counter() >= end)
    return {"pass_s": seconds, "ticks": ticks / seconds, "idle_ticks": idle_ticks / seconds, "worst_ms": worst * 1e3,
            "idle_worst_ms": idle_worst * 1e3}


async def measure(batches: int, rounds: int) -> dict[str, list[dict]]:
    job = CompactionJob("bench", "bench", snapshots(batches), 0, 1 << 26, False)
    default = rewrite.YIELD_EVERY_S
    results: dict[str, list[dict]] = {"yields every 2 ms": [], "never yields": []}
    try:
        for _ in range(rounds):
            results["yields every 2 ms"].append(await one_round(job, default))
            results["never yields"].append(await one_round(job, float("inf")))
    finally:
        rewrite.YIELD_EVERY_S = default
    return results


def table(results: dict[str, list[dict]], batches: int) -> str:
    lines = ["| pass | records | pass s | timer ticks/s during the pass | idle | during / idle | worst extra delay ms "
             "during / idle |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, runs in results.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        lines.append(f"| {name} | {batches * RECORDS_PER_BATCH:,} | {med['pass_s']:.2f} | {med['ticks']:.0f} | "
                     f"{med['idle_ticks']:.0f} | {med['ticks'] / med['idle_ticks']:.2f} | "
                     f"{med['worst_ms']:.1f} / {med['idle_worst_ms']:.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(table(asyncio.run(measure(args.batches, args.rounds)), args.batches))


if __name__ == "__main__":
    main()
