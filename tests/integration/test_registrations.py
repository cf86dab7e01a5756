"""Job and instance registration across versions of the code (a blue/green overlap)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
import slotcron.service.startup
from slotcron import JobContext
from slotcron.clock import ManualClock
from slotcron.errors import Superseded
from slotcron.jobs.registry import Registry, cron, every
from slotcron.schedule.slots import shared
from slotcron.store import claims as claim_store
from slotcron.store.database import Database
from slotcron.store.operations import list_jobs
from slotcron.store.registrations import JobRow, register_jobs
from slotcron.store.tables import executions, jobs
from sqlalchemy import delete, event, select

from tests.conftest import ServiceFactory, wait_for

T0 = datetime(2026, 11, 22, 0, 0, 0, 500_000, tzinfo=UTC)


async def test_the_newest_registration_of_a_changed_schedule_takes_over_the_cluster_at_once(
    db: Database,
    start_service: ServiceFactory,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Blue fires every 10 s, green (registered after) every 20 s: from green's registration
    on only green's schedule runs. Blue's claims are refused, it stops firing the job (one
    WARNING), and `jobs` shows it superseded while it lives."""
    ran: list[tuple[datetime, str]] = []
    blue_jobs, green_jobs = Registry(), Registry()

    @every(seconds=10, name="report", registry=blue_jobs)
    async def blue(ctx: JobContext) -> None:
        ran.append((ctx.scheduled_at, "blue"))

    @every(seconds=20, name="report", registry=green_jobs)
    async def green(ctx: JobContext) -> None:
        ran.append((ctx.scheduled_at, "green"))

    clock = ManualClock(T0)
    monkeypatch.setattr(slotcron.service.startup, "__version__", "1.0")
    blue_service = await start_service(list(blue_jobs), clock=clock, instance_id="blue")
    monkeypatch.setattr(slotcron.service.startup, "__version__", "2.0")
    green_service = await start_service(list(green_jobs), clock=clock, instance_id="green")

    [record] = await list_jobs(db, now=clock.now(), live_within=60)
    assert record.drift == {"1.0": "every 10s (UTC)", "2.0": "every 20s (UTC)"}
    assert record.superseded == {}  # blue has not noticed yet: it learns at its next claim

    await clock.set(T0 + timedelta(seconds=10))  # blue's slot, refused: blue is superseded
    await wait_for(lambda: blue_service.supersession.superseded == {"report"}, what="blue told")
    for seconds in (20, 30, 40):
        await clock.set(T0 + timedelta(seconds=seconds))
        await wait_for(
            lambda: len(blue_service.runs) == len(green_service.runs) == 0,
            what=f"slot :{seconds} recorded",
        )
        if seconds != 30:
            await wait_for(
                lambda: any(slot.second == seconds for slot, _ in ran),  # noqa: B023 (awaited now)
                what=f"slot :{seconds}",
            )
    assert sorted((slot.second, who) for slot, who in ran) == [(20, "green"), (40, "green")]
    async with db.read() as conn:
        rows = (await conn.execute(select(executions.c.scheduled_at))).scalars().all()
    assert sorted(r.second for r in rows) == [20, 40], "a slot of the old schedule was recorded"
    [record] = await list_jobs(db, now=clock.now(), live_within=60)
    assert record.superseded == {"blue": "every 10s (UTC)"}
    told = [r for r in caplog.records if "stops firing it" in r.getMessage()]
    assert len(told) == 1 and told[0].levelname == "WARNING"


async def test_a_schedule_written_differently_with_the_same_slots_keeps_the_one_in_force(
    db: Database, start_service: ServiceFactory
) -> None:
    """@every(seconds=60) and the cron `* * * * *` place their slots at the same instants: no
    supersession, and each slot still runs once between the two instances."""
    ran: list[tuple[datetime, str]] = []
    interval_jobs, cron_jobs = Registry(), Registry()

    @every(seconds=60, name="minutely", registry=interval_jobs)
    async def by_interval(ctx: JobContext) -> None:
        ran.append((ctx.scheduled_at, "interval"))

    @cron("* * * * *", name="minutely", registry=cron_jobs)
    async def by_cron(ctx: JobContext) -> None:
        ran.append((ctx.scheduled_at, "cron"))

    clock = ManualClock(T0)
    first = await start_service(list(interval_jobs), clock=clock, instance_id="first")
    second = await start_service(list(cron_jobs), clock=clock, instance_id="second")
    assert first.supersession.fingerprints == second.supersession.fingerprints
    for minute in (1, 2, 3):
        await clock.set(T0 + timedelta(minutes=minute))
        await wait_for(lambda: len(ran) == minute, what=f"minute {minute}")  # noqa: B023
        await wait_for(lambda: len(first.runs) == len(second.runs) == 0, what="recorded")
    assert len({slot for slot, _ in ran}) == 3
    assert first.supersession.superseded == second.supersession.superseded == set()


