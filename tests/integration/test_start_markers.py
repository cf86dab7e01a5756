"""Start markers: a chunk of runs claimed ahead starts with one row written at its slot.

The instance's marker and the leader's tombstone exclude each other (whoever inserts the key
first decides the whole chunk), a pause is honoured by the same round trip, and ``started_at``
is the marker's: shown while the run is in flight, written on the row when it finishes. On
every backend, with the manual clock."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from slotcron import JobContext
from slotcron.clock import ManualClock
from slotcron.jobs.registry import Registry, cron
from slotcron.store import batch as batch_store
from slotcron.store import history, lifeline, markers, runs, start_keys, timeline
from slotcron.store.database import Database
from slotcron.store.tables import executions, start_markers
from sqlalchemy import event, select
from sqlalchemy.engine import default

from tests.conftest import ServiceFactory, wait_for
from tests.integration.test_batch_claims import SLOT, due, register
from tests.integration.test_starts import EARLY, LEASE, row_of, set_paused

LAPSED = EARLY + LEASE + timedelta(seconds=1)


CLAIMED: dict[str, tuple[dict[int, str], datetime]] = {}
"""Of each chunk claimed here, its runs (id: job) and the earliest lease as claimed."""


async def claim_chunk(db: Database, names: list[str]) -> tuple[str, list[int]]:
    """Claim ``names`` ahead of SLOT in one transaction: their chunk's key and execution ids."""
    decided = await batch_store.claim_many(
        db, [due(name) for name in names], instance_id="me", now=EARLY
    )
    keys = {decided.start_keys[name] for name in names}
    assert len(keys) == 1, "one chunk, one slot: one key"
    key = keys.pop()
    claims = [decided.claims[name] for name in names]
    CLAIMED[key] = (
        {c.execution_id: c.job_name for c in claims},
        min(c.lease_until for c in claims if c.lease_until is not None),
    )
    return key, [c.execution_id for c in claims]


async def mark(db: Database, key: str, now: datetime = SLOT) -> markers.Marked:
    """The chunk's instance inserting its marker at ``now``, as its kick-off does."""
    runs, lease_until = CLAIMED[key]
    return await markers.mark(
        db, key, ids=list(runs), slot=SLOT, lease_until=lease_until, instance_id="me", now=now
    )


async def markers_of(db: Database) -> list[tuple[str, str | None, datetime | None, bool]]:
    async with db.read() as conn:
        rows = await conn.execute(select(start_markers))
        return [(r.start_key, r.instance_id, r.started_at, bool(r.handed_back)) for r in rows]


async def test_a_chunk_claimed_ahead_shares_one_key_and_starts_with_one_marker(
    db: Database,
) -> None:
    await register(db, ["a", "b", "c"])
    key, ids = await claim_chunk(db, ["a", "b", "c"])
    for execution_id in ids:
        row = await row_of(db, execution_id)
        assert (row["start_key"], row["started_at"], row["status"]) == (key, None, "RUNNING")

    marked = await mark(db, key)

    assert (marked.started, marked.only, marked.skipped, marked.early) == (True, None, {}, False)
    assert await markers_of(db) == [(key, "me", SLOT, False)]
    for execution_id in ids:  # no row written at the slot: the marker stands for them all
        assert (await row_of(db, execution_id))["started_at"] is None


async def test_a_marker_is_not_inserted_before_the_slot_by_the_database_clock(
    db: Database,
) -> None:
    await register(db, ["a"])
    key, _ = await claim_chunk(db, ["a"])

    marked = await mark(db, key, now=SLOT - timedelta(milliseconds=1))

    assert (marked.started, marked.early) == (False, True)
    assert await markers_of(db) == []


async def test_the_leader_tombstone_first_means_the_instance_starts_nothing_of_the_chunk(
    db: Database,
) -> None:
    await register(db, ["a", "b"])
    key, ids = await claim_chunk(db, ["a", "b"])

    found = await lifeline.abandon_lapsed(db, now=LAPSED)  # the instance never marked it

    assert {(run.execution_id, run.handed_back) for run in found} == {(i, True) for i in ids}
    assert await markers_of(db) == [(key, None, None, True)]
    for execution_id in ids:
        row = await row_of(db, execution_id)
        assert (row["status"], row["start_key"], row["started_at"]) == ("QUEUED", None, None)
    # Its instance, late (a pause, say): the key is taken, nothing of the chunk starts.
    late = await mark(db, key)
    assert (late.started, late.early) == (False, False)
    # Nor once the tombstone is pruned: the chunk's leases lapsed before it went in.
    assert await markers.prune(db, before=LAPSED + timedelta(seconds=1)) == 1
    later = await mark(db, key, now=LAPSED)
    assert (later.started, later.early) == (False, False)
    assert await markers_of(db) == []


