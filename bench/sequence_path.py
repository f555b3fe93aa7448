"""What application-chosen sequence ids cost the broker per record, in process: each batch validated as the Produce
handler validates it and published through `PartitionLog.publish_normal` to the durable result (file ledger, fsync
off), for batches of an idempotent producer as librdkafka builds them. No client and no network, so the broker's own
cost is not hidden behind the client's (the end-to-end `bench.sequence_ids` is bound by the Python producer). Variants:

* `off`: records without headers, validated without watching for the sequence-id headers: a build without the
  feature, the baseline for "batches without the headers pay nothing";
* `none`: the same records, validated as the broker does (watching for the headers);
* `plain-off`, `plain`: two headers of the sequence-id headers' size that kop does not read, without and with the
  watch;
* `sequence`: the two sequence-id headers, one name per partition with rising ids (a producer's stream);
* `sequence-mixed`: the same, but each batch mixes two names (judged record by record).

Timed: the variants side by side in one process, window by window in turn, thread CPU time, medians of rounds.
Counted (`--instructions`, needs valgrind): each variant in a process of its own under callgrind, instrumentation on
around the publishing loop only, so the count per record is exact and free of the machine's noise.

    python -m bench.sequence_path --records 100000 --rounds 5
    python -m bench.sequence_path --instructions --records 20000
"""
import argparse
import asyncio
import gc
import logging
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

from bench import machine
from bench import produce_instructions
from bench.report import Table, fmt
from bench.stats import median
from dedup import DedupConfig
from integration.broker_process import REPO
from kop.ledger.file_ledger import FileManagedLedger, LedgerConfig
from kop.partition import PartitionLog
from protocol.records import Record, build_batch, split_batches, validate_batch
from protocol.sequence_headers import SequenceHeaderScan

VARIANTS = ("off", "none", "plain-off", "plain", "sequence", "sequence-mixed")
UNWATCHED = ("off", "plain-off")
PLAIN_KEYS, SEQUENCE_KEYS = ("app.producer.name", "app.sequence.id"), ("kop.producer.name", "kop.sequence.id")
HEADER_KEYS = {"plain-off": PLAIN_KEYS, "plain": PLAIN_KEYS, "sequence": SEQUENCE_KEYS, "sequence-mixed": SEQUENCE_KEYS}
PRODUCERS = 4  # one partition each, as bench.sequence_ids spreads its records
BATCH_RECORDS = 200  # records per batch: what librdkafka sends at this rate (linger.ms 5)
WINDOW = 5  # batches in flight per producer


