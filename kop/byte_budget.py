"""Bytes of requests in flight: a reader reserves a request's size before reading its body and gives it back once
the request is answered. One budget per connection and one for the whole broker (Kafka's queued.max.request.bytes).

A reservation is granted while anything is left (Kafka's request memory pool does the same): the last one may
overshoot the limit, so a request larger than the whole limit still gets through and nothing waits forever. Waiters
are granted in arrival order."""
import asyncio
from collections import deque


class ByteBudget:
    def __init__(self, limit: int) -> None:
        self.limit = limit  # <= 0: unbounded
        self.in_use = 0
        self._waiters: deque[tuple[int, asyncio.Future]] = deque()

    @property
    def exhausted(self) -> bool:
        return 0 < self.limit <= self.in_use

    def try_reserve(self, size: int) -> bool:
        if self._waiters or 0 < self.limit <= self.in_use:  # exhausted, inline: every request asks twice
            return False
        self.in_use += size
        return True

    async def reserve(self, size: int) -> None:
        if self.try_reserve(size):
            return
        waiter = (size, asyncio.get_running_loop().create_future())
        self._waiters.append(waiter)
        try:
            await waiter[1]
        except asyncio.CancelledError:
            if waiter[1].cancelled():
                self._waiters.remove(waiter)
                self._grant()  # it may have been first in line
            else:
                self.release(size)  # granted just before the cancellation reached us
            raise

    def release(self, size: int) -> None:
        self.in_use -= size
        if self._waiters:
            self._grant()

    def _grant(self) -> None:
        while self._waiters and not self.exhausted:
            size, future = self._waiters.popleft()
            self.in_use += size
            future.set_result(None)
