"""Bounded polling for tests: every wait has a deadline and says what it waited for."""
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(condition: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    """Poll `condition` until it holds or `timeout` passes; returns whether it held."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return condition()


def wait_for(predicate: Callable[[], T], what: str, timeout: float = 30.0, interval: float = 0.1) -> T:
    """Poll `predicate` until it returns something truthy, and return that; fail the test naming `what` if it
    does not within `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")
