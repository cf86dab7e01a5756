"""slotcron.store.counted on every backend: completed runs of a job with ``max_runs`` counted in
the transaction that records them, a slot that could make one more recorded SKIPPED while runs
are in flight, nothing recorded once they are done."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from slotcron.errors import RunsExhausted
from slotcron.store import claims as claim_store
from slotcron.store import counted
from slotcron.store import runs as run_store
from slotcron.store.database import Database
from slotcron.store.tables import executions, jobs
from sqlalchemy import func, select

from tests.integration.test_batch_claims import register
from tests.store.test_skips import MINUTE, SLOT
from tests.store.test_skips import claim as claim_slot


async def claim(db: Database, k: int) -> claim_store.Claim:
    return await claim_slot(db, SLOT + k * MINUTE, max_runs=2)


async def completed(db: Database, job: str = "job") -> int:
    async with db.read() as conn:
        query = select(jobs.c.runs_completed).where(jobs.c.name == job)
        return int((await conn.execute(query)).scalar_one())


async def test_completed_runs_are_counted_and_the_last_slots_are_refused(db: Database) -> None:
    await register(db, ["job"])
    first, second = await claim(db, 0), await claim(db, 1)
    assert (first.status, second.status) == ("RUNNING", "RUNNING")
    while_running = await claim(db, 2)
    assert (while_running.status, while_running.reason) == (
        "SKIPPED",
        "max_runs=2: 0 completed and 2 in flight, which may complete",
    )
    assert await run_store.finish(
        db,
        run=first.key,
        instance_id="me",
        status="COMPLETED",
        now=SLOT,
        error=None,
        counted={"job"},
    )
    assert await completed(db) == 1
    await run_store.finish_many(
        db, [(second.key, "FAILED", "boom")], instance_id="me", now=SLOT, counted={"job"}
    )
    assert await completed(db) == 1, "a failed run is not counted"
    last = await claim(db, 3)
    recorded = await run_store.finish_many(
        db, [(last.key, "COMPLETED", None)], instance_id="me", now=SLOT, counted={"job"}
    )
    assert recorded == {last.execution_id} and await completed(db) == 2
    with pytest.raises(RunsExhausted, match="2 runs completed"):
        await claim(db, 4)
    async with db.read() as conn:
        rows = (await conn.execute(select(func.count()).select_from(executions))).scalar_one()
    assert rows == 4, "nothing recorded once the runs are done"


async def test_a_job_not_counted_is_not_counted(db: Database) -> None:
    await register(db, ["job"])
    run = await claim(db, 0)
    await run_store.finish(
        db, run=run.key, instance_id="me", status="COMPLETED", now=SLOT, error=None
    )
    assert await completed(db) == 0


async def test_only_the_counted_jobs_runs_are_counted_each_once(db: Database) -> None:
    await register(db, ["a", "b"])
    async with db.transaction() as conn:
        await counted.count_completed(conn, ["a", "b", "a"], {"a"})
        await counted.count_completed(conn, ["b"], ())
    assert (await completed(db, "a"), await completed(db, "b")) == (2, 0)


async def test_room_for_one_counts_the_runs_in_flight(db: Database) -> None:
    await register(db, ["job"])
    await claim(db, 0)
    row = SimpleNamespace(runs_completed=1)
    async with db.read() as conn:
        assert await counted.room_for_one(conn, row, "job", 3) is None
        assert await counted.room_for_one(conn, row, "job", 2) == (
            "max_runs=2: 1 completed and 1 in flight, which may complete"
        )
    counted.exhausted(row, "job", 2)
    counted.exhausted(row, "job", None)
    with pytest.raises(RunsExhausted, match="1 runs completed"):
        counted.exhausted(row, "job", 1)