async def test_the_leader_tombstones_a_chunk_whose_runs_are_still_ours_and_the_marker_loses(
    db: Database,
) -> None:
    """The race itself, with the instance's lease still live: the tombstone goes in first."""
    await register(db, ["a"])
    key, _ = await claim_chunk(db, ["a"])
    assert await markers.settle(db, [key], now=SLOT) == {key: None}

    marked = await mark(db, key)

    assert (marked.started, marked.early) == (False, False)
    assert await markers_of(db) == [(key, None, None, True)]


async def test_the_marker_first_means_the_leader_records_abandoned_started_at_the_marker(
    db: Database,
) -> None:
    await register(db, ["a", "b"])
    key, ids = await claim_chunk(db, ["a", "b"])
    assert (await mark(db, key)).started

    found = await lifeline.abandon_lapsed(db, now=LAPSED)

    assert {(run.execution_id, run.handed_back) for run in found} == {(i, False) for i in ids}
    for execution_id in ids:  # never handed back: it started, by its marker
        row = await row_of(db, execution_id)
        assert (row["status"], row["started_at"], row["finished_at"]) == (
            "ABANDONED",
            SLOT,
            LAPSED,
        )
    assert await markers_of(db) == [(key, "me", SLOT, False)]  # the tombstone did not go in


async def test_a_started_chunk_is_not_handed_back_by_its_instance_unless_its_body_did_not_start(
    db: Database,
) -> None:
    await register(db, ["a", "b"])
    key, (a, b) = await claim_chunk(db, ["a", "b"])
    await mark(db, key)

    assert await lifeline.hand_back_mine(db, [a], instance_id="me", now=SLOT) == set()
    # Cancelled between its marker and its body: its runner knows, and hands it back alone.
    back = await lifeline.hand_back_mine(db, [b], instance_id="me", now=SLOT, marked_too=True)

    assert back == {b}
    row = await row_of(db, b)
    assert (row["status"], row["start_key"], row["started_at"]) == ("QUEUED", None, None)
    assert (await row_of(db, a))["status"] == "RUNNING"


async def test_a_pause_committed_before_the_slot_skips_its_run_in_the_markers_round_trip(
    db: Database,
) -> None:
    await register(db, ["paused", "running"])
    key, (paused, running) = await claim_chunk(db, ["paused", "running"])
    await set_paused(db, "paused", True)

    marked = await mark(db, key)

    assert marked.started and marked.skipped == {paused: "job is paused"}
    skipped = await row_of(db, paused)
    assert (skipped["status"], skipped["started_at"], skipped["start_key"]) == (
        "SKIPPED",
        None,
        None,
    )
    records = {r.id: r for r in await history.list_executions(db)}
    assert records[paused].started_at is None  # never started: the marker is not its start
    assert records[running].started_at == SLOT


async def test_started_at_of_a_run_in_flight_is_its_markers_and_written_when_it_finishes(
    db: Database,
) -> None:
    await register(db, ["a"])
    key, (a,) = await claim_chunk(db, ["a"])
    await mark(db, key)

    (listed,) = await history.list_executions(db)
    one = await timeline.execution(db, a)
    (line,) = await timeline.timelines(db, ["a"], limit=5)
    assert (listed.started_at, one and one.started_at, line.cells[0].started_at) == (SLOT,) * 3
    assert (await row_of(db, a))["started_at"] is None

    finished = SLOT + timedelta(seconds=2)
    assert await runs.finish_many(
        db, [((a, "a", SLOT, 1), "COMPLETED", None)], instance_id="me", now=finished
    )
    row = await row_of(db, a)
    assert (row["started_at"], row["finished_at"]) == (SLOT, finished)
    # Its marker outlives no run in flight: pruned, the row keeps its start.
    assert await markers.prune(db, before=finished + timedelta(seconds=1)) == 1
    assert await markers_of(db) == []
    (listed,) = await history.list_executions(db)
    assert (listed.started_at, listed.duration_ms) == (SLOT, 2000)


async def test_a_marker_is_kept_while_a_run_of_its_chunk_is_in_flight(db: Database) -> None:
    await register(db, ["a"])
    key, _ = await claim_chunk(db, ["a"])
    await mark(db, key)

    assert await markers.prune(db, before=SLOT + timedelta(hours=1)) == 0
    assert len(await markers_of(db)) == 1


