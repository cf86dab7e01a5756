"""A burst's kick-off in a running instance: on PostgreSQL its marker goes through a connection
taken ahead and straight to the driver (slotcron.store.held), and that connection goes back to
the pool as it was found; on every backend the garbage collector, paused while the bodies
start, is on again afterwards. With the manual clock, on every backend."""

from __future__ import annotations

import contextlib
import gc
from datetime import UTC, datetime, timedelta
from typing import Any

from slotcron import JobContext
from slotcron.clock import ManualClock
from slotcron.jobs.registry import Registry, cron
from slotcron.store.database import Database
from slotcron.store.tables import executions
from sqlalchemy import event, select, text

from tests.conftest import ServiceFactory, wait_for

SLOT = datetime(2026, 11, 22, 0, 0, 10, tzinfo=UTC)


async def test_a_bursts_marker_uses_a_held_connection_that_goes_back_as_found(
    db: Database, backend: str, start_service: ServiceFactory
) -> None:
    collecting = gc.isenabled()
    clock = ManualClock(SLOT - timedelta(seconds=5))
    registry = Registry()
    began: list[str] = []
    for i in range(6):

        def make(i: int) -> None:
            @cron("*/10 * * * * *", name=f"burst-{i}", registry=registry)
            async def job(ctx: JobContext) -> None:
                began.append(ctx.job)

        make(i)
    service = await start_service(list(registry), clock=clock)
    statements: list[str] = []

    def seen(*args: Any) -> None:
        statements.append(args[2])

    engine = service.db.engine.sync_engine
    event.listen(engine, "before_cursor_execute", seen)
    try:
        await clock.set(SLOT - timedelta(milliseconds=5))  # in the lead: claimed ahead

        async def claimed() -> bool:
            async with db.read() as conn:
                rows = (await conn.execute(select(executions.c.start_key))).all()
            return len(rows) == 6 and None not in {r.start_key for r in rows}

        await wait_for(claimed, what="the burst claimed ahead")
        await clock.set(SLOT)
        await wait_for(lambda: len(began) == 6, what="the burst's bodies started")
    finally:
        event.remove(engine, "before_cursor_execute", seen)
    markers_via_sqlalchemy = [s for s in statements if "INSERT" in s and "scheduler_starts" in s]
    if backend == "postgresql":
        assert markers_via_sqlalchemy == [], "the marker went straight to the driver"
    else:
        assert len(markers_via_sqlalchemy) == 1
    assert gc.isenabled() is collecting

    # Every idle connection of the instance's pool (the one held for the marker went back
    # there) is in its usual planning mode.
    if backend == "postgresql":
        pool: Any = service.db.engine.sync_engine.pool
        modes: list[str] = []
        async with contextlib.AsyncExitStack() as stack:
            while pool.checkedin() > 0:  # hold each one, so the next is another
                conn = await stack.enter_async_context(service.db.engine.connect())
                modes.append(str((await conn.execute(text("SHOW plan_cache_mode"))).scalar_one()))
        assert modes and modes == ["auto"] * len(modes)
