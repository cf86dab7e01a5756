"""Late slots, with time moved by the scheduler's own clock instead of slept through."""

from __future__ import annotations

import asyncio
import itertools
import time
from datetime import UTC, datetime, timedelta

import pytest
from slotcron import JobContext
from slotcron.clock import ManualClock
from slotcron.jobs.registry import Job, Registry, every
from slotcron.store.database import Database
from slotcron.store.tables import executions, jobs
from sqlalchemy import select, update

from tests.conftest import ServiceFactory, outcomes_written, wait_for

T0 = datetime(2026, 11, 22, 0, 0, 0, 500_000, tzinfo=UTC)


def at(seconds: int) -> str:
    return (T0.replace(microsecond=0) + timedelta(seconds=seconds)).isoformat()


async def outcomes(db: Database) -> dict[str, tuple[str, str]]:
    async with db.read() as conn:
        rows = (await conn.execute(select(executions))).mappings().all()
    return {r["scheduled_at"].isoformat(): (r["status"], r["trigger"]) for r in rows}


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("skip", {20: ("MISSED", "interval"), 30: ("MISSED", "interval")}),
        ("once", {20: ("MISSED", "interval"), 30: ("COMPLETED", "catchup")}),
        ("all", {20: ("COMPLETED", "catchup"), 30: ("COMPLETED", "catchup")}),
    ],
)
async def test_slots_reached_late_are_accounted_for_by_the_misfire_policy(
    db: Database, start_service: ServiceFactory, policy: str, expected: dict[int, tuple[str, str]]
) -> None:
    registry = Registry()
    ran: list[datetime] = []

    @every(seconds=10, name="ten", misfire=policy, registry=registry)
    async def ten(ctx: JobContext) -> None:
        ran.append(ctx.scheduled_at)

    clock = ManualClock(T0)
    await start_service(list(registry), clock=clock)
    await clock.set(T0 + timedelta(seconds=10))
    await wait_for(lambda: len(ran) == 1, what="the on-time slot :10")
    await outcomes_written(db)
    # The instance stalls 35 s: :20 and :30 are past their grace (one period), :40 is not.
    await clock.set(T0 + timedelta(seconds=45))
    want = {
        at(10): ("COMPLETED", "interval"),
        **{at(k): v for k, v in expected.items()},
        at(40): ("COMPLETED", "interval"),
    }

    async def settled() -> bool:
        return await outcomes(db) == want

    await wait_for(settled, what=f"outcomes {want}")
    assert sorted(ran) == sorted(
        datetime.fromisoformat(slot) for slot, (status, _) in want.items() if status == "COMPLETED"
    )


async def test_slots_older_than_the_catchup_window_are_recorded_as_one_passed_over_range(
    db: Database, start_service: ServiceFactory
) -> None:
    registry = Registry()

    @every(seconds=10, name="window", misfire="skip", catchup_window=30, registry=registry)
    async def window() -> None: ...

    clock = ManualClock(T0)
    await start_service(list(registry), clock=clock)
    # At 01:05.5 the window reaches back to 00:35.5: :10 .. :30 are passed over (one record
    # whose until is :30), :40 and :50 are recorded MISSED, :60 is on time.
    await clock.set(T0 + timedelta(seconds=65))

    async def settled() -> bool:
        return await outcomes(db) == {
            at(10): ("MISSED", "interval"),
            at(40): ("MISSED", "interval"),
            at(50): ("MISSED", "interval"),
            at(60): ("COMPLETED", "interval"),
        }

    await wait_for(settled, what="the range and the slots inside the window recorded")
    async with db.read() as conn:
        until = (await conn.execute(select(executions.c.scheduled_at, executions.c.until))).all()
    assert sorted((s.isoformat(), u and u.isoformat()) for s, u in until) == [
        (at(10), at(30)),
        (at(40), None),
        (at(50), None),
        (at(60), None),
    ]


async def test_an_on_time_slot_never_fires_before_its_time(
    db: Database, start_service: ServiceFactory
) -> None:
    registry = Registry()
    ran: list[tuple[datetime, datetime]] = []
    clock = ManualClock(T0)

    @every(seconds=10, name="punctual", registry=registry)
    async def punctual(ctx: JobContext) -> None:
        ran.append((ctx.scheduled_at, clock.now()))

    await start_service(list(registry), clock=clock)
    await clock.set(T0 + timedelta(seconds=9.4))  # 00:00:09.9, a hair before the slot
    assert ran == []
    await clock.set(T0 + timedelta(seconds=9.5))
    await wait_for(lambda: ran, what="the slot at :10")
    assert ran[0][0] == datetime.fromisoformat(at(10))
    assert ran[0][1] >= ran[0][0]