async def test_a_burst_started_by_its_marker_shows_started_at_in_flight_and_records_it(
    db: Database, start_service: ServiceFactory
) -> None:
    clock = ManualClock(datetime(2026, 11, 22, 0, 0, 5, tzinfo=UTC))
    slot = datetime(2026, 11, 22, 0, 0, 10, tzinfo=UTC)
    registry = Registry()
    began: list[str] = []
    release = asyncio.Event()
    for i in range(5):

        def make(i: int) -> None:
            @cron("*/10 * * * * *", name=f"burst-{i}", registry=registry)
            async def job(ctx: JobContext) -> None:
                began.append(ctx.job)
                await release.wait()

        make(i)
    await start_service(list(registry), clock=clock)
    await clock.set(slot - timedelta(milliseconds=5))  # inside the lead: claimed ahead

    async def claimed() -> bool:
        async with db.read() as conn:
            rows = (await conn.execute(select(executions.c.start_key))).all()
        keys = {r.start_key for r in rows}
        return len(rows) == 5 and len(keys) == 1 and None not in keys

    await wait_for(claimed, what="the burst claimed ahead, one chunk")
    assert began == []
    await clock.set(slot)
    await wait_for(lambda: len(began) == 5, what="the burst's bodies started")

    records = await history.list_executions(db)
    assert {(r.status, r.started_at) for r in records} == {("RUNNING", slot)}
    assert {m[2] for m in await markers_of(db)} == {slot}
    release.set()

    async def completed() -> bool:
        async with db.read() as conn:
            rows = (await conn.execute(select(executions))).all()
        return {(r.status, r.started_at) for r in rows} == {("COMPLETED", slot)}

    await wait_for(completed, what="each run recorded with its marker's start")


async def test_the_chunks_of_one_slot_share_one_key_and_one_marker_starts_them_all(
    db: Database,
) -> None:
    await register(db, ["a", "b", "c"])
    first, (a,) = await claim_chunk(db, ["a"])
    second, (b, c) = await claim_chunk(db, ["b", "c"])
    assert first == second, "a burst's chunks of one slot: one key"
    runs = {**CLAIMED[first][0], **CLAIMED[second][0]}

    marked = await markers.mark(
        db,
        first,
        ids=list(runs),
        slot=SLOT,
        lease_until=CLAIMED[first][1],
        instance_id="me",
        now=SLOT,
    )

    assert (marked.started, marked.only) == (True, None)
    assert await markers_of(db) == [(first, "me", SLOT, False)]
    assert {r.id: r.started_at for r in await history.list_executions(db)} == dict.fromkeys(
        (a, b, c), SLOT
    )


async def test_a_chunk_claimed_after_its_slots_marker_starts_under_it_and_honours_a_pause(
    db: Database,
) -> None:
    await register(db, ["a", "late", "late-paused"])
    key, _ = await claim_chunk(db, ["a"])
    assert (await mark(db, key)).started
    again, (late, paused) = await claim_chunk(db, ["late", "late-paused"])
    await set_paused(db, "late-paused", True)

    marked = await mark(db, again)  # the marker is there, ours: these runs start under it

    assert again == key
    assert (marked.started, marked.only, marked.skipped) == (
        True,
        {late},
        {paused: "job is paused"},
    )
    assert (await row_of(db, paused))["status"] == "SKIPPED"


async def test_the_marker_is_compiled_before_its_slot_by_the_rehearsal(db: Database) -> None:
    """At the slot the marker's statements come from SQLAlchemy's compiled cache: the warm-up's
    rehearsal compiled them with the very keys :func:`markers.mark` binds (a compile there cost
    every body of a burst 5 ms of start lag)."""
    if db.dialect.single_writer:
        pytest.skip("SQLite's warm-up rehearses nothing: its one writer is not to be held")
    await register(db, ["a", "b"])
    key, _ = await claim_chunk(db, ["a", "b"])
    await db.warm_up(1, lambda conn: markers.rehearse(db, conn))
    seen: list[tuple[object, str]] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        context = args[-2]  # (parameters, context, executemany)
        seen.append((context.cache_hit, statement[:60]))

    event.listen(db.engine.sync_engine, "before_cursor_execute", record)
    try:
        assert (await mark(db, key)).started
    finally:
        event.remove(db.engine.sync_engine, "before_cursor_execute", record)
    misses = [s for hit, s in seen if hit is default.CACHE_MISS]
    assert seen and misses == [], f"compiled at the slot: {seen}"


async def test_a_slots_runs_share_a_key_up_to_a_markers_share_then_take_the_next(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A burst of 100,000 starts by several markers sent together (one would cost the database
    # 0.4 s at the slot before any body starts): whole chunks fill a key up to MARKER_RUNS.
    monkeypatch.setattr(start_keys, "MARKER_RUNS", 3)
    monkeypatch.setattr(start_keys, "_filling", {})
    await register(db, ["a", "b", "c", "d", "e"])
    first, _ = await claim_chunk(db, ["a"])
    second, _ = await claim_chunk(db, ["b", "c"])  # 3 runs: still the first key
    third, _ = await claim_chunk(db, ["d", "e"])  # 5 > 3: the next key

    assert first == second != third
    for key in (first, third):
        assert (await mark(db, key)).started
    assert sorted(key for key, *_ in await markers_of(db)) == sorted({first, third})
    for name in "abcde":
        async with db.read() as conn:
            row = (
                await conn.execute(
                    select(executions.c.start_key).where(executions.c.job_name == name)
                )
            ).one()
        assert row.start_key == (first if name in "abc" else third)
