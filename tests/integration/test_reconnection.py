"""After reconnecting, an instance checks what the database kept of its writes (issue 25): a
failover to an asynchronous standby can lose the last commits. Here the loss is made by SQL on
one healthy database (the topology tests make it with a real standby): a run's claim deleted,
given to another instance, or handed back; an outcome's write undone; a whole finished run
gone. Every backend, the real clock, in-process instances."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

import pytest
from slotcron import JobContext
from slotcron.jobs.registry import Registry, every
from slotcron.lifeline.reconnection import LOST
from slotcron.service.service import Service
from slotcron.store import operations
from slotcron.store.database import Database
from slotcron.store.tables import executions
from sqlalchemy import delete, select, update

from tests.conftest import ServiceFactory, wait_for


async def row_of(db: Database, job: str, slot: datetime) -> dict[str, Any] | None:
    async with db.read() as conn:
        found = (
            (
                await conn.execute(
                    select(executions).where(
                        executions.c.job_name == job, executions.c.scheduled_at == slot
                    )
                )
            )
            .mappings()
            .first()
        )
    return dict(found) if found is not None else None


class Slow:
    """A job that runs until told, recording its start and whether it was fenced."""

    def __init__(self, name: str, registry: Registry) -> None:
        self.started: list[tuple[datetime, int]] = []
        self.fenced: list[datetime] = []
        self.release = asyncio.Event()

        @every(seconds=3600, name=name, registry=registry, overlap="allow")
        async def job(ctx: JobContext) -> None:
            self.started.append((ctx.scheduled_at, ctx.execution_id))
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                if ctx.lease_lost.is_set():
                    self.fenced.append(ctx.scheduled_at)
                raise


async def start_slow(start_service: ServiceFactory, name: str) -> tuple[Service, Slow]:
    registry = Registry()
    slow = Slow(name, registry)
    # The job's first slot is now (an every-hour job is due at the top of the hour): trigger it.
    service = await start_service(list(registry), lease_seconds=30)
    await operations.trigger(service.db, job=name, now=service.clock.now(), params={})
    service.queued.wake_at(service.clock.now())
    await wait_for(lambda: slow.started, timeout=10, what="the slow job to start")
    return service, slow


async def test_a_run_whose_claim_the_database_lost_is_fenced_recorded_stopped_and_announced(
    db: Database, start_service: ServiceFactory, caplog: pytest.LogCaptureFixture
) -> None:
    service, slow = await start_slow(start_service, "lost-claim")
    slot, _ = slow.started[0]
    async with db.transaction() as conn:  # the failover lost the claim (the take of a trigger)
        await conn.execute(delete(executions).where(executions.c.job_name == "lost-claim"))

    await service.reconnection.check()

    await wait_for(lambda: slow.fenced, timeout=5, what="the run to be fenced")
    assert slow.fenced == [slot]
    row = await row_of(db, "lost-claim", slot)
    assert row is not None and row["status"] == "STOPPED"
    assert LOST in (row["error"] or "")
    assert service.reconnection.fenced == 1
    assert any(LOST in r.getMessage() and "lost-claim" in r.getMessage() for r in caplog.records)


async def test_a_run_the_database_gives_to_another_instance_is_fenced_and_left_to_it(
    db: Database, start_service: ServiceFactory
) -> None:
    service, slow = await start_slow(start_service, "taken-claim")
    slot, _ = slow.started[0]
    async with db.transaction() as conn:
        await conn.execute(
            update(executions)
            .where(executions.c.job_name == "taken-claim")
            .values(instance_id="another-instance")
        )

    await service.reconnection.check()

    await wait_for(lambda: slow.fenced, timeout=5, what="the run to be fenced")
    row = await row_of(db, "taken-claim", slot)
    assert row is not None and (row["status"], row["instance_id"]) == (
        "RUNNING",
        "another-instance",
    )


async def test_a_run_still_ours_goes_on(db: Database, start_service: ServiceFactory) -> None:
    service, slow = await start_slow(start_service, "kept-claim")
    await service.reconnection.check()
    await asyncio.sleep(0.3)
    assert not slow.fenced
    slow.release.set()
    slot, _ = slow.started[0]

    async def completed() -> bool:
        row = await row_of(db, "kept-claim", slot)
        return row is not None and row["status"] == "COMPLETED"

    await wait_for(completed, timeout=5, what="the run to complete")


@pytest.mark.parametrize("lost", ["outcome", "row"])
async def test_an_outcome_the_database_lost_is_written_again(
    db: Database, start_service: ServiceFactory, lost: str
) -> None:
    service, slow = await start_slow(start_service, "finished")
    slot, _ = slow.started[0]
    slow.release.set()

    async def completed() -> bool:
        row = await row_of(db, "finished", slot)
        return row is not None and row["status"] == "COMPLETED"

    await wait_for(completed, timeout=5, what="the run to complete")
    # The outcome is kept once its writer hears it committed, a moment after the row says so.
    found = await row_of(db, "finished", slot)
    assert found is not None
    await wait_for(
        lambda: service.reconnection.remembers(found["id"]), timeout=5, what="the outcome kept"
    )
    async with db.transaction() as conn:
        if lost == "outcome":  # the claim replicated, the outcome did not
            await conn.execute(
                update(executions)
                .where(executions.c.job_name == "finished")
                .values(status="RUNNING", finished_at=None, error=None)
            )
        else:  # neither did
            await conn.execute(delete(executions).where(executions.c.job_name == "finished"))

    await service.reconnection.check()

    row = await row_of(db, "finished", slot)
    assert row is not None and row["status"] == "COMPLETED"
    assert row["instance_id"] == service.instance_id
    assert row["started_at"] is not None and row["finished_at"] is not None


async def test_an_outage_that_ends_wakes_the_check(
    db: Database, start_service: ServiceFactory
) -> None:
    service, _slow = await start_slow(start_service, "woken")
    before = service.reconnection.checks
    service.outage.failed(ConnectionError("gone"), "testing")
    service.outage.recovered()
    await wait_for(lambda: service.reconnection.checks > before, timeout=5, what="a check")
