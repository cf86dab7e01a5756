"""Claiming a burst together, and recording outcomes together, on every backend: the same
decisions as one claim at a time, nothing dropped when another claimer holds a row."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from slotcron import JobContext
from slotcron.clock import ManualClock, SystemClock
from slotcron.engine import burst, claims
from slotcron.engine.claims import Claimer
from slotcron.errors import RowBusy
from slotcron.jobs.registry import Job, Registry, cron
from slotcron.lifeline.roles import Collaborators
from slotcron.store import batch as batch_store
from slotcron.store import markers, registrations, starts
from slotcron.store import runs as run_store
from slotcron.store.batch import Due
from slotcron.store.database import Database
from slotcron.store.registrations import JobRow
from slotcron.store.tables import executions, jobs
from sqlalchemy import func, select, text, update

from tests.conftest import ServiceFactory, Services, wait_for
from tests.integration.test_claims import hold_job_row

SLOT = datetime(2026, 11, 22, 0, 10, tzinfo=UTC)
NOW = SLOT + timedelta(milliseconds=3)
NEXT = SLOT + timedelta(minutes=1)


async def register(db: Database, names: list[str]) -> None:
    rows = [
        JobRow(name=n, kind="cron", schedule="* * * * *", timezone="UTC", options={}) for n in names
    ]
    await registrations.register_jobs(db, rows, now=NOW, instance_id="test", version="test")


def due(name: str, slot: datetime = SLOT, forbid: bool = True) -> Due:
    return Due(
        job_name=name,
        slot=slot,
        following=slot + timedelta(minutes=1),
        trigger="cron",
        lease_ms=60_000,
        forbid_overlap=forbid,
    )


async def recorded(db: Database) -> dict[tuple[str, str], tuple[str, str | None]]:
    async with db.read() as conn:
        rows = await conn.execute(select(executions))
        return {(r.job_name, r.scheduled_at.isoformat()): (r.status, r.error) for r in rows}


async def high_water(db: Database) -> dict[str, tuple[datetime | None, datetime | None]]:
    async with db.read() as conn:
        rows = await conn.execute(select(jobs.c.name, jobs.c.last_slot_at, jobs.c.next_slot_at))
        return {r.name: (r.last_slot_at, r.next_slot_at) for r in rows}


async def test_a_batch_decides_each_job_by_the_rules_of_a_single_claim(db: Database) -> None:
    names = ["open", "paused", "overlapping", "taken", "gap", "allow"]
    await register(db, names)
    async with db.transaction() as conn:
        await conn.execute(
            update(jobs).where(jobs.c.name == "paused").values(paused=True, paused_reason="ops")
        )
    # "overlapping" has a run from the previous slot still holding its lease; "taken" was
    # already decided by someone else; "gap" expects a slot before this one.
    before = await batch_store.claim_many(
        db,
        [due("overlapping", SLOT - timedelta(minutes=1)), due("taken", SLOT)],
        instance_id="other",
        now=NOW - timedelta(seconds=30),  # its lease (60 s) is still live at NOW
    )
    assert {c.status for c in before.claims.values()} == {"RUNNING"}
    async with db.transaction() as conn:
        await conn.execute(
            update(jobs)
            .where(jobs.c.name == "gap")
            .values(next_slot_at=SLOT - timedelta(minutes=2))
        )

    decided = await batch_store.claim_many(
        db,
        [due(n, forbid=n != "allow") for n in names],
        instance_id="me",
        now=NOW,
    )

    assert {n: c.status for n, c in decided.claims.items()} == {
        "open": "RUNNING",
        "allow": "RUNNING",
        "paused": "SKIPPED",
        "overlapping": "SKIPPED",
    }
    assert decided.claims["paused"].reason == "job is paused: ops"
    assert "still running on other" in (decided.claims["overlapping"].reason or "")
    assert decided.claims["open"].lease_until == NOW + timedelta(seconds=60)
    assert decided.taken == {"taken"}
    assert [i.job_name for i in decided.undecided] == ["gap"]
    assert decided.held == []
    rows = await recorded(db)
    slot = SLOT.isoformat()
    assert rows[("open", slot)] == ("RUNNING", None)
    assert rows[("paused", slot)][0] == "SKIPPED"
    assert rows[("overlapping", slot)][0] == "SKIPPED"
    assert ("gap", slot) not in rows
    assert rows[("taken", slot)] == ("RUNNING", None)  # the other instance's run, untouched
    marks = await high_water(db)
    for name in ("open", "allow", "paused", "overlapping"):
        assert marks[name] == (SLOT, NEXT), name
    assert marks["gap"] == (None, SLOT - timedelta(minutes=2))
    # Each claim's id is the id of its own row.
    async with db.read() as conn:
        mine = await conn.execute(
            select(executions.c.job_name, executions.c.id).where(executions.c.instance_id == "me")
        )
        ids = {str(row.job_name): int(row.id) for row in mine}
    assert {n: c.execution_id for n, c in decided.claims.items()} == ids


async def test_a_slot_claimed_ahead_starts_at_its_time_and_defers_a_held_lease(
    db: Database,
) -> None:
    """Claimed before its time, a run has not started (no started_at) until its start is
    stamped at its slot; a forbid job whose previous run still holds the lease is left
    undecided, for overlap is judged at the slot."""
    await register(db, ["ahead", "busy"])
    await batch_store.claim_many(
        db, [due("busy", SLOT - timedelta(minutes=1))], instance_id="other", now=NOW
    )
    early = SLOT - timedelta(milliseconds=40)

    decided = await batch_store.claim_many(
        db, [due("ahead"), due("busy")], instance_id="me", now=early
    )

    assert decided.claims["ahead"].status == "RUNNING"
    assert decided.claims["ahead"].lease_until == early + timedelta(seconds=60)
    assert [i.job_name for i in decided.deferred] == ["busy"]
    assert "busy" not in decided.claims and decided.held == []
    async with db.read() as conn:
        row = (await conn.execute(select(executions).where(executions.c.job_name == "ahead"))).one()
    assert (row.created_at, row.started_at, row.heartbeat_at) == (early, None, early)
    claimed = decided.claims["ahead"].execution_id
    before = await starts.start_runs(db, [claimed], instance_id="me", now=early)
    assert before.early == {claimed}  # its slot has not come: nothing stamped
    at = await starts.start_runs(db, [claimed], instance_id="me", now=SLOT)
    assert at.started == {claimed}
    async with db.read() as conn:
        row = (await conn.execute(select(executions).where(executions.c.job_name == "ahead"))).one()
    assert row.started_at == SLOT
    assert ("busy", SLOT.isoformat()) not in await recorded(db)
    assert (await high_water(db))["busy"] == (SLOT - timedelta(minutes=1), SLOT)
    # At its time, the same lease still held: now it is SKIPPED, as a single claim would.
    at_slot = await batch_store.claim_many(db, [due("busy")], instance_id="me", now=NOW)
    assert at_slot.claims["busy"].status == "SKIPPED"


async def test_jobs_due_together_are_claimed_ahead_and_started_at_their_slot(
    db: Database, start_service: ServiceFactory
) -> None:
    registry = Registry()
    ran: dict[str, datetime] = {}
    clock = ManualClock(datetime(2026, 11, 22, 0, 0, 5, tzinfo=UTC))
    slot = datetime(2026, 11, 22, 0, 0, 10, tzinfo=UTC)

    def make(i: int) -> None:
        @cron("*/10 * * * * *", name=f"burst-{i}", registry=registry)
        async def job(ctx: JobContext) -> None:
            ran[ctx.job] = clock.now()

    for i in range(40):
        make(i)
    service = await start_service(list(registry), clock=clock)

    # Inside the lead (its fixed part alone): every slot is claimed, none has started.
    await clock.set(slot - timedelta(seconds=burst.LEAD_BASE / 2))

    async def all_claimed() -> bool:
        async with db.read() as conn:
            rows = await conn.execute(
                select(executions.c.status, executions.c.started_at).where(
                    executions.c.scheduled_at == slot
                )
            )
            claimed: int = sum(r.status == "RUNNING" and r.started_at is None for r in rows)
            return claimed == 40

    await wait_for(all_claimed, what="the burst claimed ahead of its slot")
    # In flight (leases renewed, shutdown waits for them) once the claim's answer is read: its
    # commit can be seen from here a moment before.
    await wait_for(lambda: len(service.runs) == 40, what="the claimed runs in flight")
    assert ran == {}, "a run started before its slot"

    await clock.set(slot)
    await wait_for(lambda: len(ran) == 40, what="every run at its slot")
    assert set(ran.values()) == {slot}

    async def stamped(column: Any) -> set[datetime | None]:
        async with db.read() as conn:
            return {r[0] for r in await conn.execute(select(column).select_from(executions))}

    # While they run, a run's start is its chunk's marker's (what readers show); each row holds
    # its own once the write that finishes it has been made.
    assert await stamped(markers.started_at()) == {slot}, "started when the bodies started"

    async def completed() -> bool:
        rows = await recorded(db)
        return [status for status, _ in rows.values()] == ["COMPLETED"] * 40

    await wait_for(completed, what="every outcome written")
    assert await stamped(executions.c.started_at) == {slot}, "each row's own start: the slot"


async def test_a_slot_of_a_job_whose_row_is_gone_is_closed_and_the_others_are_decided(
    db: Database,
) -> None:
    """A removed runtime schedule's row is gone: its slot is closed, the batch goes on."""
    await register(db, ["known"])
    decided = await batch_store.claim_many(
        db, [due("known"), due("ghost")], instance_id="me", now=NOW
    )
    assert decided.taken == {"ghost"}
    assert set(decided.claims) == {"known"}
    assert {name for name, _ in await recorded(db)} == {"known"}


