"""Where the broker spends its CPU on the produce path: py-spy samples a `kop standalone` process while a
confluent-kafka producer runs one of the produce workloads, then the samples are folded into self and total time
per function.

    pip install py-spy   # into the venv; not a project dependency
    python -m bench.profile_produce --workload single --records 20000

Workloads: `batched` (idempotent, linger.ms 5, 100 B records: hundreds of records per batch), `single`
(idempotent, one record per batch: per-request and per-batch costs), `large` (10 KB records: per-byte costs),
`sequence` and `plain-headers` (`batched` with the two sequence-id headers, or two headers of the same size kop does
not read).
"""
import argparse
import collections
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace

from bench.brokers import create_topic, running_broker
from bench.procstat import cpu_times
from bench.produce import ProduceSpec, produce
from bench.report import Table

WORKLOADS = {
    "batched": ProduceSpec(200_000, 100, partitions=4, idempotence=True),
    "single": ProduceSpec(20_000, 100, partitions=4, idempotence=True, linger_ms=0,
                          client=(("batch.num.messages", "1"),)),
    "large": ProduceSpec(20_000, 10_000, partitions=4, idempotence=True),
    # 100 B records with the two application sequence-id headers, and with two plain headers of the same size
    "sequence": ProduceSpec(200_000, 100, partitions=4, idempotence=True, headers="sequence"),
    "plain-headers": ProduceSpec(200_000, 100, partitions=4, idempotence=True, headers="plain"),
}
_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # paths in the tree are shown from here


@dataclass(frozen=True, slots=True)
class FunctionTime:
    function: str  # "name (path relative to the repo or site-packages)"
    self_samples: int
    total_samples: int


@dataclass(frozen=True, slots=True)
class Profile:
    samples: int
    functions: list[FunctionTime]  # by self samples, most first


def _short(path: str) -> str:
    for marker in ("site-packages/", "/lib/python3.11/", f"{REPO_ROOT}/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return os.path.basename(path)


def _function_of(frame: str) -> str:
    m = _FRAME.match(frame.strip())
    return f"{m['func']} ({_short(m['file'])})" if m else frame.strip()


def fold(raw_lines: list[str]) -> Profile:
    """py-spy's raw (collapsed) output -> per-function self and total sample counts (line numbers merged)."""
    self_counts: collections.Counter = collections.Counter()
    total_counts: collections.Counter = collections.Counter()
    samples = 0
    for line in raw_lines:
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        samples += n
        functions = [_function_of(f) for f in stack.split(";") if f]
        if not functions:
            continue
        self_counts[functions[-1]] += n
        for name in set(functions):
            total_counts[name] += n
    ordered = sorted(self_counts, key=lambda k: -self_counts[k])
    return Profile(samples, [FunctionTime(k, self_counts[k], total_counts[k]) for k in ordered])


def profile(spec: ProduceSpec, rate_hz: int = 250, broker_config: dict[str, str] | None = None,
            gil_only: bool = False) -> Profile:
    py_spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.path.exists(py_spy):
        raise SystemExit("py-spy not found: pip install py-spy (into the venv)")
    out_dir = tempfile.mkdtemp(prefix="kop-bench-profile-")
    raw = os.path.join(out_dir, "samples.txt")
    try:
        with running_broker(broker_config) as broker:
            create_topic(broker.bootstrap, "bench-profile", spec.partitions)
            sampler = subprocess.Popen([py_spy, "record", "--pid", str(broker.proc.pid), "--rate", str(rate_hz),
                                        "--format", "raw", "--output", raw] + (["--gil"] if gil_only else []),
                                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            user0, sys0 = cpu_times(broker.proc.pid)
            try:
                result = produce(broker.bootstrap, "bench-profile", spec, broker.proc.pid)
            finally:
                user1, sys1 = cpu_times(broker.proc.pid)
                sampler.send_signal(signal.SIGINT)  # py-spy writes its output on Ctrl-C
                _, err = sampler.communicate(timeout=60)
            print(f"  {spec.shape} {spec.label}: {result.records_per_s:,.0f} rec/s, broker "
                  f"{result.broker_cpu_s:.2f} CPU s ({result.cpu_s_per_100k:.2f} per 100k records; "
                  f"user {user1 - user0:.2f} s, system {sys1 - sys0:.2f} s, sampled by py-spy)")
        if not os.path.exists(raw):
            raise RuntimeError(f"py-spy wrote no samples: {err.decode(errors='replace')[-2000:]}")
        with open(raw) as f:
            return fold(f.readlines())
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


def table(p: Profile, title: str, top: int) -> Table:
    t = Table(title, ["function", "self %", "total %"])
    for f in p.functions[:top]:
        t.add(f.function, f"{100 * f.self_samples / p.samples:.1f}", f"{100 * f.total_samples / p.samples:.1f}")
    t.notes.append(f"{p.samples} samples; self = the function itself was running, total = it was on the stack")
    return t


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile_produce", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="batched")
    parser.add_argument("--records", type=int, help="override the workload's record count")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--rate", type=int, default=250, help="samples per second")
    parser.add_argument("--gil", action="store_true", help="sample only the thread holding the GIL (Python work)")
    parser.add_argument("--fsync", choices=["true", "false"], default="true")
    parser.add_argument("--dedup", choices=["true", "false"], default="true",
                        help="brokerDeduplicationEnabled (profile both to see what deduplication costs)")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    spec = WORKLOADS[args.workload]
    if args.records:
        spec = replace(spec, records=args.records)
    p = profile(spec, args.rate, {"fsync": args.fsync, "brokerDeduplicationEnabled": args.dedup}, gil_only=args.gil)
    t = table(p, f"broker self time, produce workload '{args.workload}' ({spec.shape}, {spec.label}, "
                 f"fsync={args.fsync}, dedup={args.dedup}{', GIL holder only' if args.gil else ''})", args.top)
    print(t.markdown() + "\n" + "\n".join(f"_{n}_" for n in t.notes) if args.markdown else t.text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
