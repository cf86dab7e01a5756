"""slotcron.engine.late_claims: claims found late decided together, said in one line a write."""

from __future__ import annotations

import asyncio
import logging

import pytest
from slotcron.clock import ManualClock
from slotcron.engine.late_claims import NO_CAPACITY, SAID_ONE_BY_ONE, LateClaims
from slotcron.status import Status
from slotcron.store.claims import Claim
from slotcron.store.database import Database
from sqlalchemy import event

from tests.store.common import LEASE, LEASE_MS, NOW, SLOT, add_run, run_row

pytestmark = pytest.mark.timeout(60)

LATER = NOW + 2 * LEASE / LEASE.total_seconds()  # two seconds on: past a one-second grace


def claim(execution_id: int, job: str) -> Claim:
    return Claim(
        execution_id=execution_id,
        job_name=job,
        scheduled_at=SLOT,
        trigger="cron",
        status=Status.RUNNING,
        attempt=1,
        lease_until=NOW + LEASE,
        lease_ms=LEASE_MS,
    )


def count_transactions(db: Database) -> list[int]:
    begun = [0]

    def began(_conn: object) -> None:
        begun[0] += 1

    event.listen(db.engine.sync_engine, "begin", began)
    return begun


async def test_many_late_claims_are_decided_in_one_transaction_each_told_its_own_fate(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    names = [f"job-{i}" for i in range(40)]
    ids = [await add_run(db, name) for name in names]
    fenced = await add_run(db, "fenced", instance="b")  # no longer ours: not decided
    late = LateClaims(db, ManualClock(LATER), "a")
    begun = count_transactions(db)
    caplog.set_level(logging.WARNING, "slotcron.scheduler")

    results = await asyncio.gather(
        *(
            late.decide(claim(i, n), "too late" if k % 2 else None)
            for k, (i, n) in enumerate(zip(ids, names, strict=True))
        ),
        late.decide(claim(fenced, "fenced"), "too late"),
    )

    assert results == [True] * 40 + [False]
    assert begun[0] == 1
    for k, execution_id in enumerate(ids):
        row = await run_row(db, execution_id)
        if k % 2:
            assert (row["status"], row["error"], row["finished_at"]) == (
                "MISSED",
                "too late",
                LATER,
            )
        else:
            assert (row["status"], row["trigger"]) == ("RUNNING", "catchup")
    assert (await run_row(db, fenced))["status"] == "RUNNING"
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1, lines
    assert lines[0].startswith("40 slots of 40 jobs were claimed 2.0-2.0 s after their time")
    assert "20 recorded MISSED, 20 run as catch-ups" in lines[0]


async def test_a_few_late_claims_are_said_one_by_one_and_no_capacity_says_why(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    ids = [await add_run(db, f"job-{i}") for i in range(SAID_ONE_BY_ONE)]
    late = LateClaims(db, ManualClock(LATER), "a")
    caplog.set_level(logging.WARNING, "slotcron.scheduler")
    await asyncio.gather(
        late.decide(claim(ids[0], "job-0"), "misfire: not claimed until 2.0 s after its time"),
        *(
            late.decide(claim(i, f"job-{k}"), "no capacity: 3 runs in flight", NO_CAPACITY)
            for k, i in enumerate(ids[1:], start=1)
        ),
    )
    lines = sorted(r.getMessage() for r in caplog.records)
    assert len(lines) == SAID_ONE_BY_ONE
    assert lines[0].startswith("job-0 slot ") and "claimed 2.0 s after its time" in lines[0]
    assert all("MISSED: no capacity: 3 runs in flight" in line for line in lines[1:])


async def test_a_database_error_reaches_every_claim_of_that_write_and_the_next_write_is_made(
    db: Database,
) -> None:
    first, second = await add_run(db, "first"), await add_run(db, "second")
    late = LateClaims(db, ManualClock(LATER), "a")
    failing = [True]

    def fail_once(_conn: object) -> None:
        if failing[0]:
            failing[0] = False
            raise ConnectionError("the database went away")

    event.listen(db.engine.sync_engine, "begin", fail_once)
    results = await asyncio.gather(
        late.decide(claim(first, "first"), "too late"),
        late.decide(claim(second, "second"), "too late"),
        return_exceptions=True,
    )
    assert [type(r) for r in results] == [ConnectionError, ConnectionError]
    assert (await run_row(db, first))["status"] == "RUNNING"
    assert await late.decide(claim(first, "first"), "too late")
    assert (await run_row(db, first))["status"] == "MISSED"


async def test_a_cancelled_waiter_cancels_only_its_own_wait(db: Database) -> None:
    first, second = await add_run(db, "first"), await add_run(db, "second")
    late = LateClaims(db, ManualClock(LATER), "a")
    waiter = asyncio.create_task(late.decide(claim(first, "first"), "too late"))
    other = asyncio.create_task(late.decide(claim(second, "second"), "too late"))
    await asyncio.sleep(0)
    waiter.cancel()
    assert await other
    for execution_id in (first, second):  # the write was made for both
        assert (await run_row(db, execution_id))["status"] == "MISSED"


async def test_a_writer_cancelled_fails_every_claim_waiting_none_is_left_hanging(
    db: Database,
) -> None:
    first, second = await add_run(db, "first"), await add_run(db, "second")
    late = LateClaims(db, ManualClock(LATER), "a")
    waiting = [
        asyncio.create_task(late.decide(claim(first, "first"), "too late")),
        asyncio.create_task(late.decide(claim(second, "second"), "too late")),
    ]
    await asyncio.sleep(0)
    assert late._writer is not None
    late._writer.cancel()
    done, pending = await asyncio.wait(waiting, timeout=5)
    assert not pending
    assert all(t.cancelled() for t in done)  # what shutdown would do to them anyway
