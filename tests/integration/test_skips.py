"""Skipping one slot with a service firing real slots, on every backend: a skipped slot never
runs and an unskipped one does, judged by the job's own record (the store's rules:
tests/store/test_skips.py)."""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from slotcron import JobContext
from slotcron.jobs.registry import Registry, every
from slotcron.store import skips
from slotcron.store.database import Database
from slotcron.store.tables import executions
from sqlalchemy import select

from tests.conftest import Services, wait_for
from tests.store.common import NOW


async def test_a_service_never_runs_a_skipped_slot_and_runs_an_unskipped_one(
    db: Database, services: Services
) -> None:
    ran: list[datetime] = []  # the job's own record
    registry = Registry()

    @every(seconds=1, name="sk.tick", registry=registry)
    async def tick(ctx: JobContext) -> None:
        ran.append(ctx.scheduled_at)

    await services.start(list(registry))
    await wait_for(lambda: ran, timeout=10, what="a first run")
    # Slots a few seconds ahead: never claimed yet (a lone job is claimed at its time).
    base = datetime.fromtimestamp(math.ceil(time.time()) + 3, UTC)
    skipped, unskipped = base, base + timedelta(seconds=1)
    await skips.skip(db, job="sk.tick", at=skipped, reason="maintenance", now=NOW)
    await skips.skip(db, job="sk.tick", at=unskipped, reason="taken back", now=NOW)
    await skips.unskip(db, job="sk.tick", at=unskipped)
    after = skipped + timedelta(seconds=2)
    await wait_for(lambda: any(s >= after for s in ran), timeout=15, what="runs after the skip")
    assert skipped not in ran, "a skipped slot ran"
    assert {skipped - timedelta(seconds=1), unskipped, after} <= set(ran), sorted(ran)[-6:]
    rows: dict[datetime, Any] = {}
    async with db.read() as conn:
        query = select(executions).where(executions.c.job_name == "sk.tick")
        rows = {r.scheduled_at: r for r in await conn.execute(query)}
    assert (rows[skipped].status, rows[skipped].error) == ("SKIPPED", "skipped: maintenance")
    assert rows[unskipped].status in ("RUNNING", "COMPLETED")