async def test_rows_another_claimer_holds_are_handed_back_undecided(
    db: Database, backend: str
) -> None:
    await register(db, ["free", "held"])
    async with db.engine.connect() as conn:
        if backend == "sqlite":
            async with conn.begin():  # the whole database is the lock
                with pytest.raises(RowBusy):
                    await batch_store.claim_many(
                        db, [due("free"), due("held")], instance_id="me", now=NOW
                    )
            return
        async with conn.begin():
            await conn.execute(
                text("SELECT name FROM scheduler_jobs WHERE name = 'held' FOR UPDATE")
            )
            loop = asyncio.get_running_loop()
            started = loop.time()
            decided = await batch_store.claim_many(
                db, [due("free"), due("held")], instance_id="me", now=NOW
            )
            waited = loop.time() - started
    # Waiting for the lock would have ended only at the session's lock limit, as RowBusy.
    limit = db.dialect.limits.lock_wait
    assert waited < limit / 2, f"the batch waited {waited:.2f} s for a held row (limit {limit} s)"
    assert set(decided.claims) == {"free"}
    assert [i.job_name for i in decided.held] == ["held"]
    assert set(await recorded(db)) == {("free", SLOT.isoformat())}


async def test_two_claimers_racing_for_a_burst_decide_each_slot_once(db: Database) -> None:
    names = [f"job-{i}" for i in range(300)]
    await register(db, names)

    def claimer(instance: str) -> Claimer:
        return Claimer(
            Collaborators(db=db, clock=SystemClock(), instance_id=instance), default_lease=60
        )

    a, b = claimer("a"), claimer("b")
    items = [due(n) for n in names]
    give_up_at = datetime.now(UTC) + timedelta(seconds=30)
    first, second = await asyncio.gather(
        a.claim_many(items, give_up_at=give_up_at),
        b.claim_many(list(reversed(items)), give_up_at=give_up_at),
    )
    assert not set(first.claims) & set(second.claims)
    # Whatever neither decided in the batch was handed back for one-by-one claims.
    decided = set(first.claims) | set(second.claims)
    handed_back = {i.job_name for i in first.held + second.held}
    assert decided | handed_back == set(names)
    assert len(await recorded(db)) == len(decided)


