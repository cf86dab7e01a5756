"""Runtime schedules fired by an instance, on every backend, by a manual clock (issue 15).

The instance takes a write in within a second of its commit (a notification on PostgreSQL, the
change token polled elsewhere): each test waits for that on a condition, then moves the clock.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from slotcron import JobContext
from slotcron.clock import ManualClock
from slotcron.jobs.registry import Registry, task
from slotcron.jobs.schedules import ScheduleRecord
from slotcron.service.service import Service
from slotcron.store import due, operations
from slotcron.store import schedules as store
from slotcron.store.batch import Due
from slotcron.store.database import Database
from slotcron.store.tables import executions, jobs
from sqlalchemy import select, update

from tests.conftest import Services, wait_for

T0 = datetime(2026, 11, 22, 0, 0, 0, 500000, tzinfo=UTC)
TASK = "tests.runtime.report"
OTHER = "tests.runtime.other"


def at(seconds: float) -> datetime:
    return datetime(2026, 11, 22, tzinfo=UTC) + timedelta(seconds=seconds)


Ran = list[tuple[str, datetime, dict[str, Any]]]
Start = Callable[..., Any]


@pytest.fixture
def start(services: Services) -> Start:
    """Start an instance registering the given tasks, on a manual clock (:class:`Services`)."""

    def start(registry: Registry, clock: ManualClock, **overrides: Any) -> Awaitable[Service]:
        settings = {"pool_size": 5, **overrides}
        return services.start(clock=clock, tasks=registry.tasks(), **settings)

    return start


def report_task(ran: Ran, name: str = TASK, **options: Any) -> Registry:
    registry = Registry()

    @task(name=name, registry=registry, **options)
    async def report(ctx: JobContext) -> None:
        ran.append((ctx.job, ctx.scheduled_at, dict(ctx.params)))

    return registry


async def add(db: Database, registry: Registry, now: datetime, **fields: Any) -> ScheduleRecord:
    items = [{"task": TASK, **fields}]
    [record] = await store.create(
        db, items, default_timezone="UTC", by="test", registry=registry, now=now
    )
    return record


async def outcomes(db: Database, job: str) -> dict[str, str]:
    async with db.read() as conn:
        rows = await conn.execute(
            select(executions.c.scheduled_at, executions.c.status).where(
                executions.c.job_name == job
            )
        )
        return {r.scheduled_at.isoformat(): r.status for r in rows}


def held(service: Service, schedule_id: str) -> Any:
    return service.schedule_planner.current.get(schedule_id)


def planning(service: Service, clock: ManualClock) -> str:
    """What the schedules' planner holds, for a failed wait's message."""
    planner = service.schedule_planner
    tasks = sorted(t.get_name() for t in asyncio.all_tasks())
    heap = [(f"{s:%H:%M:%S}", j.name, getattr(j, "version", None)) for s, _, j in planner._heap]
    return (
        f"clock {clock.now():%H:%M:%S}, asleep {[f'{w:%H:%M:%S}' for _, w in clock._sleepers]}; "
        f"heap {sorted(heap)}; "
        f"current {[(n, j.version) for n, j in planner.current.items()]}; "
        f"popped {planner.popped}; members {planner.shares.members}; tasks {tasks}"
    )


async def test_a_schedule_fires_as_a_job_named_by_its_id_with_its_params(
    db: Database, start: Start
) -> None:
    ran: Ran = []
    registry = report_task(ran)
    clock = ManualClock(T0)
    record = await add(db, registry, T0, id="tenant-1", every=10, params={"tenant": 1})
    service = await start(registry, clock)
    await wait_for(lambda: held(service, "tenant-1"), what="the schedule loaded")
    await clock.set(at(10))
    await wait_for(lambda: len(ran) == 1, what="the :10 slot")
    assert ran == [("tenant-1", at(10), {"tenant": 1})]
    assert record.next_slot == at(10)
    # A manual trigger's params are merged over the schedule's.
    await clock.set(at(11))
    await operations.trigger(db, job="tenant-1", params={"extra": "x"}, now=clock.now())
    await wait_for(lambda: len(ran) == 2, what="the manual run")
    assert ran[1][0] == "tenant-1" and ran[1][2] == {"tenant": 1, "extra": "x"}

    async def completed() -> bool:
        return list((await outcomes(db, "tenant-1")).values()).count("COMPLETED") == 2

    await wait_for(completed, what="both runs recorded COMPLETED under the schedule's id")


async def test_an_update_applies_from_the_next_slot_after_it_commits(
    db: Database, start: Start, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="slotcron")  # shown if the test fails
    ran: Ran = []
    registry = report_task(ran)
    clock = ManualClock(T0)
    await add(db, registry, T0, id="tenant-2", every=10, params={"v": 1})
    service = await start(registry, clock)
    await wait_for(lambda: held(service, "tenant-2"), what="the schedule loaded")
    await clock.set(at(10))
    await wait_for(lambda: len(ran) == 1, what="the :10 slot")
    await clock.set(at(12))
    updated = await store.update(
        db, "tenant-2", {"every": 15, "params": {"v": 2}}, now=clock.now(), by="test"
    )
    assert updated.next_slot == at(15)
    await wait_for(
        lambda: getattr(held(service, "tenant-2"), "version", None) == updated.updated_at,
        what="the update in force",
    )
    assert "tenant-2" in planning(service, clock)  # what a failed wait below would say
    await clock.set(at(15))
    try:
        await wait_for(lambda: len(ran) == 2, what="the new :15 slot")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {planning(service, clock)}") from None
    await clock.set(at(20))  # a slot of the old timing only
    await clock.set(at(30))
    await wait_for(lambda: len(ran) == 3, what="the :30 slot")
    assert ran == [
        ("tenant-2", at(10), {"v": 1}),
        ("tenant-2", at(15), {"v": 2}),
        ("tenant-2", at(30), {"v": 2}),
    ]


async def test_after_a_removal_no_slot_runs_and_history_is_kept(db: Database, start: Start) -> None:
    ran: Ran = []
    registry = report_task(ran)
    clock = ManualClock(T0)
    await add(db, registry, T0, id="tenant-3", every=10)
    service = await start(registry, clock)
    await wait_for(lambda: held(service, "tenant-3"), what="the schedule loaded")
    await clock.set(at(10))
    await wait_for(lambda: len(ran) == 1, what="the :10 slot")
    await wait_for(lambda: held(service, "tenant-3"), what="the :20 slot held")
    await store.remove(db, "tenant-3", now=clock.now())
    await wait_for(lambda: held(service, "tenant-3") is None, what="the removal in force")
    for second in (20, 30, 40):
        await clock.set(at(second))
    # The stale entry of :20 came up and was dropped: the heap is empty.
    await wait_for(lambda: not service.schedule_planner._heap, what="the stale entry dropped")
    assert [slot for _, slot, _ in ran] == [at(10)]

    async def kept() -> bool:
        return await outcomes(db, "tenant-3") == {at(10).isoformat(): "COMPLETED"}

    await wait_for(kept, what="the history of the removed schedule kept")


async def test_a_removed_schedules_slot_cannot_be_claimed(db: Database, start: Start) -> None:
    """The claim itself refuses: a slot an instance had in hand when the removal committed
    finds the row gone, under the row lock."""
    ran: Ran = []
    registry = report_task(ran)
    clock = ManualClock(T0)
    await add(db, registry, T0, id="tenant-4", every=10)
    service = await start(registry, clock)
    job = await service.runtime.resolve("tenant-4")
    assert job is not None
    await store.remove(db, "tenant-4", now=clock.now())
    assert await service.firing.claim(job, at(10), trigger="interval") is None
    assert await outcomes(db, "tenant-4") == {}


async def test_a_claim_presenting_the_version_an_update_replaced_decides_nothing(
    db: Database, start: Start
) -> None:
    """An update is in force for every claim after its commit, heard of or not: an instance
    whose announcement is late still holds the old version, and its claim of a slot of the old
    timing decides nothing, alone or in a batch, under the row lock. It reads the schedule
    again instead (it is not superseded), and fires the new version from its first slot."""
    ran: Ran = []
    registry = report_task(ran)
    clock = ManualClock(T0)
    await add(db, registry, T0, id="tenant-6", every=10, params={"v": 1})
    await add(db, registry, T0, id="tenant-7", every=10, params={"v": 1})
    async with db.transaction() as conn:  # a row written before versions were marked
        await conn.execute(update(jobs).where(jobs.c.name == "tenant-7").values(fingerprint=None))
    service = await start(registry, clock)
    old = {name: await service.runtime.resolve(name) for name in ("tenant-6", "tenant-7")}
    reread: list[str] = []
    service.supersession.changed = reread.extend
    await clock.set(at(12))
    await wait_for(lambda: len(ran) == 2, what="the :10 slots")
    for name in old:
        updated = await store.update(
            db, name, {"every": 30, "params": {"v": 2}}, now=clock.now(), by="test"
        )
        assert updated.next_slot == at(30)  # :20 is a slot of the old timing only

    tenant_6, tenant_7 = old["tenant-6"], old["tenant-7"]
    assert tenant_6 is not None and tenant_7 is not None
    assert await service.firing.claim(tenant_6, at(20), trigger="interval") is None
    lone = Due(
        job_name="tenant-7",
        slot=at(20),
        following=at(30),
        trigger="interval",
        lease_ms=60_000,
        forbid_overlap=True,
        fingerprint=service.claimer.fingerprint(tenant_7),
    )
    decided = await service.claimer.claim_many([lone], give_up_at=at(21))
    assert decided.claims == {} and decided.taken == {"tenant-7"}
    assert reread == ["tenant-6", "tenant-7"]
    assert not service.supersession.superseded
    for name in old:
        assert at(20).isoformat() not in await outcomes(db, name)

    service.supersession.changed = service.runtime.reread
    service.runtime.reread(["tenant-6", "tenant-7"])

    def renewed() -> bool:
        return all(
            getattr(held(service, job.name), "mark", "") not in ("", job.mark)
            for job in (tenant_6, tenant_7)
        )

    await wait_for(renewed, what="the new versions held")
    await clock.set(at(20))
    await clock.set(at(30))
    await wait_for(lambda: len(ran) == 4, what="the :30 slots")
    assert sorted(ran) == [
        ("tenant-6", at(10), {"v": 1}),
        ("tenant-6", at(30), {"v": 2}),
        ("tenant-7", at(10), {"v": 1}),
        ("tenant-7", at(30), {"v": 2}),
    ]


async def test_a_paused_schedule_records_its_slots_skipped_until_resumed(
    db: Database, start: Start
) -> None:
    ran: Ran = []
    registry = report_task(ran)
    clock = ManualClock(T0)
    await add(db, registry, T0, id="tenant-5", every=10)
    service = await start(registry, clock)
    await wait_for(lambda: held(service, "tenant-5"), what="the schedule loaded")
    assert await operations.set_paused(db, job="tenant-5", paused=True, reason=None)
    await clock.set(at(10))

    async def skipped() -> bool:
        return await outcomes(db, "tenant-5") == {at(10).isoformat(): "SKIPPED"}

    await wait_for(skipped, what=":10 recorded SKIPPED")
    assert await operations.set_paused(db, job="tenant-5", paused=False, reason=None)
    await clock.set(at(20))
    await wait_for(lambda: len(ran) == 1, what="the :20 slot after resume")
    assert ran[0][:2] == ("tenant-5", at(20))


async def test_an_instance_holds_only_the_schedules_due_within_its_horizon(
    db: Database, start: Start
) -> None:
    ran: Ran = []
    registry = report_task(ran)
    clock = ManualClock(T0)
    await add(db, registry, T0, id="soon", every=30)
    far = [{"task": TASK, "id": f"far-{i}", "cron": "0 9 * * *"} for i in range(50)]
    await store.create(db, far, default_timezone="UTC", by="test", registry=registry, now=T0)
    service = await start(registry, clock)
    await wait_for(lambda: held(service, "soon"), what="the near schedule loaded")
    await service.runtime.refresh()
    assert set(service.schedule_planner.current) == {"soon"}
    assert service.runtime.loaded == 1
    # Its next slot beyond the horizon, a schedule is forgotten once its slot is decided.
    await clock.set(at(30))
    await wait_for(lambda: len(ran) == 1, what="the :30 slot")
    await service.runtime.refresh()
    assert held(service, "soon") is not None  # :60 is within the horizon of :30
    assert not any(name.startswith("far-") for name in service.schedule_planner.current)


async def test_the_horizon_is_read_in_pages_each_schedule_once_in_slot_order(
    db: Database,
) -> None:
    """Pages of the range read continue where the last ended: within one slot shared by many
    schedules (a burst) by id, then on to later slots; none read twice, none skipped."""
    registry = report_task([])
    items = [{"task": TASK, "id": f"b-{i:02d}", "cron": "10 0 0 * * *"} for i in range(7)]
    items += [{"task": TASK, "id": f"a-{i:02d}", "cron": "20 0 0 * * *"} for i in range(4)]
    items += [{"task": OTHER, "id": "not-mine", "cron": "10 0 0 * * *"}]
    items += [{"task": TASK, "id": "far", "cron": "0 9 * * *"}]
    other = report_task([], name=OTHER)
    await store.create(db, items[-2:-1], default_timezone="UTC", by="test", registry=other, now=T0)
    await store.create(
        db, items[:-2] + items[-1:], default_timezone="UTC", by="test", registry=registry, now=T0
    )
    pages = [
        [(row.next_slot_at, row.name) for row in rows]
        async for rows in due.due_before(db, [TASK], at(60), page=3)
    ]
    assert [len(p) for p in pages] == [3, 3, 3, 2]
    read = [entry for p in pages for entry in p]
    assert read == sorted(read)
    assert read == [(at(10), f"b-{i:02d}") for i in range(7)] + [
        (at(20), f"a-{i:02d}") for i in range(4)
    ]


async def test_a_schedule_whose_task_no_instance_has_waits_then_its_misfire_policy_decides(
    db: Database, start: Start, caplog: pytest.LogCaptureFixture
) -> None:
    ran: Ran = []
    registry = report_task(ran)
    clock = ManualClock(T0)
    await add(db, registry, T0, id="orphan", every=10)
    other = report_task(ran, name=OTHER)
    caplog.set_level(logging.WARNING, logger="slotcron.schedules")
    first = await start(other, clock, instance_id="without-the-task")
    await wait_for(
        lambda: any(TASK in r.getMessage() for r in caplog.records),
        what="a warning naming the task",
    )
    await clock.set(at(35))
    assert held(first, "orphan") is None
    assert await outcomes(db, "orphan") == {}
    # What `schedules show` says (by the instances' heartbeats on the manual clock).
    assert await due.live_tasks(db, [TASK], alive_since=T0) == set()
    await start(registry, clock, instance_id="with-the-task")
    assert await due.live_tasks(db, [TASK], alive_since=T0) == {TASK}
    # :10 and :20 are past their grace: misfire="skip" records them MISSED; :30 is on time.

    async def decided() -> bool:
        return await outcomes(db, "orphan") == {
            at(10).isoformat(): "MISSED",
            at(20).isoformat(): "MISSED",
            at(30).isoformat(): "COMPLETED",
        }

    await wait_for(decided, what="the waiting slots decided by the misfire policy")
    assert [slot for _, slot, _ in ran] == [at(30)]


async def test_a_schedules_logger_is_its_tasks_and_names_the_schedule(
    db: Database, start: Start
) -> None:
    # One logger per task, not per schedule: the logging module keeps every logger for good.
    seen: list[tuple[str, Any]] = []
    registry = Registry()

    @task(name=TASK, registry=registry)
    async def report(ctx: JobContext) -> None:
        adapter = ctx.logger
        assert isinstance(adapter, logging.LoggerAdapter)
        seen.append((adapter.logger.name, dict(adapter.extra or {})))

    clock = ManualClock(T0)
    await add(db, registry, T0, id="tenant-9", every=10)
    service = await start(registry, clock)
    await wait_for(lambda: held(service, "tenant-9"), what="the schedule loaded")
    await clock.set(at(10))
    await wait_for(lambda: len(seen) == 1, what="the :10 slot")
    name, extra = seen[0]
    assert name == f"slotcron.job.{TASK}"
    assert extra["job"] == "tenant-9"
