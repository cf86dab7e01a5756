"""The queue of manual runs, restarts and retries (issue 26, item 2): what cannot be taken never
hides what can, a removed schedule's queued runs are settled, and one job's queue is capped.
Every backend; in-process instances by the real clock, judged by what the jobs recorded."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

import pytest
from slotcron import JobContext
from slotcron.errors import MAX_QUEUED, QueueFull
from slotcron.jobs.registry import Registry, cron
from slotcron.store import operations
from slotcron.store.database import Database
from slotcron.store.registrations import JobRow, register_jobs
from slotcron.store.tables import executions, jobs
from sqlalchemy import delete, func, insert, select

from tests.conftest import ServiceFactory, wait_for

YEARLY = "0 0 1 1 *"


async def queue_runs(db: Database, job: str, count: int, now: datetime) -> None:
    """``count`` manual runs of ``job`` waiting QUEUED, older than anything queued next."""
    rows = [
        {
            "job_name": job,
            "scheduled_at": now - timedelta(seconds=count - i),
            "trigger": "manual",
            "status": "QUEUED",
            "attempt": 1,
            "created_at": now,
            "available_at": now - timedelta(seconds=count - i),
            "params": {},
            "state": {},
        }
        for i in range(count)
    ]
    async with db.transaction() as conn:
        await conn.execute(insert(executions), rows)


async def test_runs_queued_for_a_removed_schedule_are_settled_and_hide_nothing(
    db: Database, start_service: ServiceFactory
) -> None:
    started: list[float] = []
    registry = Registry()

    @cron(YEARLY, name="wanted", registry=registry)
    async def wanted() -> None:
        started.append(time.monotonic())

    service = await start_service(list(registry))
    # 300 runs of a schedule that is gone (its row removed: nobody can ever take them), queued
    # before the run that matters: the oldest, so they come first in every look.
    await queue_runs(db, "gone/tenant-1", 300, service.clock.now())
    asked = time.monotonic()
    await operations.trigger(db, job="wanted", params={}, now=service.clock.now())
    service.queued.wake_at(service.clock.now())
    await wait_for(lambda: started, timeout=10, what="the manual run of another job")
    assert started[0] - asked < 2.0, f"waited {started[0] - asked:.2f} s behind the orphans"

    async def settled() -> bool:
        async with db.read() as conn:
            left = await conn.scalar(
                select(func.count())
                .select_from(executions)
                .where(executions.c.job_name == "gone/tenant-1", executions.c.status == "QUEUED")
            )
        return left == 0

    await wait_for(settled, timeout=10, what="the removed schedule's runs settled")
    async with db.read() as conn:
        rows = (
            await conn.execute(
                select(executions.c.status, executions.c.error).where(
                    executions.c.job_name == "gone/tenant-1"
                )
            )
        ).all()
    assert {r.status for r in rows} == {"SKIPPED"}
    assert all("removed" in (r.error or "") for r in rows)


async def test_a_page_full_of_one_held_jobs_runs_never_hides_another_jobs_run(
    db: Database, start_service: ServiceFactory
) -> None:
    started: list[str] = []
    release = asyncio.Event()
    registry = Registry()

    @cron(YEARLY, name="busy", registry=registry)  # forbid: one run at a time
    async def busy(ctx: JobContext) -> None:
        started.append("busy")
        await release.wait()

    @cron(YEARLY, name="other", registry=registry)
    async def other() -> None:
        started.append("other")

    service = await start_service(list(registry))
    try:
        await operations.trigger(db, job="busy", params={}, now=service.clock.now())
        service.queued.wake_at(service.clock.now())
        await wait_for(lambda: "busy" in started, timeout=10, what="the busy job's run")
        # 150 more of the busy job wait behind its lease: more than a page of the queue.
        await queue_runs(db, "busy", 150, service.clock.now())
        asked = time.monotonic()
        await operations.trigger(db, job="other", params={}, now=service.clock.now())
        service.queued.wake_at(service.clock.now())
        await wait_for(lambda: "other" in started, timeout=10, what="the other job's run")
        assert time.monotonic() - asked < 3.0
    finally:
        release.set()


async def test_one_job_may_have_at_most_a_hundred_runs_queued(db: Database) -> None:
    now = datetime.now(UTC)
    await register_jobs(
        db,
        [
            JobRow(
                name="popular",
                kind="cron",
                schedule=YEARLY,
                timezone="UTC",
                options={"restartable": True},
                first_slot=datetime(2030, 1, 1, tzinfo=UTC),
            )
        ],
        now=now,
        instance_id="test",
        version="0",
    )
    for _ in range(MAX_QUEUED):
        await operations.trigger(db, job="popular", params={}, now=now)
    with pytest.raises(QueueFull, match="100 runs waiting QUEUED"):
        await operations.trigger(db, job="popular", params={}, now=now)
    async with db.read() as conn:
        queued = await conn.scalar(
            select(func.count()).select_from(executions).where(executions.c.job_name == "popular")
        )
    assert queued == MAX_QUEUED
    # A restart of a failed slot is refused the same way while the queue is full.
    async with db.transaction() as conn:
        failed = await conn.execute(
            insert(executions).values(
                job_name="popular",
                scheduled_at=now - timedelta(days=1),
                trigger="cron",
                status="FAILED",
                attempt=1,
                created_at=now,
                params={},
                state={},
            )
        )
        failed_id = int(failed.inserted_primary_key[0])  # type: ignore[index]
    with pytest.raises(QueueFull):
        await operations.restart(db, execution_id=failed_id, now=now)
    async with db.transaction() as conn:  # room again once runs are taken
        await conn.execute(
            delete(executions).where(
                executions.c.job_name == "popular", executions.c.trigger == "manual"
            )
        )
        assert await conn.scalar(select(func.count()).select_from(jobs)) == 1
    await operations.restart(db, execution_id=failed_id, now=now)


async def test_removing_a_schedule_settles_its_queued_runs_saying_why(db: Database) -> None:
    from slotcron.jobs.registry import task
    from slotcron.store import schedules as schedule_store

    registry = Registry()

    @task(name="queue.report", registry=registry)
    async def report() -> None: ...

    now = datetime.now(UTC)
    await schedule_store.create(
        db,
        [{"task": "queue.report", "every": 3600, "id": "tenant/9"}],
        default_timezone="UTC",
        by="test",
        registry=registry,
        now=now,
    )
    for _ in range(3):
        await operations.trigger(db, job="tenant/9", params={}, now=now)
    await schedule_store.remove(db, "tenant/9", now=now)
    async with db.read() as conn:
        rows = (
            await conn.execute(
                select(executions.c.status, executions.c.error).where(
                    executions.c.job_name == "tenant/9"
                )
            )
        ).all()
    assert [r.status for r in rows] == ["SKIPPED"] * 3
    assert all("removed" in (r.error or "") for r in rows)
