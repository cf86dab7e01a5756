"""``max_runs`` on every backend, through the engine: a bounded job is never claimed in a batch,
and two instances racing for the last runs complete exactly ``max_runs``, judged by the job's
own record (the store's counting: tests/store/test_counted.py)."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta

from slotcron import JobContext
from slotcron.clock import ManualClock
from slotcron.engine.claims import Claimer
from slotcron.jobs.registry import Job, Registry, every
from slotcron.lifeline.roles import Collaborators
from slotcron.store.batch import Due
from slotcron.store.database import Database
from slotcron.store.tables import executions, jobs
from sqlalchemy import select

from tests.conftest import Services, wait_for
from tests.integration.test_batch_claims import register
from tests.store.test_skips import MINUTE, SLOT


async def completed(db: Database, job: str = "job") -> int:
    async with db.read() as conn:
        query = select(jobs.c.runs_completed).where(jobs.c.name == job)
        return int((await conn.execute(query)).scalar_one())


async def test_a_batch_hands_a_bounded_job_back_to_be_claimed_alone(db: Database) -> None:
    await register(db, ["bounded", "free"])
    claimer = Claimer(
        Collaborators(db=db, clock=ManualClock(SLOT), instance_id="a"), default_lease=60
    )

    def due(name: str, max_runs: int | None) -> Due:
        return Due(
            job_name=name,
            slot=SLOT,
            following=SLOT + MINUTE,
            trigger="cron",
            lease_ms=60_000,
            forbid_overlap=True,
            max_runs=max_runs,
        )

    decided = await claimer.claim_many([due("bounded", 3), due("free", None)], give_up_at=SLOT)
    assert set(decided.claims) == {"free"}
    assert [item.job_name for item in decided.held] == ["bounded"]


async def test_two_instances_racing_complete_exactly_max_runs(
    db: Database, services: Services
) -> None:
    finished: list[tuple[datetime, str]] = []  # the job's own record of its completed bodies

    def jobs_() -> list[Job]:
        registry = Registry()

        @every(seconds=1, name="bounded", max_runs=3, overlap="allow", registry=registry)
        async def bounded(ctx: JobContext) -> None:
            await asyncio.sleep(1.5)  # runs overlap: the in-flight ones are counted
            finished.append((ctx.scheduled_at, ctx.instance_id))

        return list(registry)

    await services.start(jobs_(), instance_id="racer-a")
    await services.start(jobs_(), instance_id="racer-b")
    await wait_for(lambda: len(finished) >= 3, timeout=30, what="three completed runs")
    settled = time.monotonic() + 4
    await wait_for(lambda: time.monotonic() > settled, timeout=10, what="four more seconds")
    assert len(finished) == 3, finished
    assert len({slot for slot, _ in finished}) == 3
    assert await completed(db, "bounded") == 3
    async with db.read() as conn:
        query = select(executions.c.scheduled_at, executions.c.status).where(
            executions.c.job_name == "bounded"
        )
        rows = list(await conn.execute(query))
    # a slot the loop reached past its grace on a slow machine is MISSED: it did not run, and
    # says so; max_runs is judged by what ran
    assert {r.status for r in rows} <= {"COMPLETED", "SKIPPED", "MISSED"}, rows
    assert [r.status for r in rows].count("COMPLETED") == 3
    last = max(slot for slot, _ in finished)
    assert not [r for r in rows if r.scheduled_at > last + timedelta(seconds=2)], (
        "slots recorded after the last run completed"
    )
