"""The fetch path's entry filter (kop/partition.py `data_entries`, which a consumer's read calls): one list
comprehension that drops markers (span 0), against checking first and building a list only when an entry must go. Entries without markers, as most
reads are. Timed (ns per read, the best of `--repeat` timeit runs), or with `--instructions` counted by valgrind's
callgrind (instructions per read: a process running a variant `--number` times less one running it none, so
start-up and set-up cancel; noise-free, which timing on a shared machine is not).

    python -m bench.fetch_filter
    python -m bench.fetch_filter --instructions --number 2000     # needs valgrind
"""
import argparse
import operator
import re
import subprocess
import sys
import timeit

from bench.report import Table
from kop.partition import data_entries
from kop.ledger import Entry
from kop.ledger.interface import Position

SPAN = operator.attrgetter("span")


def _entries(n: int) -> list[Entry]:
    return [Entry(Position(1, i), i * 10, 10, b"", memoryview(b"x" * 100)) for i in range(n)]


COLUMNS = ["entries read", "list comprehension (kept)", "all(e.span for e in ...), then the list if needed",
           "all(map(attrgetter('span'), ...)), then the same"]


def _variants(entries: list[Entry]):
    return (lambda: data_entries(entries),
            lambda: entries if all(e.span for e in entries) else [e for e in entries if e.span],
            lambda: entries if all(map(SPAN, entries)) else [e for e in entries if e.span])


def run(sizes: list[int], number: int, repeat: int) -> Table:
    table = Table("dropping markers from a read without any, ns per read (timed)", COLUMNS)
    for n in sizes:
        table.add(str(n), *(f"{min(timeit.repeat(v, number=number, repeat=repeat)) / number * 1e9:,.0f}"
                            for v in _variants(_entries(n))))
    return table


def run_instructions(sizes: list[int], number: int) -> Table:
    table = Table("dropping markers from a read without any, instructions per read (callgrind)", COLUMNS)
    for n in sizes:
        baseline = _count(n, 0, 0)  # start-up and set-up, the same for every variant
        table.add(str(n), *(f"{(_count(n, v, number) - baseline) / number:,.0f}" for v in range(3)))
    return table


def _count(size: int, variant: int, number: int) -> int:
    """Instructions of a process that runs variant `variant` on `size` entries `number` times."""
    done = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, "-m",
                           "bench.fetch_filter", "--one", str(size), str(variant), str(number)],
                          capture_output=True, text=True, timeout=600, check=True)
    return int(re.search(r"Collected : (\d+)", done.stderr).group(1))


def _one(size: int, variant: int, number: int) -> None:
    call = _variants(_entries(size))[variant]
    for _ in range(number):
        call()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.fetch_filter", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 10, 100])
    parser.add_argument("--number", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--instructions", action="store_true", help="count instructions with callgrind")
    parser.add_argument("--one", type=int, nargs=3, metavar=("SIZE", "VARIANT", "NUMBER"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        _one(*args.one)
        return
    table = run_instructions(args.sizes, args.number) if args.instructions else run(args.sizes, args.number,
                                                                                        args.repeat)
    print(table.markdown() if args.markdown else table.text())


if __name__ == "__main__":
    main()