def _batches(variant: str, records: int, record_bytes: int, batch_records: int) -> list[list]:
    """Per producer, its batches (raw bytes) in order: values half random, headers as bench.produce writes them."""
    rng = random.Random(7)
    pool = [rng.randbytes(record_bytes // 2) + b"k" * (record_bytes - record_bytes // 2) for _ in range(64)]
    per_producer: list[list[bytes]] = [[] for _ in range(PRODUCERS)]
    now = int(time.time() * 1000)
    for p in range(PRODUCERS):
        for first in range(0, records // PRODUCERS, batch_records):
            batch = []
            for i in range(first, min(first + batch_records, records // PRODUCERS)):
                headers: tuple = ()
                if variant in HEADER_KEYS:
                    name_key, id_key = HEADER_KEYS[variant]
                    name = b"bench/%d" % p if variant != "sequence-mixed" else b"bench/%d/%d" % (p, i % 2)
                    headers = ((name_key, name), (id_key, b"%d" % i))
                batch.append(Record(i - first, now + i, None, pool[i % len(pool)], headers))
            per_producer[p].append(build_batch(batch, producer_id=p, producer_epoch=0, base_sequence=first))
    return per_producer


class _Run:
    """One variant: a PartitionLog per producer on file ledgers of its own."""

    def __init__(self, variant: str, directory: str, records: int, record_bytes: int, batch_records: int) -> None:
        self.variant = variant
        self.watch = None if variant in UNWATCHED else SequenceHeaderScan
        self.work = _batches(variant, records, record_bytes, batch_records)
        self.partitions = [PartitionLog("bench", p, FileManagedLedger.open(f"bench-{p}", f"{directory}/{p}",
                                                                            LedgerConfig(fsync=False), None),
                                        DedupConfig()) for p in range(PRODUCERS)]
        self.records = 0
        self.spent = 0.0

    async def start(self) -> None:
        for partition in self.partitions:
            await partition.apply_dedup_policy(True)

    @property
    def windows(self) -> int:
        return (len(self.work[0]) + WINDOW - 1) // WINDOW

    async def window(self, w: int) -> None:
        start = time.thread_time()
        results = []
        for p, partition in enumerate(self.partitions):
            for raw in self.work[p][w * WINDOW:(w + 1) * WINDOW]:
                [(header, view)] = split_batches(raw)
                records = validate_batch(header, view, watch=self.watch)
                results.append(partition.publish_normal(header, view, records=records))
                self.records += header.records_count
        for result in results:
            stored = await result
            if stored.error:
                raise AssertionError(f"{self.variant}: a batch was not stored: {stored}")
        self.spent += time.thread_time() - start

    async def close(self) -> None:
        for partition in self.partitions:
            await partition.close()


async def _timed(variants: Sequence[str], records: int, record_bytes: int, batch_records: int) -> dict[str, float]:
    """Microseconds of thread CPU per record for each variant, window by window side by side."""
    with tempfile.TemporaryDirectory(prefix="kop-bench-seqpath-") as directory:
        runs = [_Run(v, f"{directory}/{v}", records, record_bytes, batch_records) for v in variants]
        gc.collect()
        gc.freeze()  # the prebuilt batches are out of the collector's sight, as a broker holds no such heap
        try:
            for run in runs:
                await run.start()
            for w in range(runs[0].windows):
                for run in runs if w % 2 == 0 else runs[::-1]:
                    await run.window(w)
            for run in runs:
                await run.close()
        finally:
            gc.unfreeze()
    return {run.variant: run.spent / run.records * 1e6 for run in runs}


def measure_time(records: int, record_bytes: int, rounds: int, batch_records: int,
                 variants: Sequence[str] = VARIANTS, progress=print) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {v: [] for v in variants}
    logging.disable(logging.INFO)
    try:
        for r in range(rounds):
            order = list(variants) if r % 2 == 0 else list(variants)[::-1]
            for variant, us in asyncio.run(_timed(order, records, record_bytes, batch_records)).items():
                out[variant].append(us)
            progress(f"  round {r + 1}/{rounds}, {record_bytes} B: " +
                     ", ".join(f"{v} {out[v][-1]:.2f} µs" for v in variants))
    finally:
        logging.disable(logging.NOTSET)
    return out


def measure_instructions(records: int, record_bytes: int, batch_records: int,
                         variants: Sequence[str] = VARIANTS, progress=print) -> dict[str, float]:
    """Instructions per record of the publishing loop of each variant, each in a process of its own."""
    produce_instructions.require_valgrind()
    out = {}
    for variant in variants:
        with tempfile.TemporaryDirectory(prefix="kop-bench-callgrind-") as root:
            result = f"{root}/callgrind.out"
            inner = subprocess.run([*produce_instructions.valgrind(result), "--instr-atstart=no", sys.executable,
                                    "-m", "bench.sequence_path", "--inner", variant, "--records", str(records), "--sizes", str(record_bytes),
                                    "--batch-records", str(batch_records)],
                                   check=True, capture_output=True, text=True, timeout=3600, cwd=REPO)
            out[variant] = produce_instructions.totals(result) / int(inner.stdout.split()[-1])
        progress(f"  {record_bytes} B, {variant}: {out[variant]:,.0f} instructions/record")
    return out


async def _counted(variant: str, records: int, record_bytes: int, batch_records: int) -> int:
    """The process callgrind counts: instrumentation on around the publishing loop only; returns the records it
    counted."""
    with tempfile.TemporaryDirectory(prefix="kop-bench-seqpath-") as directory:
        run = _Run(variant, directory, records, record_bytes, batch_records)
        await run.start()
        await run.window(0)  # warm: imports, first ledger writes
        run.records = 0
        subprocess.run(["callgrind_control", "--instr=on", str(os.getpid())], check=True, capture_output=True)
        for w in range(1, run.windows):
            await run.window(w)
        subprocess.run(["callgrind_control", "--instr=off", str(os.getpid())], check=True, capture_output=True)
        await run.close()
        return run.records


def table(timed: dict[str, list[float]] | None, counted: dict[str, float] | None, title: str) -> Table:
    t = Table(title, ["variant", "µs/record", "vs off", "vs plain", "instructions/record", "vs off ", "vs plain "])
    for v in (timed or counted):
        us = median(timed[v]) if timed else float("nan")
        ratio = (lambda base: median([a / b for a, b in zip(timed[v], timed[base])])) if timed else None
        count = counted.get(v, float("nan")) if counted else float("nan")
        t.add(v, fmt(us, 2), f"{ratio('off'):.3f}" if ratio else "-",
              f"{ratio('plain'):.3f}" if ratio and "plain" in timed else "-", fmt(count),
              f"{count / counted['off']:.3f}" if counted and "off" in counted else "-",
              f"{count / counted['plain']:.3f}" if counted and "plain" in counted else "-")
    return t


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sequence_path", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=100_000, help="records per variant and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sizes", default="100,1000", help="record value bytes, comma-separated")
    parser.add_argument("--batch-records", type=int, default=BATCH_RECORDS)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--instructions", action="store_true", help="count instructions with callgrind instead")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--inner", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.inner:
        logging.disable(logging.INFO)
        print(asyncio.run(_counted(args.inner, args.records, sizes[0], args.batch_records)))
        return 0
    variants = args.variants.split(",")
    for size in sizes:
        if args.instructions:
            timed, counted = None, measure_instructions(args.records, size, args.batch_records, variants)
        else:
            timed, counted = measure_time(args.records, size, args.rounds, args.batch_records, variants), None
        t = table(timed, counted, f"sequence-id path, {size} B records ({machine.describe()})")
        t.notes[:] = [f"{args.records:,} records per variant, {args.batch_records} per batch, {PRODUCERS} partitions, "
                      f"idempotent producer; " + ("callgrind, publishing loop only" if counted else
                                                  f"{args.rounds} rounds, medians of per-round ratios, thread CPU")]
        print(t.markdown() + "\n\n_" + t.notes[0] + "_" if args.markdown else t.text())
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
