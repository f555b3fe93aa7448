"""What application-chosen sequence ids cost the produce path: records with the headers `kop.producer.name` and
`kop.sequence.id` (each judged on its own by kop's dedup core) against the same records without headers, and
against two other headers of the same size that kop does not read (the same work for the client, so the ratio to
them is the broker's cost alone). confluent-kafka, idempotent, acks=all, 4 partitions, fresh broker per run,
variants interleaved round after round (bench.produce).

    python -m bench.sequence_ids --records 200000 --rounds 3
"""
import argparse
from dataclasses import replace

from bench import machine
from bench.produce import ProduceSpec, run_interleaved, table
from bench.report import Table

HEADERS = ("none", "plain", "sequence")


def run(records: int, rounds: int, sizes: list[int]) -> list[Table]:
    tables = []
    for size in sizes:
        base = ProduceSpec(records, size, idempotence=True)
        specs = [replace(base, headers=h) for h in HEADERS]
        results = run_interleaved(specs, rounds)
        tables.append(table(results, f"sequence ids, {size} B records ({machine.describe()})"))
    return tables


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sequence_ids", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sizes", default="100,1000", help="record value bytes, comma-separated")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    for t in run(args.records, args.rounds, [int(s) for s in args.sizes.split(",")]):
        print(t.markdown() if args.markdown else t.text())
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
