"""Backfills carried on by running services, on every backend, judged by what the jobs record:
every slot of the range that never completed runs once (the live schedule's included), a
completed slot never again, and the live slots keep running on time beside it (the store's rules:
tests/store/test_backfills.py)."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from slotcron import Client, JobContext
from slotcron.jobs.registry import Job, Registry, every, task
from slotcron.store import backfills
from slotcron.store.database import Database

from tests.conftest import Services, wait_for

SECOND = timedelta(seconds=1)


class Record:
    """A job's own record: each body's slot, trigger, and real start."""

    def __init__(self) -> None:
        self.runs: list[tuple[datetime, str, float]] = []

    def slots(self, trigger: str | None = None) -> Counter[datetime]:
        return Counter(s for s, t, _ in self.runs if trigger in (None, t))


def job(record: Record, name: str, overlap: str, seconds: int = 1, body: float = 0.0) -> Job:
    registry = Registry()

    @every(seconds=seconds, name=name, overlap=overlap, registry=registry)
    async def recorded(ctx: JobContext) -> None:
        record.runs.append((ctx.scheduled_at, ctx.trigger, time.time()))
        await asyncio.sleep(body)

    return next(iter(registry))


async def finished(db: Database, backfill_id: int) -> backfills.Backfill | None:
    found = {b.id: b for b in await backfills.listing(db)}[backfill_id]
    return found if found.status == "COMPLETED" else None


async def test_a_backfill_runs_the_history_and_the_live_schedule_runs_on_time_beside_it(
    db: Database, services: Services
) -> None:
    record = Record()
    await services.start([job(record, "bf.every", "allow")])
    await wait_for(lambda: len(record.slots("interval")) >= 2, timeout=15, what="live runs")
    now = datetime.now(UTC).replace(microsecond=0)
    start, end = now - 40 * SECOND, now + 2 * SECOND  # history, and the live schedule's slots
    made = await backfills.create(db, job="bf.every", start=start, end=end, rate=0, now=now)
    assert made.total == 42
    done = await wait_for(lambda: finished(db, made.id), timeout=60, what="the backfill")
    ran = record.slots()
    in_range = {start + i * SECOND for i in range(42)}
    assert in_range <= set(ran), sorted(in_range - set(ran))
    assert [s for s, n in ran.items() if n > 1] == [], "a slot ran twice"
    by_backfill = record.slots("backfill")
    live = record.slots("interval")
    assert not set(by_backfill) & set(live), "the backfill ran a slot the live schedule ran"
    assert done.queued == len(by_backfill) and done.done == len(by_backfill)
    assert done.passed == 42 - len(by_backfill) and done.left == 0
    # Live slots on time while it ran: each within a second of its slot (a queued live slot
    # would start behind the backfill's runs, or be recorded MISSED and never start).
    lags = [t - s.timestamp() for s, trig, t in record.runs if trig == "interval"]
    assert max(lags) < 1.0, sorted(lags)[-3:]
    live_slots = sorted(live)
    gaps = [b - a for a, b in itertools.pairwise(live_slots)]
    assert set(gaps) == {SECOND}, "a live slot did not run"


async def test_a_forbid_jobs_backfill_runs_between_its_live_slots_one_at_a_time(
    db: Database, services: Services
) -> None:
    record = Record()
    await services.start([job(record, "bf.forbid", "forbid", seconds=4, body=0.05)])
    await wait_for(lambda: record.slots("interval"), timeout=15, what="a live run")
    now = datetime.now(UTC)
    start = datetime.fromtimestamp((now.timestamp() // 4) * 4, UTC) - 40 * SECOND
    made = await backfills.create(
        db, job="bf.forbid", start=start, end=start + 40 * SECOND, rate=5, now=now
    )
    assert made.total == 10
    await wait_for(lambda: finished(db, made.id), timeout=60, what="the backfill")
    assert set(record.slots("backfill")) == {start + i * 4 * SECOND for i in range(10)}
    runs = sorted((t, t + 0.05) for _, _, t in record.runs)
    overlapping = [a for a, b in itertools.pairwise(runs) if b[0] < a[1] - 0.01]
    assert not overlapping, "a forbid job ran two bodies at once"
    live = sorted(record.slots("interval"))
    gaps = {b - a for a, b in itertools.pairwise(live)}
    assert gaps <= {4 * SECOND}, f"a live slot was skipped behind a backfill run: {gaps}"


async def test_a_runtime_schedules_backfill_runs_its_history_with_its_params(
    db: Database, services: Services, db_url: str
) -> None:
    ran: list[tuple[datetime, str, dict[str, object]]] = []
    registry = Registry()

    @task(name="bf.task", registry=registry)
    async def report(ctx: JobContext) -> None:
        ran.append((ctx.scheduled_at, ctx.trigger, dict(ctx.params)))

    await services.start(tasks=registry.tasks())
    async with Client(db_url) as client:
        await client.add_schedule("bf.task", every=60, id="tenant-7", params={"tenant": 7})
        now = datetime.now(UTC)
        start = datetime.fromtimestamp(now.timestamp() // 60 * 60, UTC) - 10 * timedelta(minutes=1)
        made = await client.backfill("tenant-7", start, start + timedelta(minutes=5), rate=0)
    assert made["slots"] == 5
    await wait_for(lambda: finished(db, made["id"]), timeout=30, what="the backfill")
    # (its live slots run too when the test crosses a minute: they are not the backfill's)
    assert sorted(r for r in ran if r[1] == "backfill") == [
        (start + i * timedelta(minutes=1), "backfill", {"tenant": 7}) for i in range(5)
    ]
    assert len({slot for slot, _, _ in ran}) == len(ran), "a slot ran twice"


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
async def test_a_backfill_created_elsewhere_wakes_an_idle_listening_instance_at_once(
    db: Database, services: Services
) -> None:
    """An idle instance that hears notifications looks for backfills once a minute (a look
    every 2 s was 90 statements a minute): one created by another process wakes it."""
    record = Record()
    service = await services.start([job(record, "bf.woken", "allow", seconds=3600)])
    await wait_for(lambda: service.queued.listening, what="the instance to listen")
    await wait_for(lambda: service.backfilling.looks >= 1, what="a first look, finding none")
    looks = service.backfilling.looks
    now = datetime.now(UTC).replace(microsecond=0)
    hour = datetime.fromtimestamp(now.timestamp() // 3600 * 3600, UTC)
    made = await backfills.create(
        db, job="bf.woken", start=hour - 3 * 3600 * SECOND, end=hour, rate=0, now=now
    )
    assert made.total == 3
    began = time.monotonic()
    await wait_for(lambda: len(record.slots("backfill")) == 3, timeout=20, what="the backfill")
    assert time.monotonic() - began < 20
    assert service.backfilling.looks > looks
