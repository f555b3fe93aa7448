"""`python -m bench.traced_kop OUT ARGS...`: the kop command line (`kop.cli` with ARGS) under tracemalloc, driven
by SIGUSR1: the first starts tracing (from the start, the imports alone would take minutes traced), each later one
writes a snapshot to OUT.N (N = 1, 2, ...). A benchmark starts tracing after a warm-up round and diffs what the
broker holds after one later round against what it held after another."""
import itertools
import runpy
import signal
import sys
import tracemalloc

FRAMES = 4  # enough to tell which caller a container's growth comes from


def main() -> None:
    out, args = sys.argv[1], sys.argv[2:]
    numbers = itertools.count(1)

    def on_signal(*_: object) -> None:
        if tracemalloc.is_tracing():
            tracemalloc.take_snapshot().dump(f"{out}.{next(numbers)}")
        else:
            tracemalloc.start(FRAMES)

    signal.signal(signal.SIGUSR1, on_signal)
    sys.argv = ["kop", *args]
    runpy.run_module("kop.cli", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
