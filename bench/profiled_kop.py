"""`python -m bench.profiled_kop OUT ARGS...`: the kop command line (`kop.cli` with ARGS) with a cProfile profiler
on its main thread (the event loop's) that SIGUSR1 starts and SIGUSR2 stops, writing its statistics to OUT, so a
benchmark profiles only the part of a run it measures."""
import cProfile
import runpy
import signal
import sys


def main() -> None:
    out, args = sys.argv[1], sys.argv[2:]
    profiler = cProfile.Profile()

    def stop(*_: object) -> None:
        profiler.disable()
        profiler.dump_stats(out)

    signal.signal(signal.SIGUSR1, lambda *_: profiler.enable())
    signal.signal(signal.SIGUSR2, stop)
    sys.argv = ["kop", *args]
    runpy.run_module("kop.cli", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
