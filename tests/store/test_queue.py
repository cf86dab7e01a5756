"""slotcron.store.queue: QUEUED executions, listed fairly and taken once by any live instance."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from slotcron.store import queue
from slotcron.store.database import Database
from slotcron.store.queue import Taken, Wanted
from slotcron.store.tables import executions

from tests.store.common import (
    LEASE,
    LEASE_MS,
    NOW,
    SLOT,
    add_run,
    job_row,
    register,
    run_row,
    table_rows,
)


async def queued(db: Database, job: str, seconds: float, slot_seconds: int = 0) -> int:
    """A run of ``job`` queued to be available ``seconds`` after NOW."""
    when = NOW + timedelta(seconds=seconds)
    slot = SLOT + timedelta(seconds=slot_seconds)
    return await add_run(db, job, slot, status="QUEUED", trigger="manual", available_at=when)


async def test_due_lists_oldest_first_at_most_per_job_and_pages_by_key(db: Database) -> None:
    many = [await queued(db, "many", n * 0.001, n) for n in range(5)]
    other = await queued(db, "other", 0.0025)
    upper = await queued(db, "Other", 0.0035)
    await queued(db, "later", 60)
    due = await queue.due(db, now=NOW + timedelta(seconds=1))
    assert [(q.execution_id, q.job_name) for q in due] == [
        (many[0], "many"),
        (many[1], "many"),
        (many[2], "many"),
        (other, "other"),
        (upper, "Other"),
    ]
    assert due[0].available_at == NOW
    # Keyset pages of two: each page starts after the last row of the previous one.
    pages: list[list[int]] = []
    after = queue.BEGINNING
    while page := await queue.due(db, now=NOW + timedelta(seconds=1), limit=2, after=after):
        pages.append([q.execution_id for q in page])
        after = (page[-1].available_at, page[-1].execution_id)
    assert pages == [[many[0], many[1]], [many[2], other], [upper]]
    assert await queue.due(db, now=NOW - timedelta(seconds=1)) == []


async def test_settle_queued_and_settle_orphans_record_runs_nobody_will_take(
    db: Database,
) -> None:
    await register(db, "kept")
    kept = await queued(db, "kept", 0)
    gone = [await queued(db, "gone", 0, n) for n in range(2)]
    upper = await queued(db, "Gone", 0)
    running = await add_run(db, "gone", SLOT + timedelta(minutes=5))
    settled = await queue.settle_orphans(db, ["kept", "gone", "Gone", "never"], now=NOW)
    assert settled == {"gone": 2, "Gone": 1, "never": 0}
    assert await queue.settle_orphans(db, [], now=NOW) == {}
    rows = {r["id"]: r for r in await table_rows(db, executions)}
    for execution_id in (*gone, upper):
        assert (rows[execution_id]["status"], rows[execution_id]["error"]) == (
            "SKIPPED",
            queue.REMOVED,
        )
        assert rows[execution_id]["finished_at"] == NOW
    assert (rows[kept]["status"], rows[running]["status"]) == ("QUEUED", "RUNNING")
    async with db.transaction() as conn:
        assert await queue.settle_queued(conn, "kept", now=NOW) == 1
        assert await queue.settle_queued(conn, "kept", now=NOW) == 0
    assert (await run_row(db, kept))["status"] == "SKIPPED"


async def test_queued_count_counts_a_jobs_waiting_runs_up_to_a_bound(db: Database) -> None:
    for n in range(4):
        await queued(db, "job", 0, n)
    await queued(db, "Job", 0)
    await add_run(db, "job", SLOT + timedelta(minutes=1))
    async with db.read() as conn:
        assert await queue.queued_count(conn, "job", at_most=10) == 4
        assert await queue.queued_count(conn, "job", at_most=3) == 3
        assert await queue.queued_count(conn, "Job", at_most=10) == 1
        assert await queue.queued_count(conn, "nobody", at_most=10) == 0


def wanted(execution_id: int, job: str, forbid: bool = True) -> Wanted:
    return Wanted(execution_id, job, LEASE_MS, forbid)


async def test_take_many_starts_one_queued_run_per_job_and_advances_its_token(
    db: Database,
) -> None:
    await register(db, "a", "b", "held")
    first, second = await queued(db, "a", 0, 0), await queued(db, "a", 0, 1)
    other = await queued(db, "b", 0)
    held = await queued(db, "held", 0)
    holder = await add_run(db, "held", SLOT - timedelta(minutes=1), instance="x")
    async with db.transaction() as conn:
        await conn.execute(
            executions.update().where(executions.c.id == first).values(params={"p": 1})
        )
    taken = await queue.take_many(
        db,
        [wanted(first, "a"), wanted(second, "a"), wanted(other, "b"), wanted(held, "held")],
        instance_id="me",
        now=NOW,
    )
    assert sorted(c.execution_id for c in taken.claims) == [first, other]
    assert taken.busy == [] and taken.held == {held: NOW + LEASE}
    claim = next(c for c in taken.claims if c.execution_id == first)
    assert (claim.status, claim.fencing_token, claim.started, claim.params) == (
        "RUNNING",
        1,
        False,
        {"p": 1},
    )
    assert (claim.lease_until, claim.trigger, claim.attempt) == (NOW + LEASE, "manual", 1)
    row = await run_row(db, first)
    assert (row["status"], row["instance_id"], row["started_at"], row["heartbeat_at"]) == (
        "RUNNING",
        "me",
        None,
        NOW,
    )
    assert (await job_row(db, "a"))["fencing_token"] == 1
    assert (await run_row(db, second))["status"] == "QUEUED"
    assert (await run_row(db, held))["status"] == "QUEUED"
    assert (await run_row(db, holder))["status"] == "RUNNING"
    assert await queue.take_many(db, [], instance_id="me", now=NOW) == Taken()


async def test_a_queued_run_is_taken_once_whoever_asks(db: Database) -> None:
    await register(db, "job")
    run = await queued(db, "job", 0)
    outcomes = await asyncio.gather(
        *(
            queue.take_many(db, [wanted(run, "job", False)], instance_id=f"i{n}", now=NOW)
            for n in range(4)
        )
    )
    winners = [f"i{n}" for n, taken in enumerate(outcomes) if taken.claims]
    assert len(winners) == 1, outcomes
    # The others found it taken (absent) or its job's row locked by the winner (busy).
    assert all(w.execution_id == run for taken in outcomes for w in taken.busy)
    row = await run_row(db, run)
    assert (row["status"], row["instance_id"]) == ("RUNNING", winners[0])
    assert (await job_row(db, "job"))["fencing_token"] == 1
