"""What application-chosen sequence ids cost the produce path: records with the headers `kop.producer.name` and
`kop.sequence.id` (each judged on its own by kop's dedup core) against the same records without headers, and
against two other headers of the same size that kop does not read (the same work for the client, so the ratio to
them is the broker's cost alone). confluent-kafka, idempotent, acks=all, 4 partitions, fresh broker per run,
variants interleaved round after round (bench.produce). Every record's headers are built before the clock starts;
with --producers N, N producer processes share the records, so that the broker rather than one Python client loop
sets the pace (the table gives the broker's CPU per record and the clients', and how busy the broker was).

    python -m bench.sequence_ids --records 200000 --rounds 3 --producers 2
    python -m bench.sequence_ids --records 400000 --rounds 3 --java   # the Java client: far less CPU per record
    python -m bench.sequence_ids --against ../kop-main   # also against the kop of another tree, side by side
"""
import argparse
from dataclasses import replace

from bench import machine
from bench.produce import ProduceSpec, run_interleaved, table
from bench.report import Table, fmt, print_tables
from bench.stats import median, paired_ratios

HEADERS = ("none", "plain", "sequence")


def run(records: int, rounds: int, sizes: list[int], producers: int = 1,
        driver: str = "confluent-kafka", fsync: str = "true") -> list[Table]:
    tables = []
    for size in sizes:
        base = ProduceSpec(records, size, idempotence=True, producers=producers, driver=driver)
        specs = [replace(base, headers=h) for h in HEADERS]
        results = run_interleaved(specs, rounds, [{"fsync": fsync}] * len(specs))
        clients = "the Java client" if driver == "java" else f"{producers} confluent-kafka producer process(es)"
        t = table(results, f"sequence ids, {size} B records, {clients}, fsync={fsync} ({machine.describe()})")
        none, plain, sequence = results
        rate = lambda rs: [r.records_per_s for r in rs]  # noqa: E731
        cpu = lambda rs: [r.cpu_s_per_100k for r in rs]  # noqa: E731
        t.notes.append(f"sequence / none: throughput {median(paired_ratios(rate(sequence), rate(none))):.2f}x, "
                       f"broker CPU per record {median(paired_ratios(cpu(sequence), cpu(none))):.2f}x; "
                       f"sequence / plain: throughput {median(paired_ratios(rate(sequence), rate(plain))):.2f}x, "
                       f"broker CPU per record {median(paired_ratios(cpu(sequence), cpu(plain))):.2f}x")
        tables.append(t)
    return tables


def run_against(records: int, rounds: int, sizes: list[int], other: str) -> list[Table]:
    """The three variants on this tree's kop and on `other`'s, all six interleaved in each round."""
    trees = {"this tree": None, other: other}
    tables = []
    for size in sizes:
        base = ProduceSpec(records, size, idempotence=True)
        specs = [replace(base, headers=h) for _ in trees for h in HEADERS]
        runs = run_interleaved(specs, rounds, trees=[tree for tree in trees.values() for _ in HEADERS],
                               labels=[f"{label}: {h} headers" for label in trees for h in HEADERS])
        t = Table(f"sequence ids, {size} B records, two trees side by side ({machine.describe()})",
                  ["kop", "rec/s none", "rec/s plain", "rec/s sequence", "sequence / plain", "sequence / none",
                   "CPU µs/rec none", "CPU µs/rec plain", "CPU µs/rec sequence", "CPU sequence / plain"])
        for i, label in enumerate(trees):
            none, plain, sequence = runs[3 * i:3 * i + 3]
            rate = lambda rs: [r.records_per_s for r in rs]  # noqa: E731
            cpu = lambda rs: [r.cpu_s_per_100k * 10 for r in rs]  # noqa: E731  (s/100k -> µs/record)
            t.add(label, *(fmt(median(rate(v))) for v in (none, plain, sequence)),
                  f"{median(paired_ratios(rate(sequence), rate(plain))):.2f}x",
                  f"{median(paired_ratios(rate(sequence), rate(none))):.2f}x",
                  *(fmt(median(cpu(v)), 2) for v in (none, plain, sequence)),
                  f"{median(paired_ratios(cpu(sequence), cpu(plain))):.2f}x")
        t.notes.append(f"{rounds} rounds, medians of values and of per-round ratios")
        tables.append(t)
    return tables


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sequence_ids", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sizes", default="100,1000", help="record value bytes, comma-separated")
    parser.add_argument("--producers", type=int, default=1, help="producer processes sharing the records")
    parser.add_argument("--java", action="store_true",
                        help="produce with the Java client (one process; `make java` builds it) instead")
    parser.add_argument("--fsync", choices=["true", "false"], default="true",
                        help="broker fsync; false takes the disk's latency out, so the broker's CPU sets the pace")
    parser.add_argument("--against", metavar="TREE", help="also run the kop of another source tree, side by side")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    tables = (run_against(args.records, args.rounds, sizes, args.against) if args.against
              else run(args.records, args.rounds, sizes, args.producers, "java" if args.java else "confluent-kafka",
                  args.fsync))
    print_tables(tables, args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