async def test_the_read_of_open_slots_keeps_exactly_the_slots_no_instance_decided(
    db: Database,
) -> None:
    """What a shared burst's chunk claims once it reads first: a slot another instance
    decided is dropped, a job decided only up to an earlier slot is kept, so is one never
    decided and a later slot of a decided job; a job whose row is gone is dropped."""
    await register(db, ["decided", "earlier", "never"])
    await batch_store.claim_many(db, [due("decided")], instance_id="other", now=NOW)
    earlier = SLOT - timedelta(minutes=1)
    await batch_store.claim_many(db, [due("earlier", earlier)], instance_id="other", now=NOW)
    items = [due("decided"), due("earlier"), due("never"), due("ghost"), due("decided", NEXT)]
    open_ = await batch_store.open_among(db, items)
    assert [(i.job_name, i.slot) for i in open_] == [
        ("earlier", SLOT),
        ("never", SLOT),
        ("decided", NEXT),
    ]


async def test_a_burst_another_instance_claimed_costs_this_one_a_read_per_chunk_left(
    db: Database, services: Services
) -> None:
    """Instances sharing a burst: once a chunk comes back with slots another instance took,
    each later chunk's open slots are read first (no lock, no write), and only those claimed.
    Here another instance took the whole burst: the chunks claimed before that was known are
    the only claim transactions; the others claim nothing, and every permit comes back."""
    names = [f"shared-{i:04d}" for i in range(4 * burst.BATCH_SIZE)]
    await register(db, names)
    for begin in range(0, len(names), burst.BATCH_SIZE):
        chunk = [due(n) for n in names[begin : begin + burst.BATCH_SIZE]]
        await batch_store.claim_many(db, chunk, instance_id="other", now=NOW)
    registry = Registry()

    def make(name: str) -> None:
        @cron("* * * * *", name=name, registry=registry)
        async def job() -> None: ...

    for name in names:
        make(name)
    service = services.make(
        list(registry), ManualClock(NOW), instance_id="me", max_concurrency=len(names)
    )
    try:
        jobs_by_name = {job.name: job for job in service.jobs}
        await service.planner.burst.fire_together([(jobs_by_name[n], SLOT) for n in names])
        stats = service.claimer.stats
        assert stats.batches == burst.CHUNKS_IN_FLIGHT, "a claim transaction per chunk left"
        assert stats.claims == 0 and stats.taken == len(names)
        # Every permit back, none twice (asking for more than there are takes what is free).
        assert await service.firing.permits.take_up_to(len(names) + 5) == len(names)
    finally:
        await service.db.close()
    rows = await recorded(db)
    assert len(rows) == len(names)
    async with db.read() as conn:
        mine = await conn.scalar(
            select(func.count()).select_from(executions).where(executions.c.instance_id == "me")
        )
    assert mine == 0


