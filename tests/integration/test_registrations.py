"""Job and instance registration across versions of the code (a blue/green overlap)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

import app.service
from app import JobContext
from app.clock import ManualClock
from app.registry import Registry, every
from app.store.database import Database
from app.store.operations import list_jobs
from tests.conftest import ServiceFactory, wait_for

T0 = datetime(2026, 11, 22, 0, 0, 0, 500_000, tzinfo=UTC)


async def test_live_versions_that_disagree_on_a_schedule_show_drift_and_never_double_a_slot(
    db: Database, start_service: ServiceFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[tuple[datetime, str]] = []
    blue_jobs, green_jobs = Registry(), Registry()

    @every(seconds=10, name="report", registry=blue_jobs)
    async def blue(ctx: JobContext) -> None:
        ran.append((ctx.scheduled_at, "blue"))

    @every(seconds=20, name="report", registry=green_jobs)
    async def green(ctx: JobContext) -> None:
        ran.append((ctx.scheduled_at, "green"))

    clock = ManualClock(T0)
    monkeypatch.setattr(app.service, "__version__", "1.0")
    blue_service = await start_service(list(blue_jobs), clock=clock, instance_id="blue")
    monkeypatch.setattr(app.service, "__version__", "2.0")
    green_service = await start_service(list(green_jobs), clock=clock, instance_id="green")

    [record] = await list_jobs(db, now=clock.now(), live_within=60)
    assert record.drift == {"1.0": "every 10s (UTC)", "2.0": "every 20s (UTC)"}

    for seconds in (10, 20, 30, 40):
        await clock.set(T0 + timedelta(seconds=seconds))
        await wait_for(
            lambda: any(slot.second == seconds % 60 for slot, _ in ran),  # noqa: B023 (awaited now)
            what=f"slot :{seconds}",
        )
        # Its outcome written too: a run still recorded RUNNING would make the next slot
        # SKIPPED under overlap="forbid", which is right but not what this test is about.
        await wait_for(
            lambda: len(blue_service.runs) == len(green_service.runs) == 0,
            what=f"slot :{seconds} recorded",
        )
    slots = [slot for slot, _ in ran]
    assert len(slots) == len(set(slots)), f"a slot ran twice: {ran}"
    assert sorted(s.second for s in slots) == [10, 20, 30, 40]
