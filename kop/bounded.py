"""Run one coroutine per item, a bounded number at a time: for work that mostly waits (database round trips), where
one item after another leaves the connections idle and all at once would queue thousands of tasks."""
import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

T = TypeVar("T")


async def each_bounded(items: Iterable[T], action: Callable[[T], Awaitable[None]], limit: int) -> None:
    """Await action(item) for every item, at most `limit` at a time, started in the items' order. At the first
    failure no further item is started; those already running finish (a half-done action is never cut off), and
    then the first failure is raised. Cancelled, it cancels the running actions and waits for them: no task
    outlives the call."""
    pending = iter(items)
    failures: list[BaseException] = []

    async def worker() -> None:
        for item in pending:  # one iterator shared by the workers: each item is taken by exactly one
            if failures:
                return
            try:
                await action(item)
            except Exception as exc:  # noqa: BLE001 - kept, raised once every worker has stopped
                failures.append(exc)
                return

    workers = [asyncio.ensure_future(worker()) for _ in range(max(1, limit))]
    # gather: cancelled from outside, it cancels the workers and completes only once they have all finished
    await asyncio.gather(*workers)
    if failures:
        raise failures[0]
