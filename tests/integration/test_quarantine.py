"""A runtime schedule whose row cannot be read is quarantined, on every backend (issue 26,
item 8): logged once with its id and why, never fired, counted, listed with its error, while
every other schedule fires on time, judged by a one-second schedule's own records, and
``/readyz`` stays 200. Before, one such row stopped every runtime schedule for good (nothing
fired, ``/readyz`` 503, ``GET /api/schedules`` 500).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from itertools import pairwise
from typing import Any

import aiohttp
import pytest
from slotcron import Client, JobContext
from slotcron.jobs.registry import Registry, task
from slotcron.service.service import Service
from slotcron.store import schedules as store
from slotcron.store.database import Database
from slotcron.store.tables import executions
from sqlalchemy import select

from tests.conftest import Services, outcomes_written, wait_for
from tests.corrupt import corrupt, ways

TASK = "quarantine.tick"
Ran = list[tuple[str, datetime]]


def ticking(ran: Ran) -> Registry:
    registry = Registry()

    @task(name=TASK, registry=registry)
    async def tick(ctx: JobContext) -> None:
        ran.append((ctx.job, ctx.scheduled_at))

    return registry


@pytest.fixture
def start(services: Services) -> Callable[[Registry], Awaitable[Service]]:
    """An instance on the database's clock, registering the given tasks, serving HTTP."""
    return lambda registry: services.start(tasks=registry.tasks(), pool_size=5, http_port=0)


async def records(db: Database, job: str) -> list[tuple[datetime, str]]:
    async with db.read() as conn:
        rows = await conn.execute(
            select(executions.c.scheduled_at, executions.c.status)
            .where(executions.c.job_name == job)
            .order_by(executions.c.scheduled_at)
        )
        return [(r.scheduled_at, r.status) for r in rows]


async def get(client: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    async with client.get(url) as response:
        return response.status, await response.json()


def assert_every_second_decided(beat: list[tuple[datetime, str]], since: datetime) -> None:
    """The one-second schedule's own records from ``since``: one row per second, none missing,
    each ``COMPLETED``, or ``MISSED`` when the loop of a loaded machine reached the slot more
    than its one-second grace late (a slot that did not run says so: nothing is lost)."""
    slots = [slot for slot, _ in beat if slot >= since]
    assert {status for slot, status in beat if slot >= since} <= {"COMPLETED", "MISSED"}, beat
    gaps = [(a, b) for a, b in pairwise(slots) if b - a != timedelta(seconds=1)]
    assert not gaps, f"the one-second schedule lost slots: {gaps}"


async def test_an_unreadable_row_is_quarantined_and_every_other_schedule_fires_on_time(
    backend: str,
    db: Database,
    db_url: str,
    start: Callable[..., Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="slotcron.schedules")
    ran: Ran = []
    registry = ticking(ran)
    broken = ways(backend)
    async with Client(db_url) as client:
        await store.register_tasks(
            db, registry.tasks(), now=await db.now(), instance_id="t", version="0"
        )
        await client.add_schedule(TASK, every=1, id="beat")
        for name in [*broken, "later"]:
            await client.add_schedule(TASK, every=1, id=f"broken/{name}")
    for name, values in broken.items():
        await corrupt(db, f"broken/{name}", **values)

    service = await start(registry)
    runtime = service.runtime
    await wait_for(lambda: runtime.quarantined == len(broken), timeout=15, what="the quarantine")
    await wait_for(lambda: sum(j == "broken/later" for j, _ in ran) >= 2, what="later fires")
    # Broken while the instance holds it, as a writer outside slotcron would (then announced).
    await corrupt(db, "broken/later", params='{"n": ' + "9" * 80 + "}")
    broken_at = await db.now()
    runtime.reread(["broken/later"])
    await wait_for(lambda: runtime.quarantined == len(broken) + 1, what="later quarantined")
    first_beat = min(slot for job, slot in ran if job == "beat")

    def beats_after(moment: datetime) -> list[datetime]:
        return [slot for job, slot in ran if job == "beat" and slot > moment]

    await wait_for(lambda: len(beats_after(broken_at)) >= 4, what="the beat after the break")
    await runtime.refresh()  # a periodic refresh reads them again: logged once all the same
    await outcomes_written(db)
    until = max(beats_after(broken_at))  # slots up to the last that ran: each decided by now
    beat = [(slot, status) for slot, status in await records(db, "beat") if slot <= until]
    assert len([s for s, _ in beat if s >= first_beat]) >= 5, beat
    assert_every_second_decided(beat, first_beat)
    # It kept firing while the rows were unreadable, also after one more broke under it.
    completed = [slot for slot, status in beat if status == "COMPLETED"]
    assert len(completed) >= 3 and max(completed) > broken_at, beat
    for name in broken:
        assert await records(db, f"broken/{name}") == [], f"{name} fired"
    later = await records(db, "broken/later")
    assert later and all(slot <= broken_at + timedelta(seconds=1) for slot, _ in later), later

    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    for name in [*broken, "later"]:
        mine = [r for r in warned if getattr(r, "job", None) == f"broken/{name}"]
        assert len(mine) == 1, (name, [r.getMessage() for r in mine])
        assert f"'broken/{name}'" in mine[0].getMessage()
    assert "params: " in runtime.unreadable["broken/digits"]
    assert "cron: " in runtime.unreadable["broken/cron"]
    assert "timezone: " in runtime.unreadable["broken/zone"]
    assert "options: max_attempts" in runtime.unreadable["broken/null-option"]

    assert service.http is not None
    url = service.http.url
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as http:
        status, ready = await get(http, f"{url}/readyz")
        assert status == 200, ready
        status, page = await get(http, f"{url}/api/schedules?limit=500")
        assert status == 200, page
        listed = {s["id"]: s for s in page["schedules"]}
        assert "error" not in listed["beat"]
        for name in [*broken, "later"]:
            assert listed[f"broken/{name}"]["error"], listed[f"broken/{name}"]
        assert listed["broken/digits"]["params"] is None
        status, one = await get(http, f"{url}/api/schedules/broken%2Fzone")
        assert status == 200 and one["error"].startswith("timezone: "), one


async def test_a_quarantined_schedule_mended_by_an_update_fires_again(
    db: Database, db_url: str, start: Callable[..., Any]
) -> None:
    ran: Ran = []
    registry = ticking(ran)
    async with Client(db_url) as client:
        await store.register_tasks(
            db, registry.tasks(), now=await db.now(), instance_id="t", version="0"
        )
        await client.add_schedule(TASK, every=1, id="mended")
        await corrupt(db, "mended", params='{"n": ' + "1" * 100 + "}")
        service = await start(registry)
        await wait_for(lambda: service.runtime.quarantined == 1, what="the quarantine")
        listed = await client.get_schedule("mended")
        assert listed["params"] is None and listed["error"].startswith("params: ")
        await client.update_schedule("mended", params={"n": 1})
    await wait_for(lambda: any(job == "mended" for job, _ in ran), what="the mended schedule")
    await wait_for(lambda: service.runtime.quarantined == 0, what="the quarantine lifted")
