"""slotcron.store.starts: a run's start is stamped before its body, only while it is ours, its
slot has come and its job is not paused."""

from __future__ import annotations

from datetime import timedelta

from slotcron.store import lifeline, starts
from slotcron.store.database import Database
from slotcron.store.tables import jobs
from sqlalchemy import literal, select

from tests.store.common import (
    EARLY,
    LEASE,
    NOW,
    SLOT,
    add_run,
    claim_ahead,
    register,
    run_row,
    set_job,
)


async def test_start_runs_stamps_skips_waits_or_finds_gone(db: Database) -> None:
    await register(db, "run", "paused", "theirs", "back", "manual")
    _, runs = await claim_ahead(db, "run", "paused", "back")
    theirs = await add_run(db, "theirs", started=False, instance="b")
    # A manual run of a paused job was asked for: the pause does not stop it.
    manual = await add_run(db, "manual", started=False, instance="me", trigger="manual")
    await set_job(db, "paused", paused=True, paused_reason=None)
    await set_job(db, "manual", paused=True)
    back = await lifeline.hand_back_mine(db, [runs["back"]], instance_id="me", now=EARLY)
    assert back == {runs["back"]}
    ids = [runs["run"], runs["paused"], runs["back"], theirs, manual]

    early = await starts.start_runs(db, ids, instance_id="me", now=SLOT - timedelta(seconds=1))
    assert (early.started, early.skipped) == (set(), {})
    assert early.early == {runs["run"], runs["paused"], manual}
    assert early.gone == {runs["back"], theirs}

    done = await starts.start_runs(db, ids, instance_id="me", now=NOW)
    assert done.started == {runs["run"], manual}
    assert done.skipped == {runs["paused"]: "job is paused"}
    assert (done.early, done.gone) == (set(), {runs["back"], theirs})
    row = await run_row(db, runs["run"])
    assert (row["status"], row["started_at"]) == ("RUNNING", NOW)
    row = await run_row(db, runs["paused"])
    assert (row["status"], row["started_at"], row["finished_at"], row["lease_until"]) == (
        "SKIPPED",
        None,
        NOW,
        NOW,
    )


async def test_a_start_is_never_before_the_slot_nor_after_the_lease(db: Database) -> None:
    await register(db, "a", "b")
    _, runs = await claim_ahead(db, "a", "b")
    # The scheduler's clock a hair behind the database's (here: the same bound clock): the start
    # is never stamped before the slot.
    done = await starts.start_runs(db, [runs["a"]], instance_id="me", now=SLOT)
    assert done.started == {runs["a"]}
    assert (await run_row(db, runs["a"]))["started_at"] == SLOT
    lapsed = EARLY + LEASE + timedelta(seconds=1)
    late = await starts.start_runs(db, [runs["b"]], instance_id="me", now=lapsed)
    # Not stamped: its lease lapsed. Still this instance's row until the leader hands it back
    # (then it is gone), so it is reported early, not started.
    assert (late.started, late.early, late.gone) == (set(), {runs["b"]}, set())
    assert (await run_row(db, runs["b"]))["started_at"] is None
    await lifeline.abandon_lapsed(db, now=lapsed)
    gone = await starts.start_runs(db, [runs["b"]], instance_id="me", now=lapsed)
    assert (gone.started, gone.early, gone.gone) == (set(), set(), {runs["b"]})


async def test_paused_reason_says_why_in_sql(db: Database) -> None:
    await register(db, "plain", "why")
    await set_job(db, "why", paused_reason="maintenance")
    async with db.read() as conn:
        found = dict(
            (
                await conn.execute(
                    select(jobs.c.name, starts.paused_reason(jobs.c.paused_reason)).order_by(
                        jobs.c.name
                    )
                )
            )
            .tuples()
            .all()
        )
        assert found == {"plain": "job is paused", "why": "job is paused: maintenance"}
        assert await conn.scalar(select(starts.paused_reason(literal("é ü")))) == (
            "job is paused: é ü"
        )


async def test_rehearse_runs_the_start_statements_and_writes_nothing(db: Database) -> None:
    await register(db, "a")
    _, runs = await claim_ahead(db, "a")
    async with db.engine.connect() as conn:
        transaction = await conn.begin()
        await starts.rehearse(db, conn)
        await transaction.rollback()
    assert (await run_row(db, runs["a"]))["started_at"] is None
    assert (await starts.start_runs(db, [runs["a"]], instance_id="me", now=NOW)).started
