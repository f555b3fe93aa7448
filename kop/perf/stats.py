"""Per-second samples and the whole run's summary: records, bytes and latency percentiles.

The producer's delivery callback and the consumer's loop append each record's latency to `Recorder.latencies` (an
array of floats in the unit the caller names) and its value size to `Recorder.bytes`; once a second `tick` turns
what arrived since the last tick into a `Sample` and folds its latencies into the run's histogram, so memory holds
one second of raw latencies at most. A NaN latency (a record without a timestamp) counts as a record without one.
"""
from __future__ import annotations

import math
from array import array
from collections.abc import Callable
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
class Sample:
    """What happened in one reporting interval."""

    time_s: float  # the interval's end, seconds since the run started
    interval_s: float
    records: int
    bytes: int
    latency: Latency | None

    @property
    def records_per_s(self) -> float:
        return self.records / self.interval_s if self.interval_s > 0 else math.nan

    @property
    def mb_per_s(self) -> float:
        return self.bytes / MB / self.interval_s if self.interval_s > 0 else math.nan


@dataclass(frozen=True)
class Totals:
    """The whole run: records over `elapsed_s` (the command says from when to when)."""

    records: int
    bytes: int
    elapsed_s: float
    latency: Latency | None

    @property
    def records_per_s(self) -> float:
        return self.records / self.elapsed_s if self.elapsed_s > 0 else math.nan

    @property
    def mb_per_s(self) -> float:
        return self.bytes / MB / self.elapsed_s if self.elapsed_s > 0 else math.nan


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
        sample = Sample(now - self._started_at, now - self._last_tick, len(self.latencies), self.bytes,
                        Latency.of(interval))
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


class Ticker:
    """Calls `on_tick(now)` once per interval when asked with `poll(now)`; a late tick does not make the next early
    (and a very late one does not make a burst)."""

    def __init__(self, started_at: float, on_tick: Callable[[float], None], interval_s: float = 1.0) -> None:
        self.next = started_at + interval_s
        self._on_tick = on_tick
        self._interval = interval_s

    def poll(self, now: float) -> None:
        if now >= self.next:
            self._on_tick(now)
            self.next = max(self.next + self._interval, now + self._interval / 2)
