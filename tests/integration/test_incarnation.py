"""A process that resumes after another took its instance id over (issue 11): its heartbeat
notices that the instance row names another incarnation, renews nothing, fences every run it
holds and says so at ERROR. Real databases, the manual clock."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import pytest
from sqlalchemy import select

from app.clock import ManualClock
from app.heartbeat import Heartbeat
from app.inflight import CancelReason, Runs
from app.roles import Collaborators
from app.store.database import Database
from app.store.lifeline import hold_instance_id
from app.store.tables import instances
from tests.test_fencing import handle

LAPSE = 3.0
ID = "shared-id"


async def taken_over(db: Database, clock: ManualClock) -> tuple[str, str]:
    """The old process's incarnation and the one that took the id after it fell silent."""
    old = await hold_instance_id(db, instance_id=ID, lapse=LAPSE, clock=clock)
    await clock.advance(LAPSE + 1)  # the old process is paused past the lapse
    new = await hold_instance_id(db, instance_id=ID, lapse=LAPSE, clock=clock)
    assert new != old
    return old, new


def heartbeat(db: Database, clock: ManualClock, runs: Runs, incarnation: str) -> Heartbeat:
    beat = Heartbeat(
        Collaborators(db=db, clock=clock, instance_id=ID),
        runs=runs,
        period=0.5,
        instance_state=lambda: "running",
    )
    beat.incarnation = incarnation
    return beat


async def heartbeat_at(db: Database) -> datetime:
    async with db.read() as conn:
        value = (
            await conn.execute(
                select(instances.c.heartbeat_at).where(instances.c.instance_id == ID)
            )
        ).scalar_one()
    assert isinstance(value, datetime)
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


@pytest.mark.parametrize("backend", ["sqlite", "postgresql", "mariadb"], indirect=True)
async def test_a_superseded_incarnation_fences_all_its_runs_and_logs_an_error(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock(datetime(2030, 1, 1, tzinfo=UTC))
    old, _ = await taken_over(db, clock)
    runs = Runs()
    run = handle(60_000, clock.monotonic())  # a long lease: not fenced by time
    runs.add(run)
    resumed = heartbeat(db, clock, runs, old)
    with caplog.at_level(logging.ERROR, logger="slotcron.heartbeat"):
        await resumed.beat()
        await resumed.beat()
    assert run.cancel_reason is CancelReason.FENCED and run.lease_lost.is_set()
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "held by another process" in errors[0], errors  # logged once
    assert resumed.superseded


@pytest.mark.parametrize("backend", ["sqlite", "postgresql", "mariadb"], indirect=True)
async def test_only_the_incarnation_holding_the_id_renews_its_row(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock(datetime(2030, 1, 1, tzinfo=UTC))
    old, new = await taken_over(db, clock)
    taken_at = await heartbeat_at(db)
    await clock.advance(1)
    with caplog.at_level(logging.ERROR, logger="slotcron.heartbeat"):
        await heartbeat(db, clock, Runs(), old).beat()
    assert await heartbeat_at(db) == taken_at, "the superseded process renewed the row"
    assert any(r.levelno == logging.ERROR for r in caplog.records)
    caplog.clear()
    holder = heartbeat(db, clock, Runs(), new)
    with caplog.at_level(logging.ERROR, logger="slotcron.heartbeat"):
        await holder.beat()
    assert await heartbeat_at(db) > taken_at
    assert not holder.superseded and not caplog.records
