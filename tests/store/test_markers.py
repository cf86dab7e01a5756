"""slotcron.store.markers: one row starts a chunk claimed ahead; the instance's marker and the
leader's tombstone exclude each other."""

from __future__ import annotations

from datetime import datetime, timedelta

from slotcron.store import markers
from slotcron.store.database import Database
from slotcron.store.tables import executions
from sqlalchemy import select, update

from tests.store.common import (
    EARLY,
    LEASE,
    NOW,
    SLOT,
    add_run,
    claim_ahead,
    markers_of,
    register,
    run_row,
    set_job,
)

LEASE_UNTIL = EARLY + LEASE
"""The leases of a chunk claimed ahead at EARLY."""


async def mark(
    db: Database, key: str, ids: list[int], now: datetime = SLOT, instance: str = "me"
) -> markers.Marked:
    return await markers.mark(
        db, key, ids=ids, slot=SLOT, lease_until=LEASE_UNTIL, instance_id=instance, now=now
    )


async def test_a_chunk_starts_with_one_marker_written_at_its_slot(db: Database) -> None:
    await register(db, "a", "b", "c")
    key, runs = await claim_ahead(db, "a", "b", "c")
    ids = list(runs.values())

    early = await mark(db, key, ids, now=SLOT - timedelta(milliseconds=1))
    assert (early.started, early.early) == (False, True)
    assert await markers_of(db) == []

    marked = await mark(db, key, ids)
    assert (marked.started, marked.only, marked.skipped, marked.early) == (True, None, {}, False)
    assert await markers_of(db) == [(key, "me", SLOT, False)]
    for execution_id in ids:  # the marker stands for every run: no run row is written
        row = await run_row(db, execution_id)
        assert (row["start_key"], row["started_at"], row["status"]) == (key, None, "RUNNING")

    # An attempt again (its answer lost): the marker is ours, the runs still ours start.
    again = await mark(db, key, ids)
    assert (again.started, again.only) == (True, set(ids))
    # Another instance presenting the key starts nothing.
    other = await mark(db, key, ids, instance="ME")
    assert (other.started, other.early) == (False, False)


async def test_a_paused_jobs_run_is_recorded_skipped_by_the_marker(db: Database) -> None:
    await register(db, "paused", "running")
    key, runs = await claim_ahead(db, "paused", "running")
    await set_job(db, "paused", paused=True, paused_reason="ops")

    marked = await mark(db, key, list(runs.values()))

    assert marked.started and marked.skipped == {runs["paused"]: "job is paused: ops"}
    row = await run_row(db, runs["paused"])
    assert (row["status"], row["error"], row["start_key"], row["finished_at"]) == (
        "SKIPPED",
        "job is paused: ops",
        None,
        SLOT,
    )
    assert (await run_row(db, runs["running"]))["status"] == "RUNNING"


async def test_the_tombstone_first_means_no_marker_and_settle_reports_each_start(
    db: Database,
) -> None:
    await register(db, "a", "b", "c")
    key, runs = await claim_ahead(db, "a", "b")
    started_key, started_runs = await claim_ahead(db, "c", instance="other")
    assert (await mark(db, started_key, list(started_runs.values()), instance="other")).started

    settled = await markers.settle(db, [key, started_key], now=NOW)
    assert settled == {key: None, started_key: SLOT}
    assert await markers.settle(db, [], now=NOW) == {}
    assert sorted(await markers_of(db)) == sorted(
        [(key, None, None, True), (started_key, "other", SLOT, False)]
    )
    late = await mark(db, key, list(runs.values()))
    assert (late.started, late.early) == (False, False)


async def test_started_at_is_a_runs_own_else_its_chunks_marker(db: Database) -> None:
    await register(db, "a", "b")
    key, runs = await claim_ahead(db, "a")
    await mark(db, key, list(runs.values()))
    own = await add_run(db, "b", NOW)
    unmarked = await add_run(
        db, "b", SLOT + timedelta(minutes=1), started=False, start_key="nobody-marked-it"
    )
    async with db.read() as conn:
        found = dict(
            (await conn.execute(select(executions.c.id, markers.started_at()))).tuples().all()
        )
    assert found == {runs["a"]: SLOT, own: NOW, unmarked: None}
    # The expression correlates to the row an UPDATE writes, as a finishing write uses it.
    async with db.transaction() as conn:
        await conn.execute(
            update(executions)
            .where(executions.c.id == runs["a"])
            .values(status="COMPLETED", started_at=markers.started_at())
        )
    assert (await run_row(db, runs["a"]))["started_at"] == SLOT


async def test_prune_deletes_old_markers_whose_chunk_has_no_run_in_flight(db: Database) -> None:
    await register(db, "a", "b")
    key, runs = await claim_ahead(db, "a")
    await mark(db, key, list(runs.values()))
    tombstone = "t" * 32
    await markers.settle(db, [tombstone], now=NOW)
    later = SLOT + timedelta(hours=1)

    assert await markers.prune(db, before=NOW) == 0, "created at the slot: not before it"
    assert await markers.prune(db, before=later, batch=1) == 1, "the tombstone, one per batch"
    assert [m[0] for m in await markers_of(db)] == [key], "its run is in flight"
    async with db.transaction() as conn:
        await conn.execute(update(executions).values(status="COMPLETED"))
    assert await markers.prune(db, before=later) == 1
    assert await markers_of(db) == []


async def test_rehearse_runs_the_marker_statements_and_writes_nothing(db: Database) -> None:
    await register(db, "a")
    key, runs = await claim_ahead(db, "a")
    async with db.engine.connect() as conn:
        transaction = await conn.begin()
        await markers.rehearse(db, conn)
        await transaction.rollback()
    assert await markers_of(db) == []
    assert (await mark(db, key, list(runs.values()))).started
