"""The instance's capacity as permits: run permits go to the most urgent waiter first, and runs
claimed ahead of their slot hold ahead permits, not run permits (issue 26, item 1)."""

from __future__ import annotations

import asyncio

import pytest
from slotcron.engine.permits import Permits, RunPermits


async def test_run_permits_go_to_the_earliest_deadline_first_then_in_arrival_order() -> None:
    permits = RunPermits(1)
    await permits.take()
    served: list[str] = []

    async def wait(name: str, deadline: float) -> None:
        await permits.take(deadline)
        served.append(name)

    waiters = [
        asyncio.create_task(wait(name, deadline))
        for name, deadline in (("late", 60.0), ("urgent", 1.0), ("late-too", 60.0), ("soon", 5.0))
    ]
    await asyncio.sleep(0)
    for _ in waiters:
        permits.give_back()
        await asyncio.sleep(0)
    await asyncio.gather(*waiters)
    assert served == ["urgent", "soon", "late", "late-too"]


async def test_a_cancelled_waiter_gives_its_turn_to_the_next_and_loses_no_permit() -> None:
    permits = RunPermits(1)
    await permits.take()
    cancelled = asyncio.create_task(permits.take(1.0))
    after = asyncio.create_task(permits.take(2.0))
    await asyncio.sleep(0)
    cancelled.cancel()
    await asyncio.sleep(0)
    permits.give_back()
    await asyncio.wait_for(after, 1)
    permits.give_back()
    assert permits.free == 1 and permits.waiting == 0


async def test_take_up_to_takes_what_is_free_after_the_first() -> None:
    permits = RunPermits(5)
    assert await permits.take_up_to(3) == 3
    assert await permits.take_up_to(10) == 2
    assert permits.free == 0
    permits.give_back(5)
    assert permits.free == 5


async def test_runs_claimed_ahead_take_no_run_permit_until_their_slot() -> None:
    permits = Permits(2)
    assert await permits.ahead.take_up_to(5) == 2  # a burst claims two ahead of their slot
    # A job due before their slot still finds every run permit free.
    async with asyncio.timeout(1):
        async with permits.one(1.0), permits.one(1.0):
            assert permits.run.free == 0
    with pytest.raises(TimeoutError):  # and the burst claims no more ahead meanwhile
        async with asyncio.timeout(0.05):
            await permits.ahead.take_up_to(1)
