"""slotcron.store.skips on every backend: each path that decides a slot (one claim, a batch, a
passed-over range) records a skipped slot SKIPPED with its reason and moves on to the job's next
skip; what cannot be skipped is refused, writing nothing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from slotcron.errors import NotFound, Refused, UsageError
from slotcron.store import batch as batch_store
from slotcron.store import claims as claim_store
from slotcron.store import passed_over, skips
from slotcron.store.database import Database
from slotcron.store.tables import UTCDateTime, jobs
from slotcron.store.tables import skips as skip_rows
from sqlalchemy import bindparam, select

from tests.integration.test_batch_claims import due, recorded, register

SLOT = datetime(2026, 11, 22, 0, 10, tzinfo=UTC)  # the jobs registered here run every minute
NOW = SLOT + timedelta(milliseconds=3)
MINUTE = timedelta(minutes=1)


async def claim(
    db: Database, slot: datetime, job: str = "job", max_runs: int | None = None
) -> claim_store.Claim:
    """A claim of ``slot`` a moment after it, overlap allowed."""
    return await claim_store.claim_slot(
        db,
        job_name=job,
        slot=slot,
        trigger="cron",
        instance_id="me",
        now=slot + timedelta(milliseconds=3),
        lease_ms=60_000,
        forbid_overlap=False,
        following=slot + MINUTE,
        max_runs=max_runs,
    )


async def next_skip(db: Database, job: str = "job") -> tuple[datetime | None, str | None]:
    async with db.read() as conn:
        row = (
            await conn.execute(select(jobs.c.skip_at, jobs.c.skip_reason).where(jobs.c.name == job))
        ).one()
    return row.skip_at, row.skip_reason


async def test_one_claim_at_a_time_records_each_skipped_slot_with_its_reason(db: Database) -> None:
    await register(db, ["job"])
    await skips.skip(db, job="job", at=SLOT + 3 * MINUTE, reason="audit", now=NOW)
    await skips.skip(db, job="job", at=SLOT + MINUTE, reason="tonight's export", now=NOW)
    assert await next_skip(db) == (SLOT + MINUTE, "tonight's export")
    outcomes = [
        (c.status, c.reason) for c in [await claim(db, SLOT + i * MINUTE) for i in range(5)]
    ]
    assert outcomes == [
        ("RUNNING", None),
        ("SKIPPED", "skipped: tonight's export"),
        ("RUNNING", None),
        ("SKIPPED", "skipped: audit"),
        ("RUNNING", None),
    ]
    assert await next_skip(db) == (None, None)
    assert await skips.pending(db, "job") == []


async def test_a_batch_records_a_skipped_slot_and_moves_each_job_to_its_next_skip(
    db: Database,
) -> None:
    await register(db, ["a", "b"])
    await skips.skip(db, job="a", at=SLOT, reason=None, now=NOW)
    await skips.skip(db, job="a", at=SLOT + 2 * MINUTE, reason="later", now=NOW)
    decided = await batch_store.claim_many(
        db, [due("a", forbid=False), due("b", forbid=False)], instance_id="me", now=NOW
    )
    assert {n: (c.status, c.reason) for n, c in decided.claims.items()} == {
        "a": ("SKIPPED", "skipped by an operator"),
        "b": ("RUNNING", None),
    }
    assert await next_skip(db, "a") == (SLOT + 2 * MINUTE, "later")
    assert await next_skip(db, "b") == (None, None)
    later = await batch_store.claim_many(
        db, [due("a", SLOT + MINUTE, forbid=False)], instance_id="me", now=NOW + MINUTE
    )
    assert later.claims["a"].status == "RUNNING"
    assert await next_skip(db, "a") == (SLOT + 2 * MINUTE, "later"), "not passed yet"
    assert (await recorded(db))[("a", SLOT.isoformat())] == ("SKIPPED", "skipped by an operator")


async def test_a_range_recorded_missed_passes_the_skips_inside_it(db: Database) -> None:
    await register(db, ["job"])
    await skips.skip(db, job="job", at=SLOT + 2 * MINUTE, reason="inside", now=NOW)
    await skips.skip(db, job="job", at=SLOT + 9 * MINUTE, reason="after", now=NOW)
    missed = passed_over.Range(
        job_name="job",
        first=SLOT,
        last=SLOT + 8 * MINUTE,
        following=SLOT + 9 * MINUTE,
        trigger="cron",
        reason="passed over",
    )
    await passed_over.record(db, [missed], instance_id="me", now=NOW + 9 * MINUTE)
    assert await next_skip(db) == (SLOT + 9 * MINUTE, "after")
    assert (await claim(db, SLOT + 9 * MINUTE)).status == "SKIPPED"


async def test_what_cannot_be_skipped_is_refused_and_writes_nothing(db: Database) -> None:
    await register(db, ["job"])
    await claim(db, SLOT)
    with pytest.raises(UsageError, match=r"not a slot of job .* next slot after that is"):
        await skips.skip(db, job="job", at=SLOT + timedelta(seconds=30), reason=None, now=NOW)
    with pytest.raises(Refused, match="already decided"):
        await skips.skip(db, job="job", at=SLOT, reason=None, now=NOW)
    with pytest.raises(UsageError, match="--reason has at most 400 characters, got 401"):
        await skips.skip(db, job="job", at=SLOT + MINUTE, reason="x" * 401, now=NOW)
    with pytest.raises(NotFound, match="no-such-job"):
        await skips.skip(db, job="no-such-job", at=SLOT, reason=None, now=NOW)
    with pytest.raises(Refused, match="is not skipped"):
        await skips.unskip(db, job="job", at=SLOT + MINUTE)
    async with db.read() as conn:
        assert (await conn.execute(select(skip_rows))).all() == []
    assert await next_skip(db) == (None, None)


async def test_an_unskip_before_the_slot_lets_it_run_and_is_refused_once_it_is_decided(
    db: Database,
) -> None:
    await register(db, ["job"])
    first = await skips.skip(db, job="job", at=SLOT, reason="one", now=NOW)
    again = await skips.skip(db, job="job", at=SLOT, reason="two", now=NOW)
    assert first.created and not again.created
    assert await next_skip(db) == (SLOT, "two"), "a second skip of the slot replaces the reason"
    await skips.skip(db, job="job", at=SLOT + MINUTE, reason="kept", now=NOW)
    await skips.unskip(db, job="job", at=SLOT)
    assert await next_skip(db) == (SLOT + MINUTE, "kept")
    assert (await claim(db, SLOT)).status == "RUNNING"
    assert (await claim(db, SLOT + MINUTE)).status == "SKIPPED"
    with pytest.raises(Refused, match="already decided"):
        await skips.unskip(db, job="job", at=SLOT + MINUTE)


def test_a_skipped_slot_says_why_and_the_mark_moves_reason_first() -> None:
    assert skips.skip_reason("audit") == "skipped: audit"
    assert skips.skip_reason(None) == "skipped by an operator"
    # MySQL assigns left to right: the reason must be read off the old skip_at.
    pairs = skips.moved_on(bindparam("p_slot", type_=UTCDateTime()))
    assert [column.name for column, _ in pairs] == ["skip_reason", "skip_at"]
