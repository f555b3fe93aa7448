"""What PIP-6 deduplication costs: an idempotent librdkafka producer against a broker with
`brokerDeduplicationEnabled=false` and one with `=true`, interleaved (ABBA) over several rounds, fresh broker per run.

The overhead is 1 - median(per-round throughput ratio on/off); the broker's CPU per record is compared the same way
and is the steadier of the two figures (the producer, not the broker, is what saturates first). Two workloads:
librdkafka's usual batching (linger.ms 5, hundreds of records per batch) and single-record batches, where the
per-batch work of dedup weighs the most (with fsync, and without it, where the fsync path's variance does not
drown the difference). Goal: under 3 % overhead.

    python -m bench.dedup_overhead --records 300000 --single-records 10000 --rounds 5
"""
import argparse
from dataclasses import dataclass, replace

from bench import machine
from bench.produce import ProduceResult, ProduceSpec, run_interleaved
from bench.report import Table, fmt
from bench.stats import median, paired_ratios

CONFIGS = [{"brokerDeduplicationEnabled": "false"}, {"brokerDeduplicationEnabled": "true"}]
LABELS = ["dedup off", "dedup on"]
GOAL = 0.03


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    spec: ProduceSpec
    fsync: str = "true"


@dataclass(frozen=True, slots=True)
class Overhead:
    workload: str
    spec: ProduceSpec
    off: list[ProduceResult]
    on: list[ProduceResult]

    @property
    def throughput_overhead(self) -> float:
        """Fraction of throughput lost with dedup on (negative: dedup on was faster)."""
        return 1 - median(paired_ratios([r.records_per_s for r in self.on], [r.records_per_s for r in self.off]))

    @property
    def verdict(self) -> str:
        """Against the goal: 'yes' only if both throughput and broker CPU per record stay under it, 'no' if both
        exceed it; 'unclear' when they disagree (the machine's noise is larger than the effect)."""
        under = [self.throughput_overhead < GOAL, self.cpu_overhead < GOAL]
        return "yes" if all(under) else "no" if not any(under) else "unclear"

    @property
    def throughput_ratios(self) -> list[float]:
        return paired_ratios([r.records_per_s for r in self.on], [r.records_per_s for r in self.off])

    @property
    def cpu_ratios(self) -> list[float]:
        return paired_ratios([r.cpu_s_per_100k for r in self.on], [r.cpu_s_per_100k for r in self.off])

    @property
    def cpu_overhead(self) -> float:
        """Fraction of broker CPU per record added with dedup on."""
        return median(paired_ratios([r.cpu_s_per_100k for r in self.on], [r.cpu_s_per_100k for r in self.off])) - 1


def measure(workload: Workload, rounds: int, progress=print) -> Overhead:
    spec = replace(workload.spec, idempotence=True)
    configs = [{**c, "fsync": workload.fsync} for c in CONFIGS]
    progress(f" {workload.name}: {spec.shape}, {rounds} rounds, dedup off/on interleaved")
    off, on = run_interleaved([spec, spec], rounds, configs, progress=progress, labels=LABELS)
    return Overhead(workload.name, spec, off, on)


def workloads(records: int, single_records: int, record_bytes: int = 100, fsync: str = "true") -> list[Workload]:
    """The batched workload, then single-record batches with the given fsync, then (if fsync is on) single-record
    batches without fsync: the per-batch CPU cost of dedup, without the fsync path's large variance."""
    single = ProduceSpec(single_records, record_bytes, partitions=4, idempotence=True, linger_ms=0,
                         client=(("batch.num.messages", "1"),))
    out = [Workload(f"batched (linger.ms 5), fsync={fsync}", ProduceSpec(records, record_bytes, idempotence=True),
                    fsync),
           Workload(f"single-record batches, fsync={fsync}", single, fsync)]
    if fsync == "true":
        out.append(Workload("single-record batches, fsync=false", single, "false"))
    return [w for w in out if w.spec.records]


def _spread(ratios: list[float]) -> str:
    return f"{min(ratios):.2f}..{max(ratios):.2f}" if ratios else "-"


def table(overheads: list[Overhead], title: str) -> Table:
    t = Table(title, ["workload", "records", "rec/s off", "rec/s on", "throughput overhead", "on/off per round",
                      "CPU s/100k off", "CPU s/100k on", "CPU overhead", "on/off per round",
                      f"both < {GOAL:.0%}"])
    for o in overheads:
        t.add(o.workload, o.spec.shape, fmt(median([r.records_per_s for r in o.off])),
              fmt(median([r.records_per_s for r in o.on])), f"{o.throughput_overhead:+.1%}",
              _spread(o.throughput_ratios),
              fmt(median([r.cpu_s_per_100k for r in o.off]), 3), fmt(median([r.cpu_s_per_100k for r in o.on]), 3),
              f"{o.cpu_overhead:+.1%}", _spread(o.cpu_ratios), o.verdict)
    t.notes.append(f"{len(overheads[0].off)} rounds each, ABBA order, fresh broker per run; overheads are medians of "
                   "per-round ratios (on/off), whose range is shown; throughput overhead < 0 means dedup on was faster")
    return t


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.dedup_overhead", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=300_000, help="records in the batched workload")
    parser.add_argument("--single-records", type=int, default=10_000,
                        help="records in the single-record-batch workloads (0 to skip them)")
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--fsync", choices=["true", "false"], default="true")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    overheads = [measure(w, args.rounds) for w in workloads(args.records, args.single_records, args.size, args.fsync)]
    t = table(overheads, f"dedup overhead ({machine.describe()})")
    print(t.markdown() if args.markdown else t.text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