async def test_many_jobs_reached_late_are_recorded_missed_together_in_order(
    db: Database, start_service: ServiceFactory
) -> None:
    registry = Registry()
    ran: list[tuple[str, datetime]] = []

    def make(i: int) -> None:
        @every(seconds=10, name=f"many-{i}", registry=registry)
        async def job(ctx: JobContext) -> None:
            ran.append((ctx.job, ctx.scheduled_at))

    for i in range(30):
        make(i)
    clock = ManualClock(T0)
    service = await start_service(list(registry), clock=clock)
    await clock.set(T0 + timedelta(seconds=10))
    await wait_for(lambda: len(ran) == 30, what="the on-time slot :10 of every job")
    await outcomes_written(db)
    batches = service.claimer.stats.batches
    await clock.set(T0 + timedelta(seconds=45))  # :20 and :30 are past their grace, :40 is not

    async def settled() -> bool:
        async with db.read() as conn:
            rows = (await conn.execute(select(executions))).all()
        return len(rows) == 120 and all(r.status != "RUNNING" for r in rows)

    await wait_for(settled, what="120 slots decided")
    async with db.read() as conn:
        rows = (await conn.execute(select(executions).order_by(executions.c.id))).all()
    by_slot: dict[str, set[str]] = {}
    for r in rows:
        by_slot.setdefault(r.scheduled_at.isoformat(), set()).add(r.status)
    assert by_slot == {
        at(10): {"COMPLETED"},
        at(20): {"MISSED"},
        at(30): {"MISSED"},
        at(40): {"COMPLETED"},
    }
    # Each job's :20 was recorded before its :30 (rows are numbered as written).
    for i in range(30):
        mine = [r for r in rows if r.job_name == f"many-{i}" and r.status == "MISSED"]
        assert [r.scheduled_at.isoformat() for r in mine] == [at(20), at(30)]
    # Two rounds of 30 and one burst of 30: three transactions, not ninety.
    assert service.claimer.stats.batches - batches == 3


async def test_slots_never_decided_before_a_burst_are_recorded_missed_together(
    db: Database, start_service: ServiceFactory
) -> None:
    """A burst whose jobs have older slots nobody decided (claims that gave up under
    overload) records those MISSED in a few transactions, then runs the burst."""
    registry = Registry()
    ran: list[str] = []

    def make(i: int) -> None:
        @every(seconds=10, name=f"gap-{i}", registry=registry)
        async def job(ctx: JobContext) -> None:
            ran.append(ctx.job)

    for i in range(30):
        make(i)
    clock = ManualClock(T0)
    service = await start_service(list(registry), clock=clock)
    # As if the claims of :-10 and :00 had given up: the jobs still expect :-10.
    async with db.transaction() as conn:
        await conn.execute(
            update(jobs).values(next_slot_at=T0.replace(microsecond=0) - timedelta(seconds=10))
        )
    batches = service.claimer.stats.batches
    await clock.set(T0 + timedelta(seconds=10))
    await wait_for(lambda: len(ran) == 30, what="the :10 burst to run")
    await outcomes_written(db)
    async with db.read() as conn:
        rows = (await conn.execute(select(executions))).all()
    by_slot: dict[str, set[str]] = {}
    for r in rows:
        by_slot.setdefault(r.scheduled_at.isoformat(), set()).add(r.status)
    assert by_slot == {at(-10): {"MISSED"}, at(0): {"MISSED"}, at(10): {"COMPLETED"}}
    assert len(rows) == 90
    # The burst's first try, two rounds of 30 MISSED, the burst again: not ninety claims.
    assert service.claimer.stats.batches - batches == 4


async def test_a_burst_whose_undecided_slots_are_past_the_catchup_window_still_runs(
    db: Database, start_service: ServiceFactory
) -> None:
    """A gap older than catchup_window is one passed-over range per job; the burst runs."""
    registry = Registry()
    ran: list[str] = []

    def make(i: int) -> None:
        @every(seconds=10, name=f"old-gap-{i}", catchup_window=5, registry=registry)
        async def job(ctx: JobContext) -> None:
            ran.append(ctx.job)

    for i in range(30):
        make(i)
    clock = ManualClock(T0)
    await start_service(list(registry), clock=clock)
    async with db.transaction() as conn:
        await conn.execute(update(jobs).values(next_slot_at=T0 - timedelta(minutes=5)))
    await clock.set(T0 + timedelta(seconds=10))
    await wait_for(lambda: len(ran) == 30, what="the :10 burst to run")
    await outcomes_written(db)
    async with db.read() as conn:
        found = (await conn.execute(select(executions))).all()
    # The window (5 s) reaches back to :05.5: slots -4:50 .. :00 are passed over.
    assert sorted(
        {(r.scheduled_at.isoformat(), r.status, r.until and r.until.isoformat()) for r in found}
    ) == [
        (at(-290), "MISSED", at(0)),
        (at(10), "COMPLETED", None),
    ]
    assert len(found) == 60
    assert sorted(ran) == sorted(f"old-gap-{i}" for i in range(30))


