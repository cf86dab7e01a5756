"""The watchdog costs an idle instance nothing, and still catches a run that blocks the loop at
once. Real databases, the manual clock for the leases, the loop blocked for real."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

from slotcron.clock import ManualClock
from slotcron.lifeline.inflight import Runs
from slotcron.lifeline.watchdog import STALL, TICK
from slotcron.store.database import Database
from slotcron.store.instance_ids import hold_instance_id

from tests.conftest import wait_for
from tests.integration.test_incarnation import (
    ID,
    LAPSE,
    LEASE_MS,
    block_until,
    held,
    row,
    running_row,
    watchdog,
)


async def test_with_no_run_in_flight_the_loop_is_not_woken_for_the_watchdog(
    db: Database,
) -> None:
    clock = ManualClock(datetime(2030, 1, 1, tzinfo=UTC))
    runs = Runs()
    dog = watchdog(db, clock, runs, "unused", [])
    dog.start()
    try:
        for _ in range(5):
            await asyncio.sleep(0)
        marked = dog._mark
        # Several ticks' time with nothing in flight: the ticker waits for a run, unmarked.
        deadline = time.monotonic() + 5 * TICK
        while time.monotonic() < deadline:
            await asyncio.sleep(TICK / 4)
            assert dog._mark == marked, "the loop was woken for the watchdog with nothing to watch"
        run = held(await running_row(db, clock, 1), clock)
        runs.add(run)
        await wait_for(lambda: dog._mark > marked, what="the ticker to mark once a run began")
        runs.remove(run)
    finally:
        await dog.stop()
    assert dog.stalls == 0


async def test_a_run_that_blocks_the_loop_as_it_begins_is_caught_renewed_and_reported(
    db: Database,
) -> None:
    clock = ManualClock(datetime(2030, 1, 1, tzinfo=UTC))
    incarnation = await hold_instance_id(db, instance_id=ID, lapse=LAPSE, clock=clock)
    mine = await running_row(db, clock, 1)
    await clock.advance(1)
    runs = Runs()
    dog = watchdog(db, clock, runs, incarnation, [])
    dog.start()
    try:
        for _ in range(5):
            await asyncio.sleep(0)  # the ticker is waiting for a run; the thread sleeps
        run = held(mine, clock)
        # The run is added and the loop blocked at once: the ticker never marks it; the thread
        # is told by the add itself.
        runs.add(run)
        began = time.monotonic()
        block_until(lambda: dog.renewals, 10 * STALL)
        caught = time.monotonic() - began
        runs.remove(run)
        await wait_for(lambda: dog.stalls == 1, what="the stall reported once the loop is back")
    finally:
        await dog.stop()
    assert dog.renewals >= 1, "the blocked run's lease was not renewed"
    assert caught < STALL + 3 * TICK + 0.5, f"caught after {caught:.2f} s"
    assert await row(db, mine) == ("RUNNING", clock.now() + timedelta(milliseconds=LEASE_MS))
