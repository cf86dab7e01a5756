"""slotcron.store.retention: history pruned past retention in batches; a slot never reopens."""

from __future__ import annotations

from datetime import timedelta

from slotcron.store import markers, registrations, retention
from slotcron.store.database import Database
from slotcron.store.tables import executions, instances

from tests.store.common import (
    NEXT,
    NOW,
    SLOT,
    add_run,
    job_row,
    markers_of,
    register,
    set_job,
    table_rows,
)

OLD = NOW - timedelta(days=30)


async def test_prune_deletes_old_finished_runs_in_batches_and_stopped_instances(
    db: Database,
) -> None:
    await register(db, "job")
    await set_job(db, "job", last_slot_at=NEXT)
    old = [
        await add_run(db, "job", SLOT - timedelta(minutes=n), status=s, now=OLD)
        for n, s in enumerate(("COMPLETED", "FAILED", "SKIPPED", "MISSED", "STOPPED", "ABANDONED"))
    ]
    running = await add_run(db, "job", SLOT + timedelta(minutes=1), now=OLD)
    queued = await add_run(db, "job", SLOT + timedelta(minutes=2), status="QUEUED", now=OLD)
    recent = await add_run(db, "job", SLOT + timedelta(minutes=3), status="COMPLETED", now=NOW)
    for name, state in (("gone", "stopped"), ("live", "running")):
        await registrations.register_instance(
            db, instance_id=name, host="h", pid=1, version="t", now=OLD
        )
        await registrations.set_instance_state(db, instance_id=name, state=state, now=OLD)

    before = NOW - timedelta(days=1)
    assert await retention.prune(db, before=before, batch=4) == 4
    assert await retention.prune(db, before=before, batch=4) == 2
    assert await retention.prune(db, before=before, batch=4) == 0
    left = [r["id"] for r in await table_rows(db, executions)]
    assert sorted(left) == sorted([running, queued, recent]) and not set(old) & set(left)
    assert [r["instance_id"] for r in await table_rows(db, instances)] == ["live"]
    assert (await job_row(db, "job"))["last_slot_at"] == NEXT, "the slots stay closed"


async def test_prune_markers_deletes_old_markers_of_chunks_not_in_flight(db: Database) -> None:
    await markers.settle(db, ["old", "young", "flying"], now=OLD)
    await add_run(db, "job", start_key="flying", started=False)
    await markers.settle(db, ["new"], now=NOW)
    assert await retention.prune_markers(db, before=NOW - timedelta(days=1)) == 2
    assert [m[0] for m in await markers_of(db)] == ["flying", "new"]
