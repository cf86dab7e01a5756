"""User hooks against real databases and a real service: each event heard once, after its write
(judged by reading the row from inside the hook), for COMPLETED, FAILED, SKIPPED, MISSED,
ABANDONED and fenced runs; a raising hook and a slow one cost a 1 s job no slot (judged by the
job's own records); ``wrap_run`` runs in the body's own task; overflow is counted."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from slotcron import Hook, JobContext, RunEvent, SlotsEvent
from slotcron.jobs.registry import Registry, every
from slotcron.observe import delivery
from slotcron.observe.events import hook_name
from slotcron.store.database import Database
from slotcron.store.tables import executions
from sqlalchemy import insert, select, update

from tests.conftest import Services, wait_for


class Recorder(Hook):
    """Every event heard, and the row's status as the hook found it when it heard it."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.started: list[RunEvent] = []
        self.finished: list[RunEvent] = []
        self.passed: list[SlotsEvent] = []
        self.row_said: dict[int, str | None] = {}

    async def run_started(self, run: RunEvent) -> None:
        self.started.append(run)

    async def run_finished(self, run: RunEvent) -> None:
        async with self.db.read() as conn:
            status = await conn.scalar(
                select(executions.c.status).where(executions.c.id == run.execution_id)
            )
        self.row_said[run.execution_id] = status
        self.finished.append(run)

    async def slots_passed(self, event: SlotsEvent) -> None:
        self.passed.append(event)

    def of(self, job: str, status: str) -> list[RunEvent]:
        return [run for run in self.finished if run.job == job and run.status == status]


async def rows(db: Database, job: str, status: str) -> list[Any]:
    async with db.read() as conn:
        query = select(executions).where(
            executions.c.job_name == job, executions.c.status == status
        )
        return list((await conn.execute(query)).all())


