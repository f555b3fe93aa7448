"""Broker instructions per single-record produce request, counted with valgrind's callgrind rather than timed: the
figure of the per-request cost that does not depend on the machine's noise (issue 18's goal: <= 30 µs of broker
CPU per such request, about 115,000 instructions at this machine's ~3.8 instructions per ns).

A `kop standalone` runs under callgrind (`--instr-atstart=no`: start-up and the warm-up are not counted) while an
idempotent librdkafka producer sends `--records` single-record batches (`batch.num.messages=1`, `linger.ms=0`,
acks=all, 4 partitions: one batch per Produce request, up to 5 requests in flight); the count covers every thread of
the broker, from the first record produced to the last acknowledged, divided by the records. Kernel work (the
syscalls themselves) is not counted, only the user-space instructions around them. How many requests the broker
finds waiting per wake-up varies a little from run to run, and the count with it, by a per cent or two.

    python -m bench.produce_instructions --records 1500 --rounds 3          # needs valgrind (not a dependency)
    python -m bench.produce_instructions --fsync true --keep /tmp/cg        # keep callgrind.out for callgrind_annotate
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

from bench import machine
from bench.brokers import RDKAFKA_LOG, create_topic
from bench.report import Table, fmt
from bench.stats import median
from integration.broker_process import REPO, BrokerProcess

PARTITIONS = 4
TOPIC = "bench-instructions"


def callgrind_control(*args: str) -> None:
    subprocess.run(["callgrind_control", *args], check=True, capture_output=True, timeout=120)


def valgrind(out: str) -> tuple[str, ...]:
    return ("valgrind", "--tool=callgrind", f"--callgrind-out-file={out}")


def totals(path: str) -> int:
    """The instruction total of a callgrind output file."""
    with open(path) as f:
        for line in f:
            if line.startswith("totals:"):
                return int(line.split()[1])
    raise RuntimeError(f"no totals line in {path}")


def require_valgrind() -> None:
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("valgrind not found (apt-get install valgrind)")


def instructions_per_record(config: dict[str, str], records: int, keep: str | None = None,
                            program: tuple[str, ...] = (sys.executable, "-m", "kop.cli"),
                            cwd: str | None = None) -> float:
    """Instructions the broker executes per single-record batch (one per request), from the first record produced
    to the last acknowledged. `config`: broker settings; `keep`: a directory to copy the callgrind output to;
    `program`/`cwd`: the broker to run (another tree's, for a comparison)."""
    from confluent_kafka import Producer
    root = tempfile.mkdtemp(prefix="kop-bench-callgrind-")
    out = os.path.join(root, "callgrind.out")
    broker = BrokerProcess(f"{root}/data", config=dict(config),
                           program=(*valgrind(out), "--instr-atstart=no", *program), cwd=cwd or REPO)
    try:
        broker.start(timeout=300)
        create_topic(broker.bootstrap, TOPIC, PARTITIONS, timeout_s=120)
        producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "linger.ms": 0,
                             "enable.idempotence": True, "batch.num.messages": 1, "logger": RDKAFKA_LOG})
        for p in range(PARTITIONS):  # warm-up outside the count: metadata, connections, the producer id
            producer.produce(TOPIC, b"warm-up", partition=p)
        if producer.flush(120) != 0:
            raise RuntimeError("warm-up records were not delivered within 120 s")
        callgrind_control("--instr=on", str(broker.proc.pid))
        value = b"x" * 100
        deadline = time.monotonic() + 900
        for i in range(records):
            while True:
                try:
                    producer.produce(TOPIC, value, partition=i % PARTITIONS)
                    break
                except BufferError:
                    producer.poll(0.01)
        if producer.flush(max(1.0, deadline - time.monotonic())) != 0:
            raise TimeoutError("records undelivered after 900 s under valgrind")
        callgrind_control("--dump=measured", str(broker.proc.pid))  # written as out.1
        del producer
        if keep:
            os.makedirs(keep, exist_ok=True)
            shutil.copy(f"{out}.1", os.path.join(keep, "callgrind.out"))
        return totals(f"{out}.1") / records
    finally:
        broker.stop(120)
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.produce_instructions", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--fsync", choices=["true", "false"], default="false",
                        help="false by default, as BENCHMARKS.md counts: the fsync's thread hand-off is measured "
                             "with true")
    parser.add_argument("--dedup", choices=["true", "false"], default="true")
    parser.add_argument("--keep", help="copy the (last round's) callgrind output into this directory")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    require_valgrind()
    config = {"fsync": args.fsync, "brokerDeduplicationEnabled": args.dedup}
    counts = []
    for r in range(args.rounds):
        counts.append(instructions_per_record(config, args.records, args.keep))
        print(f"  round {r + 1}/{args.rounds}: {counts[-1]:,.0f} instructions per request")
    t = Table(f"Broker instructions per single-record produce request ({machine.describe()})",
              ["records", "fsync", "dedup", "instructions per request", "rounds (min..max)"])
    t.add(f"{args.records:,} x 100 B", args.fsync, args.dedup, fmt(median(counts)),
          f"{min(counts):,.0f}..{max(counts):,.0f}")
    t.notes.append(f"{args.rounds} rounds, median; all threads, user space; librdkafka idempotent producer, "
                   f"batch.num.messages=1, linger.ms 0, acks=all, {PARTITIONS} partitions")
    print(t.markdown() + "\n\n" + "\n".join(f"_{n}_" for n in t.notes) if args.markdown else t.text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
