"""The system clock's sleeps: never early, precise ones included (a burst's kick-off waits on a
precise one: the loop's timers alone wake up to a millisecond late)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from slotcron.clock import FINAL_APPROACH, SystemClock


@pytest.mark.parametrize("precise", [False, True])
async def test_sleep_until_never_returns_early(precise: bool) -> None:
    clock = SystemClock()
    for step_ms in (0.2, 0.7, 1.3, 3.1, 7.9):
        when = clock.now() + timedelta(milliseconds=step_ms)
        await clock.sleep_until(when, precise=precise)
        assert clock.now() >= when


async def test_a_precise_sleep_lets_the_loop_run_meanwhile() -> None:
    """The last stretch is spent yielding to the loop, not blocking it: a task that is ready
    runs many times during a precise sleep that lies wholly within that stretch."""
    clock = SystemClock()
    turns = 0
    stop = False

    async def other() -> None:
        nonlocal turns
        while not stop:
            turns += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(other())
    await clock.sleep_until(clock.now() + timedelta(seconds=FINAL_APPROACH / 2), precise=True)
    stop = True
    await task
    assert turns > 10