@pytest.mark.parametrize("backend", ["sqlite", "postgresql", "mariadb"], indirect=True)
async def test_completed_failed_and_skipped_are_each_heard_once_after_their_write(
    db: Database, services: Services
) -> None:
    registry = Registry()

    @every(seconds=1, name="h.ok", registry=registry)
    async def ok() -> None:
        pass

    @every(seconds=1, name="h.broken", registry=registry)
    async def broken() -> None:
        raise RuntimeError("broken on purpose")

    @every(seconds=1, name="h.long", registry=registry)  # overlaps its next slot: SKIPPED
    async def long() -> None:
        await asyncio.sleep(1.5)

    recorder = Recorder(db)
    service = await services.start(list(registry), hooks=[recorder])
    await wait_for(
        lambda: (
            len(recorder.of("h.ok", "COMPLETED")) >= 2
            and len(recorder.of("h.broken", "FAILED")) >= 2
            and any(e.job == "h.long" and e.status == "SKIPPED" for e in recorder.passed)
        ),
        timeout=20,
        what="completed, failed and skipped events",
    )
    await service.stop()
    for job, status in (("h.ok", "COMPLETED"), ("h.broken", "FAILED"), ("h.long", "COMPLETED")):
        heard = [run.execution_id for run in recorder.of(job, status)]
        assert sorted(heard) == sorted(row.id for row in await rows(db, job, status))
    for run in recorder.finished:
        assert recorder.row_said[run.execution_id] == run.status, "heard before its write"
        assert run.instance_id == service.instance_id and not run.fenced
        assert run.started_at is not None and run.finished_at is not None
        assert run.duration_seconds is not None and run.lag_seconds is not None
    failed = recorder.of("h.broken", "FAILED")[0]
    assert failed.error is not None and "RuntimeError: broken on purpose" in failed.error
    assert {run.execution_id for run in recorder.started} >= {
        run.execution_id for run in recorder.finished
    }
    skipped = await rows(db, "h.long", "SKIPPED")
    # (A slot that came while the service started may be MISSED, past its grace: heard as such.)
    passed = [e for e in recorder.passed if e.job == "h.long" and e.status == "SKIPPED"]
    assert sorted(e.first for e in passed) == sorted(row.scheduled_at for row in skipped)
    assert all(e.count == 1 and e.reason for e in passed)


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_missed_slots_are_heard_as_recorded(db: Database, services: Services) -> None:
    registry = Registry()

    @every(seconds=1, name="h.missable", registry=registry)
    async def missable() -> None:
        pass

    first = await services.start(list(registry))
    await wait_for(lambda: rows(db, "h.missable", "COMPLETED"), what="a first run")
    await first.stop()
    stopped_at = time.monotonic()
    await wait_for(lambda: time.monotonic() - stopped_at > 3.5, what="three slots to pass")
    recorder = Recorder(db)
    second = await services.start(list(registry), hooks=[recorder])

    async def heard_all() -> bool:
        missed = await rows(db, "h.missable", "MISSED")
        return bool(missed) and len([e for e in recorder.passed if e.status == "MISSED"]) == len(
            missed
        )

    await wait_for(heard_all, timeout=15, what="every MISSED record heard")
    await second.stop()  # nothing more is recorded, every event is delivered
    missed = await rows(db, "h.missable", "MISSED")
    heard = [e for e in recorder.passed if e.status == "MISSED"]
    assert sorted(e.first for e in heard) == sorted(row.scheduled_at for row in missed)
    assert all(e.reason and "misfire" in e.reason for e in heard)


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"], indirect=True)
async def test_an_abandoned_run_is_heard_from_the_instance_that_recorded_it(
    db: Database, services: Services
) -> None:
    registry = Registry()

    @every(seconds=3600, name="h.ghostly", registry=registry)
    async def ghostly() -> None:
        pass

    # Minutes ago, not years: the history's pruning deletes a finished row created before the
    # retention, and would take the ABANDONED row before the hook reads it back.
    old = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=5)
    async with db.transaction() as conn:
        inserted = await conn.execute(
            insert(executions).values(
                job_name="h.ghostly",
                scheduled_at=old,
                trigger="interval",
                status="RUNNING",
                attempt=1,
                instance_id="ghost",
                created_at=old,
                started_at=old,  # its body started: not handed back but ABANDONED
                lease_until=old + timedelta(minutes=1),
                lease_ms=60_000,
                params={"region": "eu"},
            )
        )
    assert inserted.inserted_primary_key is not None
    ghost = inserted.inserted_primary_key[0]
    recorder = Recorder(db)
    await services.start(list(registry), hooks=[recorder])
    abandoned = await wait_for(
        lambda: recorder.of("h.ghostly", "ABANDONED"), timeout=20, what="the ABANDONED event"
    )
    assert [run.execution_id for run in abandoned] == [ghost]
    heard = abandoned[0]
    assert heard.instance_id == "ghost" and heard.scheduled_at == old
    assert (heard.attempt, heard.trigger, heard.started_at) == (1, "interval", old)
    assert heard.params == {"region": "eu"} and "ghost" in (heard.error or "")
    assert recorder.row_said[ghost] == "ABANDONED"


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"], indirect=True)
async def test_a_run_whose_record_was_taken_is_heard_as_fenced(
    db: Database, services: Services
) -> None:
    registry = Registry()
    taken: list[int] = []

    @every(seconds=1, name="h.fenced", registry=registry)
    async def fenced(ctx: JobContext) -> None:
        if taken:
            return
        async with db.transaction() as conn:  # the cluster recorded it otherwise meanwhile
            await conn.execute(
                update(executions)
                .where(executions.c.id == ctx.execution_id)
                .values(status="ABANDONED", error="taken by the test")
            )
        taken.append(ctx.execution_id)

    recorder = Recorder(db)
    await services.start(list(registry), hooks=[recorder])
    await wait_for(lambda: [r for r in recorder.finished if r.fenced], what="a fenced event")
    run = next(r for r in recorder.finished if r.fenced)
    assert run.execution_id == taken[0] and run.status == "COMPLETED"
    assert [r.execution_id for r in recorder.finished].count(taken[0]) == 1


class Raising(Hook):
    def __init__(self) -> None:
        self.calls = 0

    async def run_finished(self, run: RunEvent) -> None:
        self.calls += 1
        raise RuntimeError("a hook that always raises")


