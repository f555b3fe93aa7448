"""The cleaner's I/O budget: the pause after each chunk keeps the average rate since the start at the limit, on an
injected clock (no timing in the test)."""
import pytest

from kop.compaction.throttle import Throttle


def test_the_pause_keeps_the_average_rate_at_the_limit():
    now = [100.0]
    slept = []

    def sleep(seconds):
        slept.append(seconds)
        now[0] += seconds
    throttle = Throttle(1000, clock=lambda: now[0], sleep=sleep)
    throttle.spend(500)  # half a second's budget at once
    now[0] += 0.2  # 0.2 s of work
    throttle.spend(500)  # one second's budget in all: 0.8 s more to wait (0.5 already slept)
    assert slept == pytest.approx([0.5, 0.3])
    now[0] += 5  # idle: budget to spare, no pause
    throttle.spend(1000)
    assert slept == pytest.approx([0.5, 0.3])


def test_no_limit_never_pauses():
    slept = []
    Throttle(float("inf"), sleep=slept.append).spend(1 << 40)
    assert slept == []
