"""slotcron.store.timeline: each job's last slots for the dashboard, and what tells it that
something changed."""

from __future__ import annotations

from datetime import timedelta

from slotcron.store import timeline
from slotcron.store.database import Database
from slotcron.store.tables import executions
from sqlalchemy import update

from tests.store.common import NEXT, NOW, ODD, SLOT, add_run, is_utc, register, set_job


async def test_timelines_show_each_slots_latest_attempt_newest_first(db: Database) -> None:
    await register(db, "job", "Job", first_slot=NEXT)
    await set_job(db, "Job", paused=True)
    slots = [SLOT + timedelta(minutes=n) for n in range(4)]
    for slot in slots:
        await add_run(db, "job", slot, status="COMPLETED")
    retried = await add_run(db, "job", slots[1], status="QUEUED", attempt=2, trigger="retry")
    await add_run(db, "Job", slots[0], status="SKIPPED")
    found = await timeline.timelines(db, ["job", "gone", "Job", "job"], limit=3)
    assert [(t.job, t.known, t.paused, t.next_slot) for t in found] == [
        ("job", True, False, NEXT),
        ("gone", False, False, None),
        ("Job", True, True, NEXT),
    ]
    cells = found[0].cells
    assert [(c.slot, c.status, c.attempt) for c in cells] == [
        (slots[3], "COMPLETED", 1),
        (slots[2], "COMPLETED", 1),
        (slots[1], "QUEUED", 2),
    ]
    assert cells[2].id == retried and cells[2].lag_ms is None
    assert (cells[0].lag_ms, cells[0].duration_ms) == (
        round((NOW - slots[3]).total_seconds() * 1000),
        0,
    )
    assert [c.status for c in found[2].cells] == ["SKIPPED"]
    assert found[1].cells == []


async def test_execution_reads_one_record_by_id(db: Database) -> None:
    run = await add_run(db, "job", ODD, now=ODD)
    record = await timeline.execution(db, run)
    assert record is not None
    assert (record.id, record.job, record.status, record.instance_id) == (
        run,
        "job",
        "RUNNING",
        "a",
    )
    assert record.scheduled_at == ODD and is_utc(record.lease_until)
    assert await timeline.execution(db, run + 1) is None


async def test_change_marker_changes_with_what_the_dashboard_shows(db: Database) -> None:
    await register(db, "job")
    marks = [await timeline.change_marker(db)]
    assert await timeline.change_marker(db) == marks[0], "nothing changed"
    run = await add_run(db, "job")
    marks.append(await timeline.change_marker(db))
    async with db.transaction() as conn:
        await conn.execute(update(executions).values(status="COMPLETED"))
    marks.append(await timeline.change_marker(db))
    await set_job(db, "job", paused=True)
    marks.append(await timeline.change_marker(db))
    await register(db, "other")
    marks.append(await timeline.change_marker(db))
    async with db.transaction() as conn:
        await conn.execute(executions.delete().where(executions.c.id == run))
    marks.append(await timeline.change_marker(db))
    assert len(set(marks)) == len(marks) and all(len(m) == 20 for m in marks)
