"""`python -m bench.traced_kop OUT ARGS...`: the kop command line (`kop.cli` with ARGS) with tracemalloc tracing
every allocation from the start; each SIGUSR1 writes a snapshot to OUT.N (N = 1, 2, ...), so a benchmark can diff
what the broker holds after one round of load against what it held after an earlier one."""
import itertools
import runpy
import signal
import sys
import tracemalloc


def main() -> None:
    out, args = sys.argv[1], sys.argv[2:]
    tracemalloc.start(8)
    numbers = itertools.count(1)
    signal.signal(signal.SIGUSR1, lambda *_: tracemalloc.take_snapshot().dump(f"{out}.{next(numbers)}"))
    sys.argv = ["kop", *args]
    runpy.run_module("kop.cli", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
