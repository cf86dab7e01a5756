"""A runtime schedule's own calendar, excluded dates, window and ``max_runs`` (issue 30), on every
backend: written through the client's checks (bad values refused naming the field, nothing
written), shown with the schedule and applied to the next slots it lists, inherited from its task
when not given, changed and taken off by an update; and a service fires each as it says, judged by
what the task recorded."""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from slotcron import Client, InvalidJobError, JobContext
from slotcron.jobs.registry import Registry, task
from slotcron.jobs.schedules import ScheduleRecord, next_slots
from slotcron.store import schedules as store
from slotcron.store.database import Database
from slotcron.store.tables import executions
from sqlalchemy import select

from tests.conftest import Services, wait_for

TASK = "bounds.report"


def tasks(ran: list[tuple[str, datetime]], **options: Any) -> Registry:
    registry = Registry()

    @task(name=TASK, registry=registry, **options)
    async def report(ctx: JobContext) -> None:
        ran.append((ctx.job, ctx.scheduled_at))

    return registry


async def test_bounds_are_checked_shown_inherited_changed_and_taken_off(
    db: Database, db_url: str, services: Services
) -> None:
    await services.start(tasks=tasks([], exclude_dates=["2031-12-25"]).tasks())
    async with Client(db_url) as client:
        inherited = await client.add_schedule(TASK, cron="0 9 * * *", id="inherits")
        assert inherited["exclude_dates"] == ["2031-12-25"] and inherited["calendar"] is None
        own = await client.add_schedule(
            TASK,
            cron="0 9 * * *",
            timezone="America/New_York",
            id="own",
            calendar="holidays:US",
            exclude_dates=["2031-11-26"],
            start_at="2031-11-24T00:00:00Z",
            end_at=datetime(2031, 12, 1, tzinfo=UTC),
            max_runs=3,
        )
        assert {k: own[k] for k in ("calendar", "exclude_dates", "start_at", "end_at")} == {
            "calendar": "holidays:US",
            "exclude_dates": ["2031-11-26"],
            "start_at": "2031-11-24T00:00:00+00:00",
            "end_at": "2031-12-01T00:00:00+00:00",
        }
        assert own["max_runs"] == 3
        assert own["next_slot"] == "2031-11-24T14:00:00Z", "the window starts it"
        record = await store.get(db, "own")
        # Thanksgiving (27th) and the excluded 26th left out; the window ends on the 1st.
        assert [s.day for s in next_slots(record, 10)] == [24, 25, 28, 29, 30]
        for bad, field in (
            ({"calendar": "holidays:XX"}, "calendar"),
            ({"exclude_dates": ["tomorrow"]}, "exclude_dates"),
            ({"start_at": "2031-01-01T00:00:00"}, "start_at"),
            ({"start_at": "2031-02-01T00:00:00Z", "end_at": "2031-01-01T00:00:00Z"}, "end_at"),
            ({"max_runs": 0}, "max_runs"),
        ):
            with pytest.raises(InvalidJobError) as refused:
                await client.add_schedule(TASK, every=60, id="bad", **bad)
            assert refused.value.field == field, (bad, refused.value)
        assert [s["id"] for s in await client.list_schedules()] == ["inherits", "own"]
        changed = await client.update_schedule("own", calendar=None, max_runs=None, end_at=None)
        assert (changed["calendar"], changed["max_runs"], changed["end_at"]) == (None, None, None)
        assert changed["exclude_dates"] == ["2031-11-26"], "what is not given stays"
        record = await store.get(db, "own")
        assert [s.day for s in next_slots(record, 4)] == [24, 25, 27, 28], "Thanksgiving runs"
        with pytest.raises(InvalidJobError, match="calendar"):
            await client.update_schedule("own", calendar="holidays:ZZ")
        assert (await client.get_schedule("own"))["calendar"] is None


def _whole_second(after: float) -> datetime:
    return datetime.fromtimestamp(math.ceil(time.time() + after), UTC)


async def test_a_service_fires_each_schedule_within_its_own_bounds(
    db: Database, db_url: str, services: Services
) -> None:
    ran: list[tuple[str, datetime]] = []
    registry = tasks(ran)
    await services.start(tasks=registry.tasks())
    today = datetime.now(UTC).date()
    start = _whole_second(2)
    async with Client(db_url) as client:
        await client.add_schedule(TASK, every=1, id="twice", max_runs=2)
        await client.add_schedule(
            TASK, every=1, id="excluded", exclude_dates=[today, today + timedelta(days=1)]
        )
        await client.add_schedule(
            TASK, every=1, id="window", start_at=start, end_at=start + timedelta(seconds=3)
        )

    def runs(name: str) -> list[datetime]:
        return sorted(slot for job, slot in ran if job == name)

    await wait_for(lambda: len(runs("window")) == 3, timeout=20, what="the window's three slots")
    await wait_for(lambda: len(runs("twice")) == 2, timeout=10, what="two runs of twice")
    settled = time.time() + 2
    await wait_for(lambda: time.time() > settled, timeout=5, what="two more seconds")
    assert runs("window") == [start + timedelta(seconds=i) for i in range(3)]
    assert len(runs("twice")) == 2, "max_runs=2 ran more"
    assert runs("excluded") == [], "an excluded day's slot ran"
    async with db.read() as conn:
        rows = (
            await conn.execute(
                select(executions.c.status, executions.c.error).where(
                    executions.c.job_name == "excluded"
                )
            )
        ).all()
    days = (today, today + timedelta(days=1))  # the test may cross midnight
    assert rows and {r.status for r in rows} == {"SKIPPED"}
    assert {r.error for r in rows} <= {f"excluded date: {day.isoformat()}" for day in days}


def test_next_slots_of_a_window_that_ended_are_none() -> None:
    from slotcron.jobs.schedules import ScheduleSpec

    spec = ScheduleSpec(
        "s", TASK, "interval", "60", "UTC", {}, None, False,
        bounds={"end_at": "2020-01-01T00:00:00+00:00"},
    )  # fmt: skip
    now = datetime(2026, 1, 1, tzinfo=UTC)
    record = ScheduleRecord(spec, now, now, spec.schedule().next_after(now))
    assert next_slots(record, 5) == []
