"""``@task(alert=False)`` holds for the task's schedules (issue 26, item 7), against a real
webhook on 127.0.0.1 and every backend: a failing schedule of such a task sends nothing (before,
its FAILED event went out with the tenant's params), while one of a task that alerts still does.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
from slotcron import Client, JobContext
from slotcron.jobs.registry import Registry, task
from slotcron.store import operations
from slotcron.store import schedules as store
from slotcron.store.database import Database
from slotcron.store.tables import executions
from sqlalchemy import func, select

from tests.conftest import Services, wait_for
from tests.webhook import Listener, webhook


@pytest.fixture
async def listener() -> AsyncIterator[Listener]:
    async with webhook() as hook:
        yield hook


def failing_tasks() -> Registry:
    registry = Registry()

    @task(name="alerts.quiet", alert=False, registry=registry)
    async def quiet(ctx: JobContext) -> None:
        raise RuntimeError(f"fails for {ctx.params['tenant']}, but asked for no alert")

    @task(name="alerts.loud", registry=registry)
    async def loud(ctx: JobContext) -> None:
        raise RuntimeError("fails, and alerts")

    return registry


async def failed(db: Database, job: str) -> int:
    async with db.read() as conn:
        count = await conn.scalar(
            select(func.count())
            .select_from(executions)
            .where(executions.c.job_name == job, executions.c.status == "FAILED")
        )
    return int(count or 0)


async def test_a_task_with_alert_false_sends_no_event_for_its_schedules(
    db: Database, db_url: str, listener: Listener, services: Services
) -> None:
    registry = failing_tasks()
    await store.register_tasks(
        db, registry.tasks(), now=datetime.now(UTC), instance_id="t", version="0"
    )
    async with Client(db_url) as client:
        await client.add_schedule(
            "alerts.quiet", every=1, id="quiet/acme", params={"tenant": "acme"}
        )
        await client.add_schedule("alerts.loud", every=1, id="loud/acme", params={"tenant": "acme"})
    service = await services.start(tasks=registry.tasks(), alert_webhook_url=listener.url)
    try:
        await wait_for(lambda: listener.events("FAILED", "loud/acme"), what="the loud alert")
        # A run of the quiet schedule taken from the queue (not held in memory) too.
        await operations.trigger(
            db, job="quiet/acme", params={"tenant": "acme"}, now=await db.now()
        )

        async def quiet_failed() -> bool:
            return await failed(db, "quiet/acme") >= 3

        await wait_for(quiet_failed, what="the quiet schedule's failures recorded")
        await wait_for(lambda: len(listener.events("FAILED", "loud/acme")) >= 2, what="alerts")
    finally:
        await service.stop()
    sent = [r.body for r in listener.posts]
    assert not [b for b in sent if b["job"] == "quiet/acme"], sent
    assert not [r for r in listener.posts if b"asked for no alert" in r.raw]
