"""Per-second samples and the whole run's summary: records, bytes and latency percentiles.

The producer's delivery callback and the consumer's loop append each record's latency to `Recorder.latencies` (an
array of floats in the unit the caller names) and its value size to `Recorder.bytes`; once a second `tick` turns
what arrived since the last tick into a `Sample` and folds its latencies into the run's histogram, so memory holds
one second of raw latencies at most. A NaN latency (a record without a timestamp) counts as a record without one.
"""
from __future__ import annotations

import math
from array import array
from dataclasses import dataclass

import numpy as np

from kop.perf.histogram import LatencyHistogram

MB = 1 << 20  # as Kafka's perf tools count


@dataclass(frozen=True)
class Latency:
    """Percentiles in milliseconds."""

    p50: float
    p95: float
    p99: float
    p999: float
    max: float
    mean: float

    @classmethod
    def of(cls, histogram: LatencyHistogram) -> Latency | None:
        if histogram.count == 0:
            return None
        ms = [histogram.percentile(q) / 1000 for q in (0.50, 0.95, 0.99, 0.999)]
        return cls(*ms, max=histogram.max_us / 1000, mean=histogram.mean_us / 1000)


@dataclass(frozen=True)
class Totals:
    """Records and bytes over some seconds: the whole run (the command says from when to when), or one sample."""

    records: int
    bytes: int
    seconds: float
    latency: Latency | None

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else math.nan

    @property
    def mb_per_s(self) -> float:
        return self.bytes / MB / self.seconds if self.seconds > 0 else math.nan


@dataclass(frozen=True)
class Sample(Totals):
    """What happened in one reporting interval (`seconds` long)."""

    time_s: float  # the interval's end, seconds since the run started


class Recorder:
    def __init__(self, latency_unit_us: float, started_at: float) -> None:
        self.latencies = array("d")  # this interval's, appended to by the hot loop (its append may be bound once)
        self.bytes = 0  # this interval's
        self.samples: list[Sample] = []
        self.records = 0  # the run's, up to the last tick
        self.total_bytes = 0
        self.histogram = LatencyHistogram()
        self._unit_us = latency_unit_us
        self._started_at = self._last_tick = started_at

    def tick(self, now: float) -> Sample:
        raw = np.frombuffer(self.latencies, dtype=np.float64) * self._unit_us  # a copy: the view is released
        interval = LatencyHistogram()
        interval.record(raw[~np.isnan(raw)])
        sample = Sample(len(self.latencies), self.bytes, now - self._last_tick, Latency.of(interval),
                        time_s=now - self._started_at)
        self.histogram.add(interval)
        self.records += sample.records
        self.total_bytes += sample.bytes
        self.samples.append(sample)
        del self.latencies[:]  # emptied in place, so the hot loop may hold on to its append
        self.bytes = 0
        self._last_tick = now
        return sample

    def totals(self, elapsed_s: float) -> Totals:
        return Totals(self.records, self.total_bytes, elapsed_s, Latency.of(self.histogram))

