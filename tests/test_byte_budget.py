"""kop.byte_budget: reservations below the limit pass at once, the last one may overshoot it, waiters are granted
in arrival order as bytes come back, and a cancelled waiter neither leaks bytes nor blocks the next one."""
import asyncio

from kop.byte_budget import ByteBudget


def test_unbounded_budget_never_waits():
    budget = ByteBudget(-1)
    assert all(budget.try_reserve(1 << 30) for _ in range(10))


async def test_a_reservation_may_overshoot_then_the_next_waits_for_release():
    budget = ByteBudget(100)
    assert budget.try_reserve(60) and budget.try_reserve(500)  # 60 < 100: the 500 still fits in
    assert budget.exhausted and not budget.try_reserve(1)
    waiter = asyncio.create_task(budget.reserve(10))
    await asyncio.sleep(0)
    assert not waiter.done()
    budget.release(500)
    await asyncio.sleep(0)
    assert waiter.done() and budget.in_use == 70


async def test_waiters_are_granted_in_arrival_order_and_newcomers_queue_behind_them():
    budget = ByteBudget(10)
    budget.try_reserve(10)
    granted = []

    async def reserve(name, size):
        await budget.reserve(size)
        granted.append(name)
    tasks = [asyncio.create_task(reserve(name, size)) for name, size in (("a", 8), ("b", 2), ("c", 1))]
    await asyncio.sleep(0)
    budget.release(10)
    await asyncio.sleep(0)
    assert granted == ["a", "b"]  # a (8) stays below the limit, b takes it to the limit, c waits
    budget.release(8)  # 2 in use: c is granted, and a newcomer finds the queue empty
    await asyncio.gather(*tasks)
    assert granted == ["a", "b", "c"] and budget.in_use == 3


async def test_a_cancelled_waiter_leaks_nothing_and_does_not_block_the_next():
    """Cancelled while waiting, or after being granted but before resuming: either way the bytes are not kept."""
    budget = ByteBudget(10)
    budget.try_reserve(10)
    first = asyncio.create_task(budget.reserve(5))
    second = asyncio.create_task(budget.reserve(3))
    await asyncio.sleep(0)
    first.cancel()
    await asyncio.sleep(0)
    budget.release(10)
    await second
    assert budget.in_use == 3
    budget.try_reserve(7)
    third = asyncio.create_task(budget.reserve(4))
    await asyncio.sleep(0)
    budget.release(7)  # grants the third waiter ...
    third.cancel()  # ... which is cancelled before it resumes: it must give the bytes back
    await asyncio.gather(third, return_exceptions=True)
    assert third.cancelled() and budget.in_use == 3
