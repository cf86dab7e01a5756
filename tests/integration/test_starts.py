"""A run's start, written before its body: ``started_at`` is when the body started on every
path, a run that never started has none, a pause committed before the slot is honoured by a run
claimed ahead, and a run claimed ahead that never started is handed back, never lost, never run
twice. On every backend, with the manual clock."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from slotcron import JobContext
from slotcron.clock import ManualClock
from slotcron.jobs.registry import Registry, cron, every
from slotcron.store import batch as batch_store
from slotcron.store import lifeline, operations, starts
from slotcron.store.database import Database
from slotcron.store.tables import executions, jobs
from sqlalchemy import select, update

from tests.conftest import ServiceFactory, wait_for
from tests.integration.test_batch_claims import SLOT, due, register

EARLY = SLOT - timedelta(milliseconds=40)
LEASE = timedelta(seconds=60)


async def row_of(db: Database, execution_id: int) -> dict[str, object]:
    async with db.read() as conn:
        result = await conn.execute(select(executions).where(executions.c.id == execution_id))
        return dict(result.mappings().one())


async def claim_ahead(db: Database, name: str, instance: str = "me") -> int:
    decided = await batch_store.claim_many(db, [due(name)], instance_id=instance, now=EARLY)
    claim = decided.claims[name]
    assert claim.status == "RUNNING" and not claim.started
    return claim.execution_id


async def set_paused(db: Database, name: str, paused: bool) -> None:
    async with db.transaction() as conn:
        await conn.execute(update(jobs).where(jobs.c.name == name).values(paused=paused))


async def test_a_pause_committed_after_the_claim_and_before_the_slot_is_honoured(
    db: Database,
) -> None:
    await register(db, ["paused", "running"])
    paused, running = await claim_ahead(db, "paused"), await claim_ahead(db, "running")
    await set_paused(db, "paused", True)

    done = await starts.start_runs(db, [paused, running], instance_id="me", now=SLOT)

    assert done.started == {running} and done.skipped == {paused: "job is paused"}
    skipped = await row_of(db, paused)
    assert (skipped["status"], skipped["started_at"], skipped["finished_at"]) == (
        "SKIPPED",
        None,
        SLOT,
    )
    assert (await row_of(db, running))["started_at"] == SLOT


async def test_a_paused_job_claimed_ahead_runs_if_resumed_before_its_slot(db: Database) -> None:
    await register(db, ["resumed"])
    await set_paused(db, "resumed", True)
    execution_id = await claim_ahead(db, "resumed")  # not decided SKIPPED ahead of its time
    await set_paused(db, "resumed", False)

    done = await starts.start_runs(db, [execution_id], instance_id="me", now=SLOT)

    assert done.started == {execution_id}


async def test_an_unstarted_run_whose_lease_lapsed_is_handed_back_and_a_started_one_abandoned(
    db: Database,
) -> None:
    await register(db, ["unstarted", "started"])
    unstarted, started = await claim_ahead(db, "unstarted"), await claim_ahead(db, "started")
    assert (await starts.start_runs(db, [started], instance_id="me", now=SLOT)).started == {started}
    lapsed = EARLY + LEASE + timedelta(seconds=1)

    found = await lifeline.abandon_lapsed(db, now=lapsed)

    assert {(run.execution_id, run.handed_back) for run in found} == {
        (unstarted, True),
        (started, False),
    }
    back = await row_of(db, unstarted)
    # The same row, slot, trigger and attempt: nothing ran. Available at once.
    assert (back["status"], back["attempt"], back["trigger"], back["started_at"]) == (
        "QUEUED",
        1,
        "cron",
        None,
    )
    assert (back["instance_id"], back["available_at"]) == (None, lapsed)
    assert (await row_of(db, started))["status"] == "ABANDONED"
    # Its old claimer can no longer start it: the start and the hand-back exclude each other.
    late = await starts.start_runs(db, [unstarted], instance_id="me", now=lapsed)
    assert late.gone == {unstarted} and late.started == set()


async def test_a_started_run_cannot_be_handed_back(db: Database) -> None:
    await register(db, ["job"])
    execution_id = await claim_ahead(db, "job")
    await starts.start_runs(db, [execution_id], instance_id="me", now=SLOT)

    back = await lifeline.hand_back_mine(db, [execution_id], instance_id="me", now=SLOT)

    assert back == set()
    assert (await row_of(db, execution_id))["status"] == "RUNNING"


async def test_a_slot_claimed_ahead_by_a_stopping_instance_runs_on_another_at_its_time(
    db: Database, start_service: ServiceFactory, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock(datetime(2026, 11, 22, 0, 0, 5, tzinfo=UTC))
    slot = datetime(2026, 11, 22, 0, 0, 10, tzinfo=UTC)
    ran: list[tuple[str, str, int]] = []

    def registry_of(instance: str) -> Registry:
        registry = Registry()
        for i in range(5):

            def make(i: int) -> None:
                @cron("*/10 * * * * *", name=f"burst-{i}", registry=registry)
                async def job(ctx: JobContext) -> None:
                    ran.append((ctx.job, instance, ctx.attempt))

            make(i)
        return registry

    first = await start_service(list(registry_of("first")), clock=clock, instance_id="first")
    await clock.set(slot - timedelta(milliseconds=5))  # inside the lead: claimed, not started

    async def claimed() -> bool:
        async with db.read() as conn:
            rows = (await conn.execute(select(executions.c.started_at))).all()
        return len(rows) == 5 and all(r.started_at is None for r in rows)

    await wait_for(claimed, what="the burst claimed ahead")
    caplog.set_level(logging.INFO, logger="slotcron.queued")
    await first.stop()  # drain 2 s: but nothing had started, so it is handed back at once
    async with db.read() as conn:
        rows = (await conn.execute(select(executions))).all()
    assert {(r.status, r.attempt, r.started_at) for r in rows} == {("QUEUED", 1, None)}
    assert ran == []
    retaken = [r for r in caplog.records if getattr(r, "instance", None) == "first"]
    assert retaken == [], "a stopping instance takes nothing from the queue, not even its own"

    await start_service(list(registry_of("second")), clock=clock, instance_id="second")
    await clock.set(slot)
    await wait_for(lambda: len(ran) == 5, what="the handed-back slots run")
    assert sorted(ran) == [(f"burst-{i}", "second", 1) for i in range(5)]

    async def completed() -> bool:
        async with db.read() as conn:
            rows = (await conn.execute(select(executions))).all()
        return {(r.status, r.started_at, r.trigger) for r in rows} == {("COMPLETED", slot, "cron")}

    await wait_for(completed, what="each slot recorded once, started at its time")


async def test_started_at_is_when_the_body_started_on_every_path(
    db: Database, start_service: ServiceFactory
) -> None:
    """A lone slot (claimed at its time), a manual run, a jittered run: ``started_at`` is when
    its body started by the scheduler's clock, never before its slot, never after its end."""
    clock = ManualClock(datetime(2026, 11, 22, 0, 0, 5, tzinfo=UTC))
    registry = Registry()
    began: dict[str, datetime] = {}

    @every(seconds=10, name="lone", registry=registry)
    async def lone(ctx: JobContext) -> None:
        began.setdefault(f"lone {ctx.trigger}", clock.now())

    @every(seconds=15, name="jittered", jitter=2, registry=registry)
    async def jittered(ctx: JobContext) -> None:
        began.setdefault("jittered", clock.now())

    service = await start_service(list(registry), clock=clock)
    await clock.set(datetime(2026, 11, 22, 0, 0, 10, tzinfo=UTC))
    await wait_for(lambda: "lone interval" in began, what="the lone slot")
    await clock.advance(0.001)  # a manual run's slot is its own
    queued = await operations.trigger(db, job="lone", params={}, now=clock.now())
    await wait_for(lambda: "lone manual" in began, what="the manual run")
    slot = datetime(2026, 11, 22, 0, 0, 15, tzinfo=UTC)
    await clock.set(slot)  # alone at its slot too
    # Jitter: a random delay of up to 2 s by the manual clock. The clock moves once, to the
    # end of that delay and no further, so the start's stamp and the body read the same time.
    ends = await wait_for(
        lambda: clock.asleep("slotcron-jittered") or None, what="the jittered run asleep"
    )
    assert slot <= ends[0] <= slot + timedelta(seconds=2)
    await clock.set(ends[0])
    await wait_for(lambda: "jittered" in began, what="the jittered body")

    async def finished() -> list[Any] | None:
        async with db.read() as conn:
            rows = (await conn.execute(select(executions))).all()
        done = [r for r in rows if r.status == "COMPLETED"]
        return done if len(done) == 3 else None

    rows = await wait_for(finished, what="three runs recorded")
    by_kind = {("lone manual" if r.trigger == "manual" else r.job_name): r for r in rows}
    assert by_kind["lone"].started_at == began["lone interval"]
    assert by_kind["lone manual"].id == queued.execution_id
    assert by_kind["lone manual"].started_at == began["lone manual"]
    assert by_kind["jittered"].started_at == began["jittered"]
    assert by_kind["jittered"].started_at > by_kind["jittered"].scheduled_at
    for r in rows:
        assert r.scheduled_at <= r.started_at <= r.finished_at
    assert len(service.runs) == 0
