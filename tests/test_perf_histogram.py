"""The perf tool's latency histogram against exact nearest-rank percentiles of the same values."""
import math

import numpy as np
import pytest

from kop.perf.histogram import LatencyHistogram
from kop.perf.stats import Recorder


def exact(values: np.ndarray, fraction: float) -> float:
    ordered = np.sort(values)
    return float(ordered[max(1, math.ceil(fraction * len(ordered) - 1e-9)) - 1])


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_percentiles_are_within_one_percent_of_exact(seed):
    rng = np.random.default_rng(seed)
    values = np.rint(rng.lognormal(mean=8, sigma=2, size=100_000))  # ~3 ms median, a long tail
    histogram = LatencyHistogram()
    for part in np.array_split(values, 7):  # recorded batch by batch, as the tool does once a second
        histogram.record(part)
    for fraction in (0.5, 0.95, 0.99, 0.999):
        assert histogram.percentile(fraction) == pytest.approx(exact(values, fraction), rel=0.01, abs=1)
    assert histogram.percentile(1.0) == histogram.max_us == values.max()
    assert (histogram.count, histogram.min_us) == (len(values), values.min())
    assert histogram.mean_us == pytest.approx(values.mean())


def test_small_values_are_exact_and_negative_ones_count_as_zero():
    histogram = LatencyHistogram()
    histogram.record(np.array([-5.0, 1, 2, 3, 200]))
    assert [histogram.percentile(q) for q in (0.2, 0.4, 0.6, 0.8, 1.0)] == [0, 1, 2, 3, 200]


def test_merged_histograms_equal_one_over_all_values():
    rng = np.random.default_rng(7)
    a, b = rng.integers(1, 10**7, 5000), rng.integers(1, 10**4, 5000)
    merged, whole = LatencyHistogram(), LatencyHistogram()
    merged.record(a)
    other = LatencyHistogram()
    other.record(b)
    merged.add(other)
    whole.record(np.concatenate([a, b]))
    assert np.array_equal(merged.counts, whole.counts)
    assert (merged.min_us, merged.max_us, merged.total_us) == (whole.min_us, whole.max_us, whole.total_us)


def test_recorder_samples_each_interval_and_totals_the_run():
    recorder = Recorder(latency_unit_us=1000, started_at=10.0)  # latencies in ms
    append = recorder.latencies.append  # bound once, as the hot loops do
    for ms in (1.0, 2.0, 3.0):
        append(ms)
    recorder.bytes += 300
    first = recorder.tick(11.0)
    append(50.0)
    append(math.nan)  # a record without a timestamp: counted, no latency
    recorder.bytes += 200
    second = recorder.tick(12.5)
    assert (first.records, first.bytes, first.latency.max, first.records_per_s) == (3, 300, 3.0, 3.0)
    assert (second.records, second.latency.p50, second.seconds) == (2, 50.0, 1.5)
    totals = recorder.totals(elapsed_s=2.5)
    assert (totals.records, totals.bytes, totals.records_per_s) == (5, 500, 2.0)
    assert (totals.latency.p50, totals.latency.max) == (pytest.approx(2.0, rel=0.01), 50.0)
