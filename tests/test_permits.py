"""The instance's capacity as permits: run permits go to the most urgent waiter first, and runs
claimed ahead of their slot hold ahead permits, not run permits (issue 26, item 1)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from slotcron.engine.firing import Firing
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


# --- The start gate of a run claimed ahead (Firing._gate) -------------------------------------


def _gate(permits: Permits, start: asyncio.Future[bool], slow: object, held: list[bool]) -> object:
    return Firing._gate(SimpleNamespace(permits=permits), start, slow, held)  # type: ignore[arg-type]


async def test_a_run_permit_free_at_the_slot_opens_the_gate_at_once_with_no_wait() -> None:
    permits = Permits(2)
    assert await permits.ahead.take_up_to(1) == 1
    start: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    held = [False]

    async def must_not_wait() -> bool:
        raise AssertionError("a free permit is taken without waiting")

    gate = _gate(permits, start, must_not_wait, held)
    start.set_result(True)
    await asyncio.sleep(0)
    assert gate.result() is True  # type: ignore[attr-defined]
    assert held == [True]
    assert (permits.run.free, permits.ahead.free) == (1, 2)  # run permit held, ahead one back


async def test_with_no_run_permit_free_the_gate_waits_for_one() -> None:
    permits = Permits(1)
    await permits.ahead.take_up_to(1)
    await permits.run.take()  # every run permit in use
    start: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    held = [False]

    async def take_run_permit() -> bool:
        try:
            await permits.run.take()
            held[0] = True
            return True
        finally:
            permits.ahead.give_back()

    gate = _gate(permits, start, take_run_permit, held)
    start.set_result(True)
    await asyncio.sleep(0.01)
    assert not gate.done()  # type: ignore[attr-defined]
    permits.run.give_back()
    assert await asyncio.wait_for(gate, 2) is True  # type: ignore[arg-type]
    assert held == [True] and permits.ahead.free == 1


async def test_a_cancelled_gate_cancels_its_kickoff_and_gives_the_ahead_permit_back() -> None:
    permits = Permits(1)
    await permits.ahead.take_up_to(1)
    start: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    held = [False]

    async def must_not_wait() -> bool:
        raise AssertionError("never reached")

    gate = _gate(permits, start, must_not_wait, held)
    gate.cancel()  # type: ignore[attr-defined]
    for _ in range(3):  # the gate's callback cancels the kick-off, whose callback settles
        await asyncio.sleep(0)
    assert start.cancelled()  # the kick-off leaves this run out of its marker
    assert held == [False] and (permits.run.free, permits.ahead.free) == (1, 1)


async def test_a_kickoff_that_says_no_gives_the_ahead_permit_back_and_takes_no_run_permit() -> None:
    permits = Permits(1)
    await permits.ahead.take_up_to(1)
    start: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    held = [False]

    async def must_not_wait() -> bool:
        raise AssertionError("never reached")

    gate = _gate(permits, start, must_not_wait, held)
    start.set_result(False)  # paused, handed back, no longer ours
    await asyncio.sleep(0)
    assert gate.result() is False  # type: ignore[attr-defined]
    assert held == [False] and (permits.run.free, permits.ahead.free) == (1, 1)
