"""slotcron.store.claims: one slot, one decision, whoever asks, on every backend."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from slotcron.errors import LeaseHeld, RowBusy, SlotsUndecided, SlotTaken, Superseded
from slotcron.status import Status
from slotcron.store import claims
from slotcron.store.claims import Claim, Fate
from slotcron.store.database import Database
from slotcron.store.execution_rows import execution_row
from slotcron.store.tables import executions
from sqlalchemy import text

from tests.store.common import (
    LEASE,
    LEASE_MS,
    NEXT,
    NOW,
    ODD,
    SLOT,
    is_utc,
    job_row,
    register,
    run_row,
    set_job,
    table_rows,
)


async def claim(db: Database, job: str = "job", instance: str = "a", **kw: Any) -> Claim:
    values: dict[str, Any] = {
        "slot": SLOT,
        "trigger": "cron",
        "now": NOW,
        "lease_ms": LEASE_MS,
        "forbid_overlap": True,
        "following": NEXT,
    }
    values.update(kw)
    return await claims.claim_slot(db, job_name=job, instance_id=instance, **values)


async def test_a_slot_is_claimed_once_and_refused_to_the_next_claimer(db: Database) -> None:
    await register(db, "job")
    won = await claim(db)
    assert (won.status, won.attempt, won.fencing_token, won.started) == ("RUNNING", 1, 1, True)
    assert (won.lease_until, won.lease_ms) == (NOW + LEASE, LEASE_MS)
    with pytest.raises(SlotTaken):
        await claim(db, instance="b")
    with pytest.raises(SlotTaken):  # an earlier slot is closed by the high-water mark too
        await claim(db, instance="b", slot=SLOT - timedelta(minutes=1))

    row = await run_row(db, won.execution_id)
    assert (row["status"], row["instance_id"], row["trigger"], row["fencing_token"]) == (
        "RUNNING",
        "a",
        "cron",
        1,
    )
    assert (row["started_at"], row["heartbeat_at"], row["lease_until"]) == (NOW, NOW, NOW + LEASE)
    assert won.key == (won.execution_id, "job", SLOT, 1)
    job = await job_row(db, "job")
    assert (job["last_slot_at"], job["next_slot_at"], job["fencing_token"]) == (SLOT, NEXT, 1)


async def test_claimers_racing_for_one_slot_decide_it_once(db: Database) -> None:
    await register(db, "job")
    outcomes = await asyncio.gather(
        *(claim(db, instance=f"i{n}") for n in range(6)), return_exceptions=True
    )
    won = [o for o in outcomes if isinstance(o, Claim)]
    assert len(won) == 1, outcomes
    assert all(isinstance(o, SlotTaken | RowBusy) for o in outcomes if o is not won[0])
    rows = await table_rows(db, executions)
    assert [(r["id"], r["status"]) for r in rows] == [(won[0].execution_id, "RUNNING")]
    assert (await job_row(db, "job"))["fencing_token"] == 1


async def test_the_rules_of_a_claim_paused_missed_gap_superseded_unknown(db: Database) -> None:
    await register(db, "paused", "missed", "gap", "moved", "late")
    await set_job(db, "paused", paused=True, paused_reason="ops")
    skipped = await claim(db, "paused")
    assert (skipped.status, skipped.reason, skipped.lease_until) == (
        "SKIPPED",
        "job is paused: ops",
        None,
    )
    missed = await claim(db, "missed", missed_reason="misfire: skip")
    assert (missed.status, missed.reason) == ("MISSED", "misfire: skip")
    for not_run in (skipped, missed):
        row = await run_row(db, not_run.execution_id)
        assert (row["finished_at"], row["started_at"], row["fencing_token"]) == (NOW, None, None)

    await set_job(db, "gap", next_slot_at=SLOT - timedelta(minutes=5))
    with pytest.raises(SlotsUndecided):
        await claim(db, "gap")
    gap = await claim(db, "gap", check_gap=False)  # deciding late slots in order
    assert gap.status == "RUNNING"

    await set_job(db, "moved", fingerprint="in-force")
    with pytest.raises(Superseded):
        await claim(db, "moved", fingerprint="older")
    assert (await claim(db, "moved", fingerprint="in-force")).status == "RUNNING"

    with pytest.raises(SlotTaken):  # no such job (a schedule removed): nothing is open
        await claim(db, "nobody")
    ahead = await claim(db, "late", started=False)
    assert not ahead.started and (await run_row(db, ahead.execution_id))["started_at"] is None
    # The refused claims wrote nothing: one row per decided slot.
    rows = await table_rows(db, executions)
    assert sorted(r["job_name"] for r in rows) == ["gap", "late", "missed", "moved", "paused"]


async def test_forbid_skips_while_a_lease_is_held_or_waits_when_asked(db: Database) -> None:
    await register(db, "job")
    first = await claim(db)
    later, third = SLOT + timedelta(minutes=1), SLOT + timedelta(minutes=2)
    with pytest.raises(LeaseHeld):
        await claim(db, slot=later, following=later + timedelta(minutes=1), wait_for_lease="any")
    assert (await job_row(db, "job"))["last_slot_at"] == SLOT, "LeaseHeld writes nothing"
    skipped = await claim(
        db, instance="b", slot=later, now=NOW + timedelta(seconds=30), following=third
    )
    assert skipped.status == "SKIPPED"
    assert skipped.reason == (
        f"overlap: execution {first.execution_id} is still running on a (overlap='forbid')"
    )
    lapsed = NOW + LEASE + timedelta(seconds=1)
    after = await claim(db, instance="b", slot=third, now=lapsed, following=third + LEASE)
    assert (after.status, after.fencing_token) == ("RUNNING", 2)


async def test_a_claim_is_refused_at_once_while_another_holds_the_job_row(
    db: Database, backend: str
) -> None:
    await register(db, "job")
    held, release = asyncio.Event(), asyncio.Event()

    async def hold() -> None:
        async with db.engine.connect() as conn, conn.begin():
            if backend != "sqlite":  # SQLite: BEGIN IMMEDIATE takes the database's write lock
                await conn.execute(text("SELECT name FROM scheduler_jobs FOR UPDATE"))
            held.set()
            await release.wait()

    holder = asyncio.create_task(hold())
    await held.wait()
    try:
        with pytest.raises(RowBusy):
            await claim(db)
    finally:
        release.set()
        await holder
    assert (await claim(db)).status == "RUNNING"


async def test_ids_differing_by_case_or_trailing_space_are_distinct_jobs(db: Database) -> None:
    names = ["job", "Job", "job ", "JOB"]
    await register(db, *names)
    for name in names:
        assert (await claim(db, name)).job_name == name
    rows = await table_rows(db, executions, order=executions.c.id)
    assert [r["job_name"] for r in rows] == names
    for name in names:
        assert (await job_row(db, name))["last_slot_at"] == SLOT


async def test_timestamps_round_trip_in_utc_to_the_microsecond(db: Database) -> None:
    await register(db, "job")
    now = ODD + timedelta(microseconds=1)
    won = await claim(db, slot=ODD, now=now, following=ODD + timedelta(seconds=1, microseconds=9))
    row = await run_row(db, won.execution_id)
    assert row["scheduled_at"] == ODD and row["scheduled_at"].microsecond == 123457
    assert row["lease_until"] == now + LEASE and row["lease_until"].microsecond == 123458
    assert all(is_utc(row[c]) for c in ("scheduled_at", "created_at", "started_at", "lease_until"))
    job = await job_row(db, "job")
    assert job["next_slot_at"] == ODD + timedelta(seconds=1, microseconds=9)
    assert is_utc(job["last_slot_at"]) and is_utc(job["next_slot_at"])


async def test_lock_job_and_lease_holder_read_the_row_and_the_live_lease(db: Database) -> None:
    await register(db, "job")
    async with db.transaction() as conn:
        assert await claims.lock_job(conn, "nobody") is None
        locked = await claims.lock_job(conn, "job")
        assert (locked.paused, locked.last_slot_at, locked.fencing_token) == (False, None, 0)
        assert await claims.lease_holder(db, conn, "job", NOW) is None
    won = await claim(db)
    async with db.transaction() as conn:
        locked = await claims.lock_job(conn, "job")
        assert (locked.last_slot_at, locked.next_slot_at, locked.fencing_token) == (SLOT, NEXT, 1)
        holder = await claims.lease_holder(db, conn, "job", NOW + timedelta(seconds=59))
        assert (holder.id, holder.instance_id, holder.trigger) == (won.execution_id, "a", "cron")
        assert holder.lease_until == NOW + LEASE
        assert await claims.lease_holder(db, conn, "job", NOW + LEASE) is None, "lapsed"
        assert await claims.lease_holder(db, conn, "Job", NOW) is None


def test_judge_and_overlap_reason_are_the_rules_every_path_shares() -> None:
    def row(**kw: Any) -> Any:
        values = {
            "paused": False,
            "paused_reason": None,
            "last_slot_at": None,
            "next_slot_at": None,
            "fingerprint": None,
            "skip_at": None,
            "skip_reason": None,
        }
        return SimpleNamespace(**{**values, **kw})

    def judge(r: Any, *, holder: Any = None, may_defer: bool = False, **kw: Any) -> Any:
        options: dict[str, Any] = {"check_gap": True, "missed_reason": None, "now": NOW}
        options.update(kw)
        return claims.judge(r, slot=SLOT, holder=holder, may_defer=may_defer, **options)

    holder = SimpleNamespace(id=7, instance_id="a")
    assert claims.overlap_reason(holder) == (
        "overlap: execution 7 is still running on a (overlap='forbid')"
    )
    assert judge(row()).fate is Fate.RUN and judge(row()).status == Status.RUNNING
    assert judge(row(last_slot_at=SLOT)).fate is Fate.TAKEN
    assert judge(row(next_slot_at=SLOT - timedelta(1))).fate is Fate.UNDECIDED
    assert judge(row(next_slot_at=SLOT - timedelta(1)), check_gap=False).fate is Fate.RUN
    assert judge(row(fingerprint="x"), fingerprint="y").fate is Fate.SUPERSEDED
    assert judge(row(), missed_reason="late").status == Status.MISSED
    paused = judge(row(paused=True, paused_reason="ops"))
    assert (paused.status, paused.reason) == (Status.SKIPPED, "job is paused: ops")
    ahead = NOW - timedelta(seconds=1)
    assert judge(row(paused=True), now=ahead, may_defer=True).fate is Fate.RUN
    assert judge(row(), holder=holder, now=ahead, may_defer=True).fate is Fate.DEFERRED
    overlap = judge(row(), holder=holder)
    assert (overlap.status, overlap.reason) == (Status.SKIPPED, claims.overlap_reason(holder))
    # An operator's skip, then the job's calendar, come before a pause, a miss and an overlap.
    skipped = judge(row(skip_at=SLOT, skip_reason="x", paused=True), missed_reason="late")
    assert (skipped.status, skipped.reason) == (Status.SKIPPED, "skipped: x")
    assert judge(row(skip_at=SLOT + timedelta(1))).fate is Fate.RUN, "another slot's skip"
    holiday = judge(row(paused=True), holder=holder, missed_reason="late", excluded="holiday: X")
    assert (holiday.status, holiday.reason) == (Status.SKIPPED, "holiday: X")


async def test_execution_row_is_what_a_claim_inserts(db: Database) -> None:
    await register(db, "job")
    running = execution_row(
        job_name="job",
        slot=SLOT,
        trigger="cron",
        status=Status.RUNNING,
        instance_id="a",
        now=NOW,
        lease_ms=LEASE_MS,
        fencing_token=3,
    )
    skipped = execution_row(
        job_name="job",
        slot=NEXT,
        trigger="cron",
        status=Status.SKIPPED,
        instance_id="a",
        now=NOW,
        reason="why",
    )
    async with db.transaction() as conn:
        await conn.execute(executions.insert(), [running, skipped])
    rows = await table_rows(db, executions, order=executions.c.scheduled_at)
    assert [(r["status"], r["lease_until"], r["finished_at"], r["error"]) for r in rows] == [
        ("RUNNING", NOW + LEASE, None, None),
        ("SKIPPED", None, NOW, "why"),
    ]
    assert (rows[0]["fencing_token"], rows[0]["started_at"], rows[1]["started_at"]) == (
        3,
        NOW,
        None,
    )
    unstarted = execution_row(
        job_name="job",
        slot=SLOT,
        trigger="cron",
        status=Status.RUNNING,
        instance_id="a",
        now=NOW,
        started=False,
    )
    assert unstarted["started_at"] is None and unstarted["heartbeat_at"] == NOW


async def test_rehearse_runs_the_claim_statements_and_decides_nothing(db: Database) -> None:
    await register(db, "job")
    before = (await job_row(db, "job"), await table_rows(db, executions))
    async with db.engine.connect() as conn:
        transaction = await conn.begin()
        await claims.rehearse(db, conn)
        await transaction.rollback()
    assert (await job_row(db, "job"), await table_rows(db, executions)) == before
    assert (await claim(db)).status == "RUNNING"
