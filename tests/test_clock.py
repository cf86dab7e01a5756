"""The system clock's sleeps: never early, precise ones included (a burst's kick-off waits on a
precise one: the loop's timers alone wake up to a millisecond late)."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

import pytest
from slotcron import clock as clock_module
from slotcron.clock import DatabaseClock, ManualClock, SystemClock
from slotcron.lifeline.inflight import RunHandle
from slotcron.store.claims import Claim


@pytest.mark.parametrize("precise", [False, True])
async def test_sleep_until_never_returns_early(precise: bool) -> None:
    clock = SystemClock()
    for step_ms in (0.2, 0.7, 1.3, 3.1, 7.9):
        when = clock.now() + timedelta(milliseconds=step_ms)
        await clock.sleep_until(when, precise=precise)
        assert clock.now() >= when


async def test_a_precise_sleep_lets_the_loop_run_meanwhile(monkeypatch: pytest.MonkeyPatch) -> None:
    """The last stretch is spent yielding to the loop, not blocking it: a task that is ready
    runs many times during a precise sleep that lies wholly within that stretch."""
    # The stretch is widened from a millisecond to 50 ms: a millisecond is one time slice on a
    # busy machine, and it once gave the other task 2 turns (CI, four workers on two cores).
    monkeypatch.setattr(clock_module, "FINAL_APPROACH", 0.05)
    clock = SystemClock()
    turns = 0
    stop = False

    async def other() -> None:
        nonlocal turns
        while not stop:
            turns += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(other())
    await clock.sleep_until(clock.now() + timedelta(seconds=0.025), precise=True)
    stop = True
    await task
    # A sleep that blocked the loop would give the other task one turn at most; the yielding one
    # gives it hundreds in 25 ms.
    assert turns > 3


async def test_said_at_gives_what_each_clock_said_at_a_monotonic_moment() -> None:
    """A burst's start is stamped with time.monotonic() (a datetime per run is start lag of
    every body after it) and made a datetime later: what the clock said then."""
    system = SystemClock(offset=timedelta(seconds=5))
    moment = time.monotonic()
    before = system.now()
    await asyncio.sleep(0.02)
    said = system.said_at(moment)
    assert before - timedelta(milliseconds=5) <= said <= before + timedelta(milliseconds=5)
    assert system.now() - said >= timedelta(milliseconds=19)

    async def sample() -> datetime:
        return datetime.now(UTC) + timedelta(hours=1)

    database = DatabaseClock(sample)
    await database.sync(samples=2)
    moment = time.monotonic()
    now = database.now()
    assert abs(database.said_at(moment) - now) < timedelta(milliseconds=5)
    assert abs(database.said_at(moment - 2.0) - (now - timedelta(seconds=2))) < timedelta(
        milliseconds=5
    )

    manual = ManualClock(datetime(2026, 11, 29, tzinfo=UTC))
    assert manual.said_at(time.monotonic() - 3.0) == manual.now()  # it moves only when told


async def test_a_run_handle_works_out_started_at_from_its_monotonic_start() -> None:
    slot = datetime(2026, 11, 29, 0, 10, tzinfo=UTC)
    clock = ManualClock(slot)
    claim = Claim(1, "a", slot, "cron", "RUNNING", 1, slot + timedelta(seconds=60), 60_000)
    handle = RunHandle(
        claim=claim,
        job=None,  # type: ignore[arg-type]
        task=None,
        deadline=0.0,
        lease_ms=60_000,
        clock_at=clock.said_at,
    )
    assert handle.started_at is None, "not started: no start time"
    handle.started, handle.began = True, time.monotonic()
    await clock.advance(1)
    assert handle.started_at == slot + timedelta(seconds=1), "worked out when first asked"
    await clock.advance(1)
    assert handle.started_at == slot + timedelta(seconds=1), "and kept"
