"""slotcron.store.backfills and backfill_slots on every backend: which slots a backfill runs
(never a completed one, never one in flight, never the live schedule's), its cursor moved only
from where it was read, its progress, cancelling, and bad requests refused writing nothing."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from slotcron.errors import NotFound, Refused, UsageError
from slotcron.store import backfill_slots, backfills, skips
from slotcron.store import claims as claim_store
from slotcron.store import runs as run_store
from slotcron.store.database import Database
from slotcron.store.tables import backfills as backfill_rows
from slotcron.store.tables import executions, jobs
from sqlalchemy import func, select, update

from tests.integration.test_batch_claims import register
from tests.store.test_skips import MINUTE, SLOT, claim

NOW = SLOT + 10 * MINUTE
LONG_AGO = NOW - timedelta(days=365)  # nothing pruned: every slot's row is still there


async def history_of(db: Database) -> list[tuple[datetime, int, str, str]]:
    async with db.read() as conn:
        rows = await conn.execute(
            select(
                executions.c.scheduled_at,
                executions.c.attempt,
                executions.c.status,
                executions.c.trigger,
            )
            .where(executions.c.job_name == "job")
            .order_by(executions.c.scheduled_at, executions.c.attempt)
        )
        return [(r.scheduled_at, r.attempt, r.status, r.trigger) for r in rows]


async def ran_some(db: Database) -> list[claim_store.Claim]:
    """``job`` (every minute, registered just after SLOT) decided SLOT .. SLOT+4: completed,
    failed, running, completed, skipped by an operator."""
    await register(db, ["job"])
    await skips.skip(db, job="job", at=SLOT + 4 * MINUTE, reason="audit", now=SLOT)
    claims = [await claim(db, SLOT + i * MINUTE) for i in range(5)]
    for i, status in ((0, "COMPLETED"), (1, "FAILED"), (3, "COMPLETED")):
        assert await run_store.finish(
            db, run=claims[i].key, instance_id="me", status=status, now=NOW, error=None
        )
    return claims


async def step_all(
    db: Database, backfill: backfills.Backfill, budget: int = 100
) -> backfill_slots.Stepped:
    slots = list(await _slots(db, backfill))
    assert backfill.next_at is not None
    return await backfill_slots.step(
        db,
        backfill.id,
        cursor=backfill.next_at,
        slots=slots,
        following=None,
        budget=budget,
        now=NOW,
        kept_since=LONG_AGO,
    )


async def _slots(db: Database, backfill: backfills.Backfill) -> list[datetime]:
    assert backfill.next_at is not None
    count = int((backfill.end - backfill.next_at) / MINUTE)
    return [backfill.next_at + i * MINUTE for i in range(count)]


async def test_a_backfill_runs_each_slot_that_never_completed_and_nothing_else(
    db: Database,
) -> None:
    claims = await ran_some(db)
    start, end = SLOT - 3 * MINUTE, SLOT + 7 * MINUTE
    expected = [SLOT - 3 * MINUTE, SLOT - 2 * MINUTE, SLOT - MINUTE, SLOT + MINUTE]
    assert (
        await backfills.would_run(db, job="job", start=start, end=end, now=NOW, kept_since=LONG_AGO)
        == expected
    )
    async with db.read() as conn:
        known = await backfill_slots.history(conn, "job", [SLOT, SLOT + MINUTE], lock=False)
    assert known is not None
    assert [a.status for a in known.attempts[SLOT + MINUTE]] == ["FAILED"]
    assert known.skipped == set() and known.last_slot_at == SLOT + 4 * MINUTE
    made = await backfills.create(db, job="job", start=start, end=end, rate=None, now=NOW)
    assert (made.total, made.rate, made.next_at) == (10, backfills.DEFAULT_RATE, start)
    stepped = await step_all(db, made)
    assert stepped == backfill_slots.Stepped(
        queued=expected,
        passed={"completed": 1},
        moved=True,
        waiting="in flight",
        at=SLOT + 2 * MINUTE,
    ), "the cursor stops at the slot in flight"
    queued = [r for r in await history_of(db) if r[3] == "backfill"]
    assert queued == [
        (SLOT - 3 * MINUTE, 1, "QUEUED", "backfill"),
        (SLOT - 2 * MINUTE, 1, "QUEUED", "backfill"),
        (SLOT - MINUTE, 1, "QUEUED", "backfill"),
        (SLOT + MINUTE, 2, "QUEUED", "backfill"),  # the failed slot's next attempt
    ]
    (waiting,) = await backfills.active(db)
    assert await step_all(db, waiting) == backfill_slots.Stepped(
        moved=True, waiting="in flight", at=SLOT + 2 * MINUTE
    ), "still in flight: nothing written"
    assert await run_store.finish(
        db, run=claims[2].key, instance_id="me", status="ABANDONED", now=NOW, error=None
    )
    stepped = await step_all(db, waiting)
    assert stepped == backfill_slots.Stepped(
        queued=[SLOT + 2 * MINUTE],
        passed={"completed": 1, "skipped": 1},
        moved=True,
        waiting="live",
        at=SLOT + 5 * MINUTE,
    ), "an abandoned slot runs; the cursor stops where the live schedule has not decided"
    (listed,) = await backfills.listing(db)
    assert (listed.seen, listed.queued, listed.passed, listed.in_flight, listed.next_at) == (
        8,
        5,
        3,
        5,
        SLOT + 5 * MINUTE,
    )
    assert listed.left == 7
    assert (
        await backfills.would_run(db, job="job", start=start, end=end, now=NOW, kept_since=LONG_AGO)
        == []
    ), "queued slots are in flight: a second backfill would not run them"


async def test_a_request_lists_the_slots_it_would_run_or_makes_the_backfill(db: Database) -> None:
    await register(db, ["job"])
    ask = dict(job="job", start=SLOT - 2 * MINUTE, end=SLOT, rate=None, now=NOW, retention_days=30)
    dry = await backfills.request(db, dry_run=True, **ask)  # type: ignore[arg-type]
    assert dry == {
        "job": "job",
        "from": "2026-11-22T00:08:00Z",
        "to": "2026-11-22T00:10:00Z",
        "dry_run": True,
        "count": 2,
        "slots": ["2026-11-22T00:08:00Z", "2026-11-22T00:09:00Z"],
    }
    assert await backfills.listing(db) == [], "a dry run writes nothing"
    made = await backfills.request(db, dry_run=False, **ask)  # type: ignore[arg-type]
    assert (made["slots"], made["status"], made["left"], made["rate"]) == (2, "RUNNING", 2, 10.0)
    assert [b.id for b in await backfills.listing(db, job="job")] == [made["id"]]
    assert await backfills.listing(db, job="other") == []


async def test_a_step_moves_the_cursor_only_from_where_it_was_read_and_within_its_budget(
    db: Database,
) -> None:
    await register(db, ["job"])
    start = SLOT - 6 * MINUTE
    made = await backfills.create(db, job="job", start=start, end=SLOT, rate=0, now=NOW)
    stepped = await step_all(db, made, budget=2)
    assert stepped == backfill_slots.Stepped(queued=[start, start + MINUTE], moved=True)
    stale = await step_all(db, made)
    assert stale == backfill_slots.Stepped(), "a step from a cursor that moved changes nothing"
    (now,) = await backfills.active(db)
    assert (now.next_at, now.in_flight, now.seen) == (start + 2 * MINUTE, 2, 2)
    assert len(await history_of(db)) == 2


async def test_a_paused_job_waits_and_a_removed_one_ends_its_backfill(db: Database) -> None:
    await register(db, ["job"])
    made = await backfills.create(db, job="job", start=SLOT - MINUTE, end=SLOT, rate=1, now=NOW)
    async with db.transaction() as conn:
        await conn.execute(update(jobs).where(jobs.c.name == "job").values(paused=True))
    assert await step_all(db, made) == backfill_slots.Stepped(paused=True)
    with pytest.raises(Refused, match="paused"):
        await backfills.create(db, job="job", start=SLOT - MINUTE, end=SLOT, rate=1, now=NOW)
    async with db.transaction() as conn:
        await conn.execute(jobs.delete().where(jobs.c.name == "job"))
    assert (await step_all(db, made)).moved
    (ended,) = await backfills.listing(db)
    assert (ended.status, ended.note) == ("CANCELLED", backfill_slots.GONE)
    assert await history_of(db) == []


async def test_a_slot_whose_row_may_have_been_pruned_is_not_run(db: Database) -> None:
    await register(db, ["job"])  # registered just after SLOT: slots before it never ran
    await claim(db, SLOT + 2 * MINUTE)
    made = await backfills.create(
        db, job="job", start=SLOT - MINUTE, end=SLOT + 2 * MINUTE, rate=0, now=NOW
    )
    assert made.next_at is not None
    stepped = await backfill_slots.step(
        db,
        made.id,
        cursor=made.next_at,
        slots=[SLOT - MINUTE, SLOT, SLOT + MINUTE],
        following=None,
        budget=10,
        now=NOW,
        kept_since=SLOT + 30 * MINUTE,  # the history kept starts after these slots
    )
    assert stepped.queued == [SLOT - MINUTE, SLOT], "before the job existed: they never ran"
    assert stepped.passed == {"history pruned": 1}


async def test_cancelling_settles_the_queued_runs_and_completing_waits_for_the_runs(
    db: Database,
) -> None:
    await register(db, ["job"])
    made = await backfills.create(db, job="job", start=SLOT - 2 * MINUTE, end=SLOT, rate=0, now=NOW)
    await step_all(db, made)
    assert not await backfills.complete(db, made.id, now=NOW), "two runs are queued"
    assert await backfills.cancel(db, made.id, now=NOW) == 2
    assert [r[2] for r in await history_of(db)] == ["SKIPPED", "SKIPPED"]
    (cancelled,) = await backfills.listing(db)
    assert (cancelled.status, cancelled.left, cancelled.in_flight) == ("CANCELLED", 0, 0)
    with pytest.raises(Refused, match="already CANCELLED"):
        await backfills.cancel(db, made.id, now=NOW)
    with pytest.raises(NotFound, match="no backfill with id 999"):
        await backfills.cancel(db, 999, now=NOW)
    other = await backfills.create(
        db, job="job", start=SLOT - 4 * MINUTE, end=SLOT - 3 * MINUTE, rate=0, now=NOW
    )
    await step_all(db, other)
    async with db.transaction() as conn:
        await conn.execute(
            update(executions)
            .where(executions.c.backfill_id == other.id)
            .values(status="COMPLETED", started_at=NOW, finished_at=NOW + timedelta(seconds=3))
        )
    assert await backfills.complete(db, other.id, now=NOW)
    listed = {b.id: b for b in await backfills.listing(db)}
    assert (listed[other.id].status, listed[other.id].done) == ("COMPLETED", 1)
    assert await backfill_slots.longest_recent_run(db, "job") == 3.0
    assert await backfills.active(db) == []


async def test_bad_requests_are_refused_and_write_nothing(db: Database) -> None:
    await register(db, ["job"])
    with pytest.raises(UsageError, match="is not after --from"):
        backfills.check_request(SLOT, SLOT, None)
    with pytest.raises(UsageError, match="--rate must be between 0"):
        backfills.check_request(SLOT - MINUTE, SLOT, -1)
    with pytest.raises(UsageError, match="--rate must be between 0"):
        backfills.check_rate(float("inf"))
    assert backfills.check_rate(0) == 0
    with pytest.raises(UsageError, match="more than 100000 slots"):
        await backfills.create(
            db, job="job", start=SLOT - timedelta(days=100), end=SLOT, rate=None, now=NOW
        )
    with pytest.raises(NotFound, match="no job named 'nope'"):
        await backfills.create(db, job="nope", start=SLOT - MINUTE, end=SLOT, rate=None, now=NOW)
    async with db.transaction() as conn:
        await conn.execute(update(jobs).where(jobs.c.name == "job").values(options={"max_runs": 3}))
    with pytest.raises(Refused, match="max_runs=3"):
        await backfills.create(db, job="job", start=SLOT - MINUTE, end=SLOT, rate=None, now=NOW)
    async with db.read() as conn:
        count = (await conn.execute(select(func.count()).select_from(backfill_rows))).scalar_one()
    assert count == 0
    assert backfills.kept_since(NOW, 30) == NOW - timedelta(days=30) + timedelta(hours=1)