class Slow(Hook):
    def __init__(self) -> None:
        self.heard = 0

    async def run_started(self, run: RunEvent) -> None:
        await asyncio.sleep(5)
        self.heard += 1

    async def run_finished(self, run: RunEvent) -> None:
        await asyncio.sleep(5)
        self.heard += 1


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"], indirect=True)
async def test_a_raising_hook_and_a_slow_one_cost_a_one_second_job_no_slot(
    db: Database, services: Services
) -> None:
    registry = Registry()

    @every(seconds=1, name="h.steady", registry=registry)
    async def steady() -> None:
        pass

    raising, slow = Raising(), Slow()
    await services.start(list(registry), hooks=[raising, slow])
    await wait_for(
        lambda: raising.calls >= 6 and slow.heard >= 1, timeout=20, what="six slots and a late hook"
    )
    async with db.read() as conn:
        runs = (
            await conn.execute(
                select(executions)
                .where(executions.c.job_name == "h.steady")
                .order_by("scheduled_at")
            )
        ).all()
    assert {run.status for run in runs} <= {"COMPLETED", "RUNNING"}, "no slot skipped or missed"
    slots = [run.scheduled_at for run in runs]
    assert all((b - a).total_seconds() == 1 for a, b in itertools.pairwise(slots))
    lags = [(run.started_at - run.scheduled_at).total_seconds() for run in runs if run.started_at]
    assert max(lags) < 2.5, f"a job waited for a 5 s hook: {lags}"
    assert raising.calls >= 6, "a raising hook keeps receiving events"


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_wrap_run_is_entered_around_the_body_in_its_own_task(
    db: Database, services: Services
) -> None:
    registry = Registry()
    seen: dict[str, Any] = {}

    @every(seconds=1, name="h.wrapped", registry=registry)
    async def wrapped() -> None:
        seen.setdefault("body", asyncio.current_task())
        raise ValueError("the body's own error")

    class Around(Hook):
        @asynccontextmanager
        async def _wrap(self, ctx: JobContext) -> AsyncIterator[None]:
            seen.setdefault("entered", (asyncio.current_task(), ctx.job))
            try:
                yield
            except ValueError as exc:
                seen.setdefault("saw", str(exc))
                raise

        def wrap_run(self, ctx: JobContext) -> Any:
            return self._wrap(ctx)

    class Broken(Hook):
        def wrap_run(self, ctx: JobContext) -> Any:
            raise RuntimeError("a wrapper that fails on entry")

    await services.start(list(registry), hooks=[Broken(), Around()])
    await wait_for(lambda: rows(db, "h.wrapped", "FAILED"), what="a run of the wrapped job")
    assert seen["entered"] == (seen["body"], "h.wrapped"), "entered in the body's own task"
    assert seen["saw"] == "the body's own error"
    failed = await rows(db, "h.wrapped", "FAILED")
    assert "ValueError: the body's own error" in failed[0].error


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_events_past_a_hooks_queue_are_dropped_counted_and_logged_once(
    db: Database,
    services: Services,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(delivery, "QUEUE_LIMIT", 2)
    registry = Registry()

    @every(seconds=1, name="h.busy", registry=registry)
    async def busy() -> None:
        pass

    class Stuck(Hook):
        async def run_finished(self, run: RunEvent) -> None:
            await asyncio.Event().wait()

    stuck = Stuck()
    service = await services.start(list(registry), hooks=[stuck], http_port=0)
    name = hook_name(stuck)

    def dropped() -> float:
        return (
            service.metrics.registry.get_sample_value(  # type: ignore[attr-defined]
                "slotcron_hook_events_dropped_total", {"hook": name}
            )
            or 0.0
        )

    await wait_for(lambda: dropped() >= 2, timeout=20, what="two events dropped")
    assert len(await rows(db, "h.busy", "COMPLETED")) >= 4, "the runs went on"
    told = [r for r in caplog.records if "further events are dropped" in r.getMessage()]
    assert len(told) == 1
    started = time.monotonic()
    await service.stop()
    assert time.monotonic() - started < 10, "a stuck hook costs shutdown its drain, no more"