def burst_of(prefix: str, count: int, ran: list[str]) -> list[Job]:
    """``count`` jobs due every ten seconds, each recording its name in ``ran`` as it runs."""
    registry = Registry()

    def make(i: int) -> None:
        @cron("*/10 * * * * *", name=f"{prefix}-{i}", registry=registry)
        async def job(ctx: JobContext) -> None:
            ran.append(ctx.job)

    for i in range(count):
        make(i)
    return list(registry)


async def test_a_burst_with_a_held_row_still_runs_every_slot_once(
    db: Database, backend: str, start_service: ServiceFactory
) -> None:
    """A row held while the burst is claimed is claimed on its own once free: not dropped."""
    if backend == "sqlite":
        pytest.skip("SQLite has no row locks: its claims queue for the database-wide lock")
    ran: list[str] = []
    t0 = datetime(2026, 11, 22, 0, 0, 5, tzinfo=UTC)
    clock = ManualClock(t0)
    service = await start_service(burst_of("burst", 40, ran), clock=clock)
    held, release = asyncio.Event(), asyncio.Event()
    holder = asyncio.create_task(hold_job_row(db, backend, held, release, name="burst-7"))
    await held.wait()
    await clock.set(t0 + timedelta(seconds=5))
    await wait_for(lambda: len(ran) == 39, what="every job but the held one to run")
    assert "burst-7" not in ran
    release.set()
    await holder
    await wait_for(lambda: len(ran) == 40, what="the held job to run once free")
    assert sorted(ran) == sorted(f"burst-{i}" for i in range(40))
    assert service.claimer.stats.busy_retries > 0
    rows = await recorded(db)
    assert len(rows) == 40


