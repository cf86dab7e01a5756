"""The instance's capacity as permits: run permits go to the most urgent waiter first, and runs
claimed ahead of their slot hold ahead permits, not run permits (issue 26, item 1)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime
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


# --- A run claimed ahead takes its run permit at its slot (Firing.start_run) -----------------


class _Runner:
    """Runs as the real runner does up to the body: awaits the kick-off, then ``admit``."""

    def __init__(self) -> None:
        self.admitted: list[bool] = []
        self.release = asyncio.Event()

    async def run(
        self, job: object, claim: object, start: asyncio.Future[bool], admit: object
    ) -> str | None:
        if not await start:
            return None
        admitted = admit()  # type: ignore[operator]
        self.admitted.append(admitted if isinstance(admitted, bool) else await admitted)
        await self.release.wait()  # the body
        return "COMPLETED"


def _firing(permits: Permits, slow_answer: bool | None = None) -> SimpleNamespace:
    async def run_permit(job: object, claim: object, give_up_at: datetime) -> bool:
        if slow_answer is None:
            raise AssertionError("a free run permit is taken without waiting")
        await permits.run.take()
        return slow_answer

    return SimpleNamespace(permits=permits, runner=_Runner(), _tasks=set(), _run_permit=run_permit)


def _start_ahead(firing: SimpleNamespace, start: asyncio.Future[bool]) -> asyncio.Task[None]:
    job = SimpleNamespace(name="ahead")
    Firing.start_run(firing, job, object(), datetime.now(UTC), start, ahead=True)  # type: ignore[arg-type]
    (task,) = firing._tasks
    return task  # type: ignore[no-any-return]


async def test_at_its_slot_a_run_claimed_ahead_trades_its_ahead_permit_for_a_run_permit() -> None:
    permits = Permits(2)
    await permits.ahead.take_up_to(1)
    firing = _firing(permits)
    start: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    task = _start_ahead(firing, start)
    await asyncio.sleep(0)
    assert (permits.run.free, permits.ahead.free) == (2, 1)  # before its slot: ahead only
    start.set_result(True)
    await wait_until(lambda: firing.runner.admitted == [True])
    assert (permits.run.free, permits.ahead.free) == (1, 2)  # its body holds a run permit
    firing.runner.release.set()
    await asyncio.wait_for(task, 2)
    assert (permits.run.free, permits.ahead.free) == (2, 2)


async def test_with_no_run_permit_free_at_its_slot_a_run_waits_for_one() -> None:
    permits = Permits(1)
    await permits.ahead.take_up_to(1)
    await permits.run.take()  # every run permit in use
    firing = _firing(permits, slow_answer=True)
    start: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    task = _start_ahead(firing, start)
    start.set_result(True)
    await asyncio.sleep(0.01)
    assert firing.runner.admitted == []
    permits.run.give_back()
    await wait_until(lambda: firing.runner.admitted == [True])
    firing.runner.release.set()
    await asyncio.wait_for(task, 2)
    assert (permits.run.free, permits.ahead.free) == (1, 1)


async def test_a_kickoff_that_says_no_gives_the_ahead_permit_back_and_takes_no_run_permit() -> None:
    permits = Permits(1)
    await permits.ahead.take_up_to(1)
    firing = _firing(permits)
    start: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    task = _start_ahead(firing, start)
    start.set_result(False)  # paused, handed back, no longer ours
    await asyncio.wait_for(task, 2)
    assert firing.runner.admitted == []
    assert (permits.run.free, permits.ahead.free) == (1, 1)


async def test_a_run_stopped_before_its_slot_gives_its_ahead_permit_back() -> None:
    permits = Permits(1)
    await permits.ahead.take_up_to(1)
    firing = _firing(permits)
    start: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    task = _start_ahead(firing, start)
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 2)
    assert start.cancelled()  # the kick-off leaves it out of its marker
    assert (permits.run.free, permits.ahead.free) == (1, 1)


async def wait_until(condition: Callable[[], bool], timeout: float = 2.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():  # noqa: ASYNC110 - a test polling plain state
            await asyncio.sleep(0.001)
