"""The clock of one run: when it started and ends, and a sample to the display once a second."""
from __future__ import annotations

import math
import time
from collections.abc import Callable

from kop.perf.stats import Recorder, Sample

INTERVAL_S = 1.0


class Sampler:
    def __init__(self, latency_unit_us: float, duration_s: float | None,
                 report: Callable[[Sample, int], None]) -> None:
        self.start = time.monotonic()
        self.end = self.start + duration_s if duration_s else math.inf
        self.next_tick = self.start + INTERVAL_S
        self.recorder = Recorder(latency_unit_us, self.start)
        self._report = report

    def ended(self, now: float) -> bool:
        """Whether --duration has passed; if not, takes a sample when one is due. At the end no sample is taken:
        the last one runs to the end of the run (`finish`)."""
        if now >= self.end:
            return True
        self.tick_if_due(now)
        return False

    def tick_if_due(self, now: float) -> None:
        if now >= self.next_tick:
            self._take(now)
            # a late tick does not make the next one early, nor a very late one a burst
            self.next_tick = max(self.next_tick + INTERVAL_S, now + INTERVAL_S / 2)

    def finish(self, now: float) -> None:
        """The last sample: what arrived since the last tick (always one sample, even for a run without records)."""
        if self.recorder.latencies or not self.recorder.samples:
            self._take(now)

    def _take(self, now: float) -> None:
        self._report(self.recorder.tick(now), self.recorder.records)
