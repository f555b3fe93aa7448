"""Coverage-guided fuzzing with atheris (libFuzzer for Python): `python -m fuzz --seconds N [TARGET ...]`.

Each target runs in a process of its own for N seconds (all targets when none is named), from its seeds and the
corpus earlier runs grew (build/fuzz/TARGET/corpus). A target stops at the first input that breaks its oracle or
runs longer than --input-timeout seconds; libFuzzer saves that input as build/fuzz/TARGET/crash-* (or timeout-*,
oom-*) and prints the traceback. `python -m fuzz --replay TARGET FILE...` runs saved inputs through the target
without atheris, as a regression test does.

Only the parsers are instrumented: kop's `protocol` package, `kop/security`, the admin API's credential check,
kafka-python's message classes and the decoders it generates for each request version, and scramp; for the
`broker` target (frames sent to a broker in the same process, fuzz/broker.py) all of kop and dedup too. Atheris's
import hook cannot select so: it picks whole top-level packages (kop.security would take all of kop, and
kafka.protocol all of kafka-python) and never sees the decoders kafka-python compiles at run time. So the runner
imports everything, calls each target once on every seed (which compiles those decoders), then instruments the
functions whose code lives in those files.
"""
import argparse
import gc
import os
import subprocess
import sys
import time
import types
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "build" / "fuzz"
MAX_LEN = {"request": 4096, "broker": 4096, "records": 4096, "codec": 4096, "sasl": 1024, "oauthbearer": 2048,
           "admin-auth": 1024}


def _scope(name: str) -> tuple[str, ...]:
    """The files whose functions are instrumented: the parsers, and for the broker target all of kop."""
    import kafka.protocol
    import scramp

    roots = (str(REPO / "protocol") + os.sep, str(REPO / "kop" / "security") + os.sep,
             str(REPO / "kop" / "admin" / "auth.py"), os.path.dirname(kafka.protocol.__file__) + os.sep,
             os.path.dirname(scramp.__file__) + os.sep, "<codegen_decode:")
    return roots + ((str(REPO / "kop") + os.sep, str(REPO / "dedup") + os.sep) if name == "broker" else ())


def _instrument(atheris, name: str) -> int:
    roots = _scope(name)
    functions = [obj for obj in gc.get_objects()
                 if isinstance(obj, types.FunctionType) and obj.__code__.co_filename.startswith(roots)]
    for function in functions:
        atheris.instrument_func(function)
    return len(functions)


def _write_seeds(name: str, directory: Path) -> list[bytes]:
    from fuzz.seeds import SEEDS

    directory.mkdir(parents=True, exist_ok=True)
    seeds = SEEDS[name]()
    for index, seed in enumerate(seeds):
        (directory / f"seed-{index:03d}").write_bytes(seed)
    return seeds


def run_one(name: str, seconds: int, input_timeout: int, extra: list[str]) -> None:
    """Fuzz one target in this process (libFuzzer exits the process when done)."""
    import atheris

    # the instrumented code's string comparisons (startswith, endswith) guide the fuzzer too; atheris's RegEx hook
    # is left off: its pattern proxy breaks the json module (kafka-python loads its schemas through it)
    atheris.enabled_hooks.add("str")
    from fuzz.targets import KEEP_DIRECTORY, TARGETS

    target = TARGETS[name]
    home = OUT / name
    os.environ[KEEP_DIRECTORY] = str(home)
    corpus, seeds_dir = home / "corpus", home / "seeds"
    corpus.mkdir(parents=True, exist_ok=True)
    for seed in _write_seeds(name, seeds_dir):
        target(seed)  # the seeds must pass, and this compiles the decoders before they are instrumented
    count = _instrument(atheris, name)
    print(f"fuzz {name}: {count} functions instrumented, {seconds} s", file=sys.stderr, flush=True)
    argv = [sys.argv[0], f"-max_total_time={seconds}", f"-timeout={input_timeout}", "-rss_limit_mb=2048",
            f"-max_len={MAX_LEN[name]}", f"-artifact_prefix={home}/", "-print_final_stats=1", *extra,
            str(corpus), str(seeds_dir)]
    atheris.Setup(argv, target)
    atheris.Fuzz()


def replay(name: str, files: list[str]) -> None:
    from fuzz.targets import TARGETS

    for path in files:
        TARGETS[name](Path(path).read_bytes())
        print(f"{path}: passed")


def run_all(names: list[str], seconds: int, input_timeout: int, extra: list[str]) -> int:
    """Each target in a child process, one after another; a summary line per target."""
    failed = 0
    for name in names:
        started = time.monotonic()
        log = OUT / name / "last-run.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "w") as out:
            code = subprocess.call([sys.executable, "-m", "fuzz", "--one", name, "--seconds", str(seconds),
                                    "--input-timeout", str(input_timeout), *extra], stdout=out, stderr=out,
                                   cwd=REPO)
        stats = _final_stats(log.read_text(errors="replace"))
        found = sorted(p.name for p in (OUT / name).iterdir() if p.name.startswith(("crash-", "timeout-", "oom-",
                                                                                       "slow-unit-")))
        print(f"{name}: exit {code} after {time.monotonic() - started:.0f} s, {stats}"
              + (f"; saved: {', '.join(found)}" if found else "") + f" (log: {log.relative_to(REPO)})")
        failed += code != 0
    return failed


def _final_stats(text: str) -> str:
    values = {}
    for line in text.splitlines():
        if line.startswith("stat::"):
            key, _, value = line[len("stat::"):].partition(":")
            values[key.strip()] = value.strip()
    coverage = [line.split(" cov: ")[1].split()[0] for line in text.splitlines()
                if line.startswith("#") and " cov: " in line]
    return (f"{values.get('number_of_executed_units', '?')} inputs, {values.get('average_exec_per_sec', '?')}/s, "
            f"coverage {coverage[-1] if coverage else '?'} edges, peak {values.get('peak_rss_mb', '?')} MB")


def main() -> int:
    targets = list(MAX_LEN)
    parser = argparse.ArgumentParser(prog="python -m fuzz", description=__doc__.split("\n\n")[0])
    parser.add_argument("targets", nargs="*", metavar="TARGET", help=f"of {', '.join(targets)} (default: all)")
    parser.add_argument("--seconds", type=int, default=60, help="per target")
    parser.add_argument("--input-timeout", type=int, default=10, help="seconds one input may take before it is "
                                                                      "reported as a hang")
    parser.add_argument("--one", choices=targets, help=argparse.SUPPRESS)
    parser.add_argument("--replay", nargs="+", metavar=("TARGET", "FILE"), help="run saved inputs, no atheris")
    parser.add_argument("--libfuzzer", action="append", default=[], help="an extra libFuzzer flag (repeatable)")
    args = parser.parse_args()
    if args.replay:
        replay(args.replay[0], args.replay[1:])
        return 0
    if args.one:
        run_one(args.one, args.seconds, args.input_timeout, args.libfuzzer)
        return 0
    unknown = set(args.targets) - set(targets)
    if unknown:
        parser.error(f"unknown target {', '.join(sorted(unknown))}: the targets are {', '.join(targets)}")
    extra = [f"--libfuzzer={flag}" for flag in args.libfuzzer]
    return 1 if run_all(args.targets or targets, args.seconds, args.input_timeout, extra) else 0


if __name__ == "__main__":
    sys.exit(main())
