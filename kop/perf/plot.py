"""A PNG of a run: throughput (records/s, MB/s) and latency percentiles over time, one point per sample."""
from __future__ import annotations

import math

from kop.perf.stats import MB, Sample


def plot(samples: list[Sample], title: str, latency_label: str, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")  # files only: no display needed, none opened
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    times = [s.time_s for s in samples]
    figure, (rates, latencies) = plt.subplots(2, 1, sharex=True, figsize=(10, 7), constrained_layout=True)
    figure.suptitle(title)
    rates.plot(times, [s.records_per_s for s in samples], color="tab:blue", marker=".")
    rates.set_ylabel("records/s", color="tab:blue")
    rates.set_ylim(bottom=0)
    per_record = _mb_per_record(samples)  # records/s and MB/s read off one line: a second scale on the right
    if per_record:
        rates.secondary_yaxis("right", functions=(lambda r: r * per_record, lambda m: m / per_record)).set_ylabel(
            "MB/s")
    rates.grid(True, alpha=0.3)
    for name, color in (("p50", "tab:green"), ("p95", "tab:blue"), ("p99", "tab:orange"), ("max", "tab:red")):
        latencies.plot(times, [getattr(s.latency, name) if s.latency else math.nan for s in samples],
                       label=name, color=color, marker=".")
    latencies.set_ylabel(f"{latency_label} (ms)")
    latencies.set_xlabel("seconds since start")
    if any(s.latency and s.latency.max > 0 for s in samples):
        latencies.set_yscale("log")  # p50 and max often differ by orders of magnitude
        plain = FuncFormatter(lambda value, _: f"{value:g}")
        latencies.yaxis.set_major_formatter(plain)
        latencies.yaxis.set_minor_formatter(plain)
    latencies.grid(True, which="both", alpha=0.3)
    latencies.legend(loc="upper left")
    figure.savefig(path, format="png", dpi=100)
    plt.close(figure)


def _mb_per_record(samples: list[Sample]) -> float:
    records = sum(s.records for s in samples)
    return sum(s.bytes for s in samples) / MB / records if records else 0.0
