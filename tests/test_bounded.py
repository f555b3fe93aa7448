"""kop/bounded.py: one coroutine per item, a bounded number at a time, stopping at the first failure."""
import asyncio
from collections import defaultdict

import pytest

from kop.bounded import each_bounded


class Recorder:
    """Actions that each wait until the test releases their item, recording what started, what ran at once and what
    finished."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.fail_at = fail_at
        self.started: list[int] = []
        self.finished: list[int] = []
        self.running = 0
        self.most_at_once = 0
        self.gates: defaultdict[int, asyncio.Event] = defaultdict(asyncio.Event)

    def release(self, *items: int) -> None:
        for item in items:
            self.gates[item].set()

    async def action(self, item: int) -> None:
        self.started.append(item)
        self.running += 1
        self.most_at_once = max(self.most_at_once, self.running)
        try:
            await self.gates[item].wait()
            if item == self.fail_at:
                raise OSError(f"item {item} failed")
            self.finished.append(item)
        finally:
            self.running -= 1


async def settle() -> None:
    for _ in range(20):  # every ready task runs its step
        await asyncio.sleep(0)


async def test_every_item_runs_in_order_at_most_limit_at_once():
    recorder = Recorder()
    run = asyncio.ensure_future(each_bounded(range(10), recorder.action, 3))
    await settle()
    assert recorder.started == [0, 1, 2]  # the control: the first three wait, the rest are not started
    recorder.release(*range(10))
    await run
    assert sorted(recorder.finished) == list(range(10)) and recorder.started == list(range(10))
    assert recorder.most_at_once == 3


async def test_a_failure_starts_nothing_more_lets_the_running_finish_and_is_raised():
    recorder = Recorder(fail_at=1)
    run = asyncio.ensure_future(each_bounded(range(10), recorder.action, 3))
    await settle()
    recorder.release(1)  # fails while 0 and 2 are still running
    await settle()
    assert not run.done()  # it waits for those still running
    recorder.release(*range(10))
    with pytest.raises(OSError, match="item 1 failed"):
        await run
    assert recorder.started == [0, 1, 2] and sorted(recorder.finished) == [0, 2] and recorder.running == 0


async def test_cancelled_it_cancels_the_running_actions_and_waits_for_them():
    recorder = Recorder()
    run = asyncio.ensure_future(each_bounded(range(10), recorder.action, 4))
    await settle()
    assert recorder.running == 4  # the control: four actions were running when it was cancelled
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert recorder.running == 0 and recorder.finished == []
    assert asyncio.all_tasks() == {asyncio.current_task()}  # no worker outlives the call