async def test_a_job_faster_than_the_lead_is_claimed_at_its_slots_not_ahead(
    db: Database, start_service: ServiceFactory
) -> None:
    """A burst is claimed ahead of its slot; a job due with it whose period is shorter than
    twice that lead is claimed at its slot instead: none of its slots is MISSED or doubled."""
    registry = Registry()
    ran: list[tuple[str, datetime]] = []

    def make(i: int) -> None:
        @every(seconds=10, name=f"slow-{i}", registry=registry)
        async def job(ctx: JobContext) -> None:
            ran.append((ctx.job, ctx.scheduled_at))

    for i in range(40):
        make(i)

    async def fast(ctx: JobContext) -> None:
        ran.append((ctx.job, ctx.scheduled_at))

    # Faster than @every allows (1 s at least): built directly, as the burst sees any job.
    registry.add(
        Job(name="fast", func=fast, kind="interval", expression="0.02", takes_context=True)
    )

    clock = ManualClock(T0 + timedelta(seconds=9.4))  # 00:00:09.900
    await start_service(list(registry), clock=clock)
    for step in range(1, 9):  # to 00:00:10.060, one fast slot at a time
        await clock.set(T0 + timedelta(seconds=9.4 + step * 0.02))
        await wait_for(
            lambda: sum(name == "fast" for name, _ in ran) >= step,  # noqa: B023 (awaited now)
            what=f"fast slot {step}",
        )
        await outcomes_written(db, "fast")  # the burst's runs claimed ahead wait for 00:00:10
    await wait_for(lambda: sum(name != "fast" for name, _ in ran) == 40, what="the burst")
    await outcomes_written(db)
    async with db.read() as conn:
        rows = (await conn.execute(select(executions))).all()
    assert {r.status for r in rows} == {"COMPLETED"}, [r for r in rows if r.status != "COMPLETED"]
    slots = [slot for name, slot in ran if name == "fast"]
    assert len(slots) == len(set(slots)) == 8
    assert len(ran) == len(rows) == 48


async def test_misfire_all_under_forbid_runs_every_missed_slot_one_after_another_in_order(
    db: Database, start_service: ServiceFactory
) -> None:
    # Two instances back from the same outage decide the same late slots: neither records one
    # SKIPPED for overlapping the other's catch-up run (9 of 10 were, in issue 25).
    registry = Registry()
    ran: list[tuple[datetime, float, float]] = []  # the job's own record: slot, start, end

    @every(seconds=1, name="each", misfire="all", catchup_window=60, registry=registry)
    async def each(ctx: JobContext) -> None:
        began = time.monotonic()
        await asyncio.sleep(0.05)
        ran.append((ctx.scheduled_at, began, time.monotonic()))

    clock = ManualClock(T0)
    await start_service(list(registry), clock=clock, instance_id="back-a")
    await start_service(list(registry), clock=clock, instance_id="back-b")
    await clock.set(T0 + timedelta(seconds=1))
    await wait_for(lambda: len(ran) == 1, what="the on-time slot :01")
    await outcomes_written(db)
    await clock.set(T0 + timedelta(seconds=12))  # :02 to :11 are late (grace: 1 s)

    late = [datetime.fromisoformat(at(k)) for k in range(2, 12)]
    await wait_for(
        lambda: {slot for slot, _, _ in ran} >= set(late), timeout=20, what="every late slot"
    )
    await outcomes_written(db)
    found = await outcomes(db)
    assert [found[slot.isoformat()] for slot in late] == [("COMPLETED", "catchup")] * 10
    assert "SKIPPED" not in {status for status, _ in found.values()}, sorted(found.items())
    catchups = sorted((r for r in ran if r[0] in late), key=lambda r: r[1])
    assert [slot for slot, _, _ in catchups] == late, "not run in slot order"
    for (_, _, end), (slot, start, _) in itertools.pairwise(catchups):
        assert start >= end, f"{slot} started before the run before it ended"