async def test_the_same_text_read_with_other_time_zone_data_is_another_schedule(
    db: Database,
) -> None:
    """Schedules differ by where they place their slots, not by their strings: the same text
    whose zone places 09:00 at another UTC instant (other tzdata; here another zone stands in
    for it) takes over, and a claim presenting the old fingerprint is refused."""
    now = T0

    def row(zone: str) -> JobRow:
        return JobRow(
            name="report",
            kind="cron",
            schedule="0 9 * * *",
            timezone="Europe/Paris",
            options={},
            first_slot=shared("0 9 * * *", zone).next_after(now),
            slots=shared("0 9 * * *", zone),
        )

    old = await register_jobs(db, [row("Europe/Paris")], now=now, instance_id="old", version="1")
    same = await register_jobs(db, [row("Europe/Paris")], now=now, instance_id="also", version="1")
    assert old.took_over == same.took_over == set()
    assert old.fingerprints == same.fingerprints
    new = await register_jobs(db, [row("Europe/London")], now=now, instance_id="new", version="1")
    assert new.took_over == {"report"}
    assert new.fingerprints != old.fingerprints
    slot = shared("0 9 * * *", "Europe/Paris").next_after(now)

    async def claim(fingerprint: str) -> claim_store.Claim:
        return await claim_store.claim_slot(
            db,
            job_name="report",
            slot=slot,
            trigger="cron",
            instance_id="x",
            now=now,
            lease_ms=1000,
            forbid_overlap=False,
            following=slot + timedelta(days=1),
            check_gap=False,
            fingerprint=fingerprint,
        )

    with pytest.raises(Superseded):
        await claim(old.fingerprints["report"])
    claimed = await claim(new.fingerprints["report"])
    assert claimed.status == "RUNNING"


async def test_instances_registering_the_same_new_jobs_at_once_share_one_schedule_in_force(
    db: Database,
) -> None:
    """Two instances starting together on an empty database, each with its own clock: neither
    supersedes the other (the second decides under the lock, finding the first one's row)."""
    names = [f"job-{i}" for i in range(20)]

    def rows(now: datetime) -> list[JobRow]:
        every_minute = shared("* * * * *", "UTC")
        return [
            JobRow(
                name=name,
                kind="cron",
                schedule="* * * * *",
                timezone="UTC",
                options={},
                first_slot=every_minute.next_after(now),
                slots=every_minute,
            )
            for name in names
        ]

    for attempt in range(5):
        a_now, b_now = T0 + timedelta(hours=attempt), T0 + timedelta(hours=attempt, seconds=1)
        a, b = await asyncio.gather(
            register_jobs(db, rows(a_now), now=a_now, instance_id="a", version="1"),
            register_jobs(db, rows(b_now), now=b_now, instance_id="b", version="1"),
        )
        assert a.took_over == b.took_over == set()
        assert a.fingerprints == b.fingerprints
        async with db.transaction() as conn:  # the next attempt starts from no rows again
            await conn.execute(delete(jobs))


async def test_registering_many_jobs_sends_each_write_as_one_statement_with_every_row(
    db: Database,
) -> None:
    """The upserts of a registration are one statement each, made for one row and sent with
    every row's values (executemany): a statement holding 500 rows as values was compiled anew
    for each chunk (most of a 5,000 jobs' start-up: 4.8 s). Every row is written."""
    names = [f"many-{i:03}" for i in range(120)]
    rows = [
        JobRow(name=n, kind="cron", schedule="* * * * *", timezone="UTC", options={"i": n})
        for n in names
    ]
    writes: list[tuple[int, bool]] = []

    def seen(
        _conn: object, _cursor: object, statement: str, params: object, _ctx: object, many: bool
    ) -> None:
        if statement.lstrip().upper().startswith("INSERT INTO SCHEDULER_JOBS"):
            writes.append((len(params) if many else 1, many))  # type: ignore[arg-type]

    engine = db.engine.sync_engine
    event.listen(engine, "before_cursor_execute", seen)
    try:
        await register_jobs(
            db, rows, now=T0, instance_id="a", version="1"
        )  # new: insert, then refresh
        await register_jobs(db, rows, now=T0, instance_id="b", version="1")  # known: refresh only
    finally:
        event.remove(engine, "before_cursor_execute", seen)
    assert writes == [(120, True)] * 3, writes
    async with db.read() as conn:
        stored = (await conn.execute(select(jobs.c.name, jobs.c.options, jobs.c.updated_by))).all()
    assert sorted((r.name, r.options["i"], r.updated_by) for r in stored) == [
        (n, n, "b") for n in names
    ]