async def test_a_burst_whose_rows_stay_held_is_claimed_together_again_not_one_by_one(
    db: Database, backend: str, start_service: ServiceFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows held past the batch's own retries (under overload: this instance's transaction
    recording missed slots of the same jobs) are claimed in one batch more once free: one claim
    each would put an overloaded instance further behind every second."""
    if backend == "sqlite":
        pytest.skip("SQLite has no row locks: its claims queue for the database-wide lock")
    monkeypatch.setattr(claims, "HELD_TRIES_MAX", 2)  # the batch's own retries end at once
    ran: list[str] = []
    t0 = datetime(2026, 11, 22, 0, 0, 5, tzinfo=UTC)
    clock = ManualClock(t0)
    service = await start_service(burst_of("held", 20, ran), clock=clock)
    burst_ = service.planner.burst
    held, release = asyncio.Event(), asyncio.Event()
    holder = asyncio.create_task(hold_job_row(db, backend, held, release))  # every job's row
    await held.wait()
    again: list[int] = []
    one_by_one: list[str] = []
    together, alone = burst_.fire_together, service.firing.fire

    async def fire_together(due: list[tuple[Any, datetime]], *, held_together: bool = True) -> None:
        if not held_together:  # the second round: the rows are free by now
            again.append(len(due))
            release.set()
            await holder
        await together(due, held_together=held_together)

    async def fire(job: Any, slot: datetime) -> None:
        one_by_one.append(job.name)
        await alone(job, slot)

    monkeypatch.setattr(burst_, "fire_together", fire_together)
    monkeypatch.setattr(service.firing, "fire", fire)
    await clock.set(t0 + timedelta(seconds=5))
    await wait_for(lambda: len(ran) == 20, what="every job to run once its row was free")
    assert sorted(ran) == sorted(f"held-{i}" for i in range(20))
    assert sum(again) == 20 and one_by_one == [], (again, one_by_one)
    assert len(await recorded(db)) == 20


async def test_a_claim_under_way_when_shutdown_begins_is_sent_once_and_not_retried(
    db: Database, backend: str
) -> None:
    """Shutdown's phase 1 lets claims under way finish (slotcron.service.shutdown): a burst's
    chunk sent once the instance is closing still decides its slots; only its retries stop.
    Chunks left unsent by a SIGTERM a few milliseconds after their slot left up to 75 slots of
    the stopping member's share to the others, which claimed them past their grace (MISSED)."""
    await register(db, ["a", "b", "c"])
    clock = ManualClock(NOW)
    claimer = Claimer(Collaborators(db=db, clock=clock, instance_id="me"), default_lease=60)
    claimer.closing = True
    decided = await claimer.claim_many([due("a"), due("b")], give_up_at=NEXT)
    assert set(decided.claims) == {"a", "b"}
    assert await recorded(db) == {
        ("a", SLOT.isoformat()): ("RUNNING", None),
        ("b", SLOT.isoformat()): ("RUNNING", None),
    }
    if backend == "sqlite":
        return  # no row locks: a held row is the database-wide lock, waited for, not retried
    held, release = asyncio.Event(), asyncio.Event()
    holder = asyncio.create_task(hold_job_row(db, backend, held, release, name="c"))
    await held.wait()
    try:
        batches = claimer.stats.batches
        decided = await claimer.claim_many([due("c")], give_up_at=NEXT)
        assert [item.job_name for item in decided.held] == ["c"] and not decided.claims
        assert claimer.stats.batches == batches + 1, "a held row retried while closing"
    finally:
        release.set()
        await holder


