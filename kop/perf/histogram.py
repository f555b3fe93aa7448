"""A log-linear latency histogram (HdrHistogram's bucket layout) over numpy arrays.

Values are recorded in whole microseconds a batch at a time, so recording costs one vectorised pass per reporting
interval instead of a Python call per record, and memory is fixed (a few thousand counters) however long the run.
Below SUB_BUCKETS microseconds every value has its own bucket; above, each power of two is split into SUB_BUCKETS/2
buckets, so a percentile is within 1/128 (0.8 %) of the true value. The exact minimum, maximum and sum are kept too.
"""
from __future__ import annotations

import math

import numpy as np

SUB_BUCKET_BITS = 8
SUB_BUCKETS = 1 << SUB_BUCKET_BITS  # 256
HALF = SUB_BUCKETS // 2
MAX_SHIFT = 40  # values up to 2**48 us (8.9 years) have a bucket; larger ones land in the last


def _bucket_indexes(micros: np.ndarray) -> np.ndarray:
    # bit_length(v) == frexp(v).exponent for v >= 1, exact for integers below 2**53
    shift = np.clip(np.frexp(micros)[1].astype(np.int64) - SUB_BUCKET_BITS, 0, MAX_SHIFT)
    top = micros >> shift  # in [HALF, SUB_BUCKETS) once shifted, [0, SUB_BUCKETS) if not
    return np.where(shift == 0, top, SUB_BUCKETS + (shift - 1) * HALF + (np.minimum(top, SUB_BUCKETS - 1) - HALF))


def _bucket_bounds(index: int) -> tuple[int, int]:
    """[low, high) of the values that land in bucket `index`."""
    if index < SUB_BUCKETS:
        return index, index + 1
    shift, offset = divmod(index - SUB_BUCKETS, HALF)
    shift += 1
    low = (HALF + offset) << shift
    return low, low + (1 << shift)


class LatencyHistogram:
    """Counts of latencies (microseconds); merge two with `add`."""

    SIZE = SUB_BUCKETS + MAX_SHIFT * HALF

    def __init__(self) -> None:
        self.counts = np.zeros(self.SIZE, dtype=np.int64)
        self.count = 0
        self.total_us = 0
        self.min_us = 0
        self.max_us = 0

    def record(self, micros: np.ndarray) -> None:
        """Record a batch; negative values (a clock behind the producer's) count as 0."""
        if micros.size == 0:
            return
        values = np.maximum(np.rint(micros), 0).astype(np.int64)
        self.counts += np.bincount(_bucket_indexes(values), minlength=self.SIZE)
        low, high = int(values.min()), int(values.max())
        self.min_us = low if self.count == 0 else min(self.min_us, low)
        self.max_us = max(self.max_us, high)
        self.count += int(values.size)
        self.total_us += int(values.sum())

    def add(self, other: LatencyHistogram) -> None:
        if other.count == 0:
            return
        self.counts += other.counts
        self.min_us = other.min_us if self.count == 0 else min(self.min_us, other.min_us)
        self.max_us = max(self.max_us, other.max_us)
        self.count += other.count
        self.total_us += other.total_us

    def percentile(self, fraction: float) -> float:
        """Nearest-rank percentile (fraction in 0..1) in microseconds: the middle of the bucket holding that rank,
        kept within the exact minimum and maximum (so p100 is the maximum). NaN when empty."""
        if self.count == 0:
            return float("nan")
        rank = max(1, math.ceil(fraction * self.count - 1e-9))  # 0.95 * 100 is 95.00000000000001
        if rank >= self.count:
            return float(self.max_us)
        index = int(np.searchsorted(np.cumsum(self.counts), rank))
        low, high = _bucket_bounds(index)
        return float(min(max((low + high - 1) / 2, self.min_us), self.max_us))

    @property
    def mean_us(self) -> float:
        return self.total_us / self.count if self.count else float("nan")
