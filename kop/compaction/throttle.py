"""The cleaner's I/O budget (Kafka's log.cleaner.io.max.bytes.per.second): reads and writes together stay under a
rate, so a large compaction leaves the disk to the produce path's fsyncs."""
import time
from collections.abc import Callable


class Throttle:
    def __init__(self, bytes_per_second: float, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self._rate = bytes_per_second
        self._clock = clock
        self._sleep = sleep
        self._start = clock()
        self._bytes = 0

    def pause_for(self, size: int) -> float:
        """Seconds to wait after `size` more bytes so the average since the start stays within the rate."""
        self._bytes += size
        ahead = self._bytes / self._rate - (self._clock() - self._start)
        return max(ahead, 0.0)

    def spend(self, size: int) -> None:
        if self._rate != float("inf"):
            pause = self.pause_for(size)
            if pause > 0:
                self._sleep(pause)