async def test_outcomes_recorded_together_touch_only_this_instances_running_runs(
    db: Database,
) -> None:
    await register(db, ["mine", "also-mine", "theirs", "abandoned"])
    mine = await batch_store.claim_many(
        db, [due("mine"), due("also-mine"), due("abandoned")], instance_id="me", now=NOW
    )
    theirs = await batch_store.claim_many(db, [due("theirs")], instance_id="them", now=NOW)
    abandoned = mine.claims["abandoned"].execution_id
    async with db.transaction() as conn:
        await conn.execute(
            update(executions).where(executions.c.id == abandoned).values(status="ABANDONED")
        )
    keys = {name: c.key for name, c in {**mine.claims, **theirs.claims}.items()}
    done = await run_store.finish_many(
        db,
        [
            (keys["mine"], "COMPLETED", None),
            (keys["also-mine"], "FAILED", "boom"),
            (keys["theirs"], "COMPLETED", None),
            (keys["abandoned"], "COMPLETED", None),
        ],
        instance_id="me",
        now=NOW + timedelta(seconds=1),
    )
    assert done == {keys["mine"][0], keys["also-mine"][0]}
    rows = await recorded(db)
    slot = SLOT.isoformat()
    assert rows[("mine", slot)] == ("COMPLETED", None)
    assert rows[("also-mine", slot)] == ("FAILED", "boom")
    assert rows[("theirs", slot)] == ("RUNNING", None)
    assert rows[("abandoned", slot)][0] == "ABANDONED"


async def test_an_outcome_is_written_only_to_the_row_of_its_whole_key_never_by_id_alone(
    db: Database,
) -> None:
    # After a failover that lost the last commits, the id sequence starts behind: an id this
    # instance holds in memory may now name another run's row, even one of its own.
    await register(db, ["lost", "other"])
    mine = await batch_store.claim_many(db, [due("other")], instance_id="me", now=NOW)
    other = mine.claims["other"]
    reused_id, _, slot, attempt = other.key
    stale = (reused_id, "lost", slot, attempt)  # the run whose claim the failover lost
    for key in (stale, (reused_id, "other", slot + timedelta(seconds=1), attempt)):
        assert (
            await run_store.finish_many(
                db, [(key, "COMPLETED", None)], instance_id="me", now=NOW + timedelta(seconds=1)
            )
            == set()
        )
        assert not await run_store.finish(
            db, run=key, instance_id="me", status="FAILED", now=NOW, error="stale"
        )
        assert not await run_store.save_state(db, run=key, instance_id="me", state={"x": 1})
        assert (
            await run_store.stop_all(db, runs=[key], instance_id="me", now=NOW, reason="stale") == 0
        )
    assert (
        await run_store.renew(
            db,
            instance_id="me",
            now=NOW,
            lease_counts={other.lease_ms or 0: 1},
            instance_state="running",
            ours=[stale],
        )
        == set()
    )
    assert (await recorded(db))[("other", SLOT.isoformat())] == ("RUNNING", None)
    assert await run_store.finish_many(
        db, [(other.key, "COMPLETED", None)], instance_id="me", now=NOW + timedelta(seconds=1)
    ) == {reused_id}
