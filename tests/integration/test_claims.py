"""The claim transaction on every backend: one slot, one decision, whoever asks."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from slotcron.clock import SystemClock
from slotcron.engine.claims import Claimer
from slotcron.errors import RowBusy, SlotsUndecided, SlotTaken
from slotcron.jobs.registry import Registry, cron
from slotcron.lifeline.roles import Collaborators
from slotcron.store import claims as claim_store
from slotcron.store import registrations
from slotcron.store.database import Database
from slotcron.store.registrations import JobRow
from slotcron.store.tables import executions, jobs
from sqlalchemy import insert, select, text

SLOT = datetime(2026, 11, 22, 0, 10, tzinfo=UTC)
NOW = SLOT + timedelta(milliseconds=3)


async def register(db: Database, name: str = "job") -> None:
    await registrations.register_jobs(
        db,
        [JobRow(name=name, kind="cron", schedule="* * * * *", timezone="UTC", options={})],
        now=NOW,
        instance_id="test",
        version="test",
    )


async def claim(
    db: Database,
    slot: datetime = SLOT,
    *,
    forbid: bool = True,
    now: datetime = NOW,
    instance: str = "a",
) -> claim_store.Claim:
    return await claim_store.claim_slot(
        db,
        job_name="job",
        slot=slot,
        trigger="cron",
        instance_id=instance,
        now=now,
        lease_ms=60_000,
        forbid_overlap=forbid,
        following=slot + timedelta(minutes=1),
    )


async def statuses(db: Database) -> list[tuple[str, str]]:
    async with db.read() as conn:
        rows = await conn.execute(
            select(executions.c.scheduled_at, executions.c.status).order_by(executions.c.id)
        )
        return [(r.scheduled_at.isoformat(), r.status) for r in rows]


async def test_a_slot_is_claimed_once_and_a_second_claim_loses(db: Database) -> None:
    await register(db)
    first = await claim(db)
    assert first.status == "RUNNING"
    assert first.lease_until == NOW + timedelta(seconds=60)
    with pytest.raises(SlotTaken):
        await claim(db, instance="b")
    assert await statuses(db) == [(SLOT.isoformat(), "RUNNING")]


async def test_a_late_claimer_cannot_reopen_an_older_slot(db: Database) -> None:
    await register(db)
    await claim(db, SLOT, forbid=False)
    with pytest.raises(SlotTaken):
        await claim(db, SLOT - timedelta(minutes=1), forbid=False, instance="late")


async def test_the_unique_key_stops_a_duplicate_the_high_water_mark_missed(db: Database) -> None:
    await register(db)
    async with db.transaction() as conn:
        await conn.execute(
            insert(executions).values(
                job_name="job",
                scheduled_at=SLOT,
                trigger="cron",
                status="COMPLETED",
                attempt=1,
                created_at=NOW,
            )
        )
    with pytest.raises(SlotTaken):
        await claim(db)


async def test_a_paused_job_records_its_slot_skipped_with_the_reason(db: Database) -> None:
    await register(db)
    async with db.transaction() as conn:
        await conn.execute(jobs.update().values(paused=True, paused_reason="maintenance"))
    result = await claim(db)
    assert result.status == "SKIPPED"
    assert result.reason == "job is paused: maintenance"
    with pytest.raises(SlotTaken):
        await claim(db)


async def test_forbid_skips_a_slot_while_the_previous_run_holds_its_lease(db: Database) -> None:
    await register(db)
    await claim(db)
    second = await claim(db, SLOT + timedelta(minutes=1), now=NOW + timedelta(seconds=30))
    assert second.status == "SKIPPED"
    assert second.reason is not None and "still running" in second.reason


async def test_forbid_runs_the_slot_once_the_previous_lease_has_lapsed(db: Database) -> None:
    await register(db)
    await claim(db)
    later = NOW + timedelta(seconds=61)
    second = await claim(db, SLOT + timedelta(minutes=1), now=later)
    assert second.status == "RUNNING"


async def test_allow_runs_overlapping_slots(db: Database) -> None:
    await register(db)
    await claim(db, forbid=False)
    second = await claim(db, SLOT + timedelta(minutes=1), forbid=False)
    assert second.status == "RUNNING"


async def hold_job_row(
    db: Database,
    backend: str,
    held: asyncio.Event,
    release: asyncio.Event,
    name: str | None = None,
) -> None:
    """Lock the job rows (only ``name``'s, when given; SQLite: the write lock) from another
    connection until released."""
    async with db.engine.connect() as conn:
        if backend == "sqlite":
            async with conn.begin():  # BEGIN IMMEDIATE: takes the database's write lock
                held.set()
                await release.wait()
        else:
            async with conn.begin():
                only = "" if name is None else " WHERE name = :name"
                await conn.execute(
                    text(f"SELECT name FROM scheduler_jobs{only} FOR UPDATE"), {"name": name}
                )
                held.set()
                await release.wait()


async def test_nowait_refuses_at_once_while_another_claimer_holds_the_row(
    db: Database, backend: str
) -> None:
    await register(db)
    held, release = asyncio.Event(), asyncio.Event()
    holder = asyncio.create_task(hold_job_row(db, backend, held, release))
    await held.wait()
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(RowBusy):
        await claim(db)
    refused_after = loop.time() - started
    release.set()
    await holder
    assert refused_after < 1.0, f"NOWAIT waited {refused_after:.2f} s for the lock"


async def test_a_slot_whose_row_was_busy_is_still_claimed(db: Database, backend: str) -> None:
    await register(db)
    registry = Registry()

    @cron("* * * * *", name="job", registry=registry)
    async def job() -> None: ...

    claimer = Claimer(Collaborators(db=db, clock=SystemClock(), instance_id="a"), default_lease=60)
    held, release = asyncio.Event(), asyncio.Event()
    holder = asyncio.create_task(hold_job_row(db, backend, held, release))
    await held.wait()
    registered = registry.get("job")
    assert registered is not None
    claiming = asyncio.create_task(claimer.claim(registered, SLOT, trigger="cron", following=SLOT))
    await asyncio.sleep(0.3)
    assert not claiming.done(), "the claimer gave up on a busy row instead of retrying"
    release.set()
    await holder
    result = await asyncio.wait_for(claiming, 5)
    assert result is not None and result.status == "RUNNING"
    assert claimer.stats.busy_retries > 0
    assert await statuses(db) == [(SLOT.isoformat(), "RUNNING")]


async def test_a_claim_that_finds_earlier_slots_undecided_says_so_and_records_nothing(
    db: Database,
) -> None:
    await register(db)
    await claim(db, forbid=False)  # the job now expects SLOT + 1 min next
    with pytest.raises(SlotsUndecided) as gap:
        await claim(db, SLOT + timedelta(minutes=3), forbid=False)
    assert gap.value.expected == SLOT + timedelta(minutes=1)
    assert await statuses(db) == [(SLOT.isoformat(), "RUNNING")]
