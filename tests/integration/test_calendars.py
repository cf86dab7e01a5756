"""Holiday calendars, excluded dates and windows on every backend: a claim (one at a time, or a
batch) records an excluded day's slot SKIPPED with the holiday's name, across Thanksgiving in
New York; a service never runs an excluded slot, judged by the job's own record, and records
each one; a window runs the slots inside it and records none outside."""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from slotcron import JobContext
from slotcron.clock import ManualClock
from slotcron.engine.claims import Claimer
from slotcron.jobs.registry import Job, Registry, cron, every
from slotcron.lifeline.roles import Collaborators
from slotcron.store import registrations
from slotcron.store.batch import Due
from slotcron.store.database import Database
from slotcron.store.registrations import JobRow
from slotcron.store.tables import executions
from sqlalchemy import select

from tests.conftest import Services, wait_for

NINE_AM = "0 9 * * *"  # 14:00 UTC in New York in late November
WEDNESDAY = datetime(2026, 11, 25, 14, tzinfo=UTC)
DAY = timedelta(days=1)


def daily(**options: Any) -> Job:
    registry = Registry()

    @cron(NINE_AM, name="daily", timezone="America/New_York", registry=registry, **options)
    async def job() -> None:
        pass

    [made] = list(registry)
    return made


async def registered(db: Database, job: Job) -> None:
    row = JobRow(
        name=job.name,
        kind="cron",
        schedule=NINE_AM,
        timezone="America/New_York",
        options=job.options(),
        first_slot=WEDNESDAY,
    )
    await registrations.register_jobs(
        db, [row], now=WEDNESDAY - DAY, instance_id="test", version="test"
    )


async def test_one_claim_at_a_time_skips_thanksgiving_with_its_name(db: Database) -> None:
    job = daily(calendar="holidays:US")
    await registered(db, job)
    clock = ManualClock(WEDNESDAY)
    claimer = Claimer(Collaborators(db=db, clock=clock, instance_id="a"), default_lease=60)
    outcomes = []
    for slot in (WEDNESDAY, WEDNESDAY + DAY, WEDNESDAY + 2 * DAY):
        await clock.set(slot + timedelta(milliseconds=5))
        claim = await claimer.claim(job, slot, trigger="cron", following=slot + DAY)
        assert claim is not None
        outcomes.append((claim.status, claim.reason))
    assert outcomes == [
        ("RUNNING", None),
        ("SKIPPED", "holiday: Thanksgiving Day"),
        ("RUNNING", None),
    ]


async def test_a_batch_skips_an_excluded_date(db: Database) -> None:
    job = daily(exclude_dates=["2026-11-25"])
    await registered(db, job)
    claimer = Claimer(
        Collaborators(db=db, clock=ManualClock(WEDNESDAY), instance_id="a"),
        default_lease=60,
        timezone="UTC",  # the job names its own zone: this one is not read
    )
    item = Due(
        job_name="daily",
        slot=WEDNESDAY,
        following=WEDNESDAY + DAY,
        trigger="cron",
        lease_ms=60_000,
        forbid_overlap=True,
        excluded=claimer.excluded(job, WEDNESDAY),
    )
    decided = await claimer.claim_many([item], give_up_at=WEDNESDAY + DAY)
    claim = decided.claims["daily"]
    assert (claim.status, claim.reason) == ("SKIPPED", "excluded date: 2026-11-25")


async def test_a_service_records_every_slot_of_an_excluded_day_skipped_and_runs_none(
    db: Database, services: Services
) -> None:
    ran: list[datetime] = []  # the job's own record
    registry = Registry()
    today = datetime.now(UTC).date()

    @every(
        seconds=1,
        name="cal.tick",
        exclude_dates=[today, today + timedelta(days=1)],  # a test at midnight stays excluded
        registry=registry,
    )
    async def tick(ctx: JobContext) -> None:
        ran.append(ctx.scheduled_at)

    await services.start(list(registry), timezone="UTC")

    async def skipped() -> list[Any] | None:
        async with db.read() as conn:
            query = select(executions).where(executions.c.job_name == "cal.tick")
            rows = list(await conn.execute(query))
        return rows if len([r for r in rows if r.status == "SKIPPED"]) >= 3 else None

    rows = await wait_for(skipped, timeout=15, what="three slots recorded SKIPPED")
    assert ran == [], "an excluded day's slot ran"
    assert {r.status for r in rows} == {"SKIPPED"}
    assert {r.error for r in rows} <= {
        f"excluded date: {today.isoformat()}",
        f"excluded date: {(today + timedelta(days=1)).isoformat()}",
    }


async def test_a_window_runs_its_slots_and_records_none_outside_it(
    db: Database, services: Services
) -> None:
    ran: dict[str, list[datetime]] = {"in": [], "over": []}  # the jobs' own records
    registry = Registry()
    start = datetime.fromtimestamp(math.ceil(time.time()) + 3, UTC)
    end = start + timedelta(seconds=3)

    @every(seconds=1, name="win.in", start_at=start, end_at=end, registry=registry)
    async def within(ctx: JobContext) -> None:
        ran["in"].append(ctx.scheduled_at)

    @every(seconds=1, name="win.over", end_at=start - timedelta(days=1), registry=registry)
    async def over(ctx: JobContext) -> None:
        ran["over"].append(ctx.scheduled_at)

    await services.start(list(registry))
    await wait_for(lambda: time.time() > end.timestamp() + 2, timeout=15, what="the window's end")
    seconds = timedelta(seconds=1)
    assert ran == {"in": [start, start + seconds, start + 2 * seconds], "over": []}
    async with db.read() as conn:
        query = select(executions.c.job_name, executions.c.scheduled_at, executions.c.status)
        rows = sorted(await conn.execute(query.where(executions.c.job_name.like("win.%"))))
    assert [(r.job_name, r.scheduled_at) for r in rows] == [
        ("win.in", start + k * seconds) for k in range(3)
    ], "no slot outside the window is recorded"
