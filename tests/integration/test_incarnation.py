"""A process that resumes after another took its instance id over (issue 11): its heartbeat
(and its watchdog, while a job blocks the loop) notices that the instance row names another
incarnation, renews nothing, fences every run it holds, says so at ERROR and shuts the service
down to exit 1; the process now holding the id keeps none of the old one's runs alive. Real
databases, the manual clock (the watchdog's test blocks the loop for real: that is its case)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from slotcron.clock import ManualClock
from slotcron.jobs.registry import Registry, every
from slotcron.lifeline.heartbeat import Heartbeat
from slotcron.lifeline.inflight import CancelReason, RunHandle, Runs
from slotcron.lifeline.roles import Collaborators
from slotcron.lifeline.watchdog import STALL, Watchdog
from slotcron.observe.events import Events
from slotcron.store.database import Database
from slotcron.store.instance_ids import hold_instance_id
from slotcron.store.lifeline import abandon_orphans
from slotcron.store.tables import executions, instances
from sqlalchemy import insert, select, update

from tests.conftest import ServiceFactory, wait_for
from tests.test_fencing import handle

LAPSE = 3.0
ID = "shared-id"


async def taken_over(db: Database, clock: ManualClock) -> tuple[str, str]:
    """The old process's incarnation and the one that took the id after it fell silent."""
    old = await hold_instance_id(db, instance_id=ID, lapse=LAPSE, clock=clock)
    await clock.advance(LAPSE + 1)  # the old process is paused past the lapse
    new = await hold_instance_id(db, instance_id=ID, lapse=LAPSE, clock=clock)
    assert new != old
    return old, new


def heartbeat(db: Database, clock: ManualClock, runs: Runs, incarnation: str) -> Heartbeat:
    beat = Heartbeat(
        Collaborators(db=db, clock=clock, instance_id=ID),
        runs=runs,
        period=0.5,
        instance_state=lambda: "running",
    )
    beat.incarnation = incarnation
    return beat


async def heartbeat_at(db: Database) -> datetime:
    async with db.read() as conn:
        value = (
            await conn.execute(
                select(instances.c.heartbeat_at).where(instances.c.instance_id == ID)
            )
        ).scalar_one()
    assert isinstance(value, datetime)
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


@pytest.mark.parametrize("backend", ["sqlite", "postgresql", "mariadb"], indirect=True)
async def test_an_incarnation_whose_id_was_taken_fences_all_its_runs_and_logs_an_error(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock(datetime(2030, 1, 1, tzinfo=UTC))
    old, _ = await taken_over(db, clock)
    runs = Runs()
    run = handle(60_000, clock.monotonic())  # a long lease: not fenced by time
    runs.add(run)
    resumed = heartbeat(db, clock, runs, old)
    with caplog.at_level(logging.ERROR, logger="slotcron.heartbeat"):
        await resumed.beat()
        await resumed.beat()
    assert run.cancel_reason is CancelReason.FENCED and run.lease_lost.is_set()
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "held by another process" in errors[0], errors  # logged once
    assert resumed.id_taken


@pytest.mark.parametrize("backend", ["sqlite", "postgresql", "mariadb"], indirect=True)
async def test_only_the_incarnation_holding_the_id_renews_its_row(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    clock = ManualClock(datetime(2030, 1, 1, tzinfo=UTC))
    old, new = await taken_over(db, clock)
    taken_at = await heartbeat_at(db)
    await clock.advance(1)
    with caplog.at_level(logging.ERROR, logger="slotcron.heartbeat"):
        await heartbeat(db, clock, Runs(), old).beat()
    assert await heartbeat_at(db) == taken_at, "the process whose id was taken renewed the row"
    assert any(r.levelno == logging.ERROR for r in caplog.records)
    caplog.clear()
    holder = heartbeat(db, clock, Runs(), new)
    with caplog.at_level(logging.ERROR, logger="slotcron.heartbeat"):
        await holder.beat()
    assert await heartbeat_at(db) > taken_at
    assert not holder.id_taken and not caplog.records


LEASE_MS = 60_000  # a long lease: only what the test does can end it


def slot_at(slot: int) -> datetime:
    return datetime(2029, 1, 1, tzinfo=UTC) + timedelta(seconds=slot)


async def running_row(db: Database, clock: ManualClock, slot: int) -> tuple[int, int]:
    """A RUNNING execution under the shared id, its lease live for a minute: its id and slot
    (:func:`held`'s arguments)."""
    now = clock.now()
    async with db.transaction() as conn:
        result = await conn.execute(
            insert(executions).values(
                job_name="job",
                scheduled_at=slot_at(slot),
                trigger="interval",
                status="RUNNING",
                attempt=1,
                instance_id=ID,
                created_at=now,
                started_at=now,
                heartbeat_at=now,
                lease_until=now + timedelta(milliseconds=LEASE_MS),
                lease_ms=LEASE_MS,
            )
        )
    key = result.inserted_primary_key
    assert key is not None
    return int(key[0]), slot


async def row(db: Database, execution: tuple[int, int]) -> tuple[str, datetime]:
    """An execution's status and lease (aware UTC)."""
    execution_id, _ = execution
    async with db.read() as conn:
        status, lease_until = (
            await conn.execute(
                select(executions.c.status, executions.c.lease_until).where(
                    executions.c.id == execution_id
                )
            )
        ).one()
    return status, lease_until.replace(tzinfo=UTC) if lease_until.tzinfo is None else lease_until


def held(execution: tuple[int, int], clock: ManualClock) -> RunHandle:
    """This process's run of ``execution`` (:func:`running_row`'s id and slot)."""
    execution_id, slot = execution
    run = handle(LEASE_MS, clock.monotonic())
    run.claim = dataclasses.replace(
        run.claim, execution_id=execution_id, job_name="job", scheduled_at=slot_at(slot)
    )
    return run


@pytest.mark.parametrize("backend", ["sqlite", "postgresql", "mariadb"], indirect=True)
async def test_the_holder_of_the_id_renews_its_own_runs_never_one_an_older_incarnation_claimed(
    db: Database,
) -> None:
    clock = ManualClock(datetime(2030, 1, 1, tzinfo=UTC))
    _, new = await taken_over(db, clock)
    ours = await running_row(db, clock, 1)
    # Claimed under the id by the old process after the takeover (it resumed, has not noticed).
    theirs = await running_row(db, clock, 2)
    _, their_lease = await row(db, theirs)
    runs = Runs()
    runs.add(run := held(ours, clock))
    await clock.advance(5)
    holder = heartbeat(db, clock, runs, new)
    await holder.beat()

    assert await row(db, ours) == ("RUNNING", clock.now() + timedelta(milliseconds=LEASE_MS))
    assert run.cancel_reason is None and not holder.id_taken
    assert await row(db, theirs) == ("RUNNING", their_lease), "the older incarnation's run kept"


@pytest.mark.parametrize("backend", ["sqlite", "postgresql", "mariadb"], indirect=True)
async def test_the_runs_of_a_paused_process_are_abandoned_at_takeover_though_their_leases_live(
    db: Database,
) -> None:
    clock = ManualClock(datetime(2030, 1, 1, tzinfo=UTC))
    old = await hold_instance_id(db, instance_id=ID, lapse=LAPSE, clock=clock)
    theirs = await running_row(db, clock, 1)  # a minute's lease, longer than the id's lapse
    await clock.advance(LAPSE + 1)  # paused: the id lapses, the run's lease does not
    new = await hold_instance_id(db, instance_id=ID, lapse=LAPSE, clock=clock)
    abandoned = await abandon_orphans(db, instance_id=ID, now=clock.now())  # as at start-up
    assert [a.execution_id for a in abandoned] == [theirs[0]]
    ours = await running_row(db, clock, 2)
    runs = Runs()
    runs.add(held(ours, clock))
    await clock.advance(1)
    await heartbeat(db, clock, runs, new).beat()
    resumed = heartbeat(db, clock, Runs(), old)
    await resumed.beat()

    status, _ = await row(db, theirs)
    assert status == "ABANDONED"
    assert resumed.id_taken


def watchdog(
    db: Database, clock: ManualClock, runs: Runs, incarnation: str, told: list[str]
) -> Watchdog:
    registry = Registry()

    @every(seconds=10, name="job", registry=registry)
    async def job() -> None: ...

    return Watchdog(
        db=db,
        clock=clock,
        instance_id=ID,
        runs=runs,
        jobs=list(registry),
        period=0.5,
        events=Events(),
        instance_state=lambda: "running",
        incarnation=lambda: incarnation,
        on_id_taken=lambda: told.append("superseded"),
    )


def block_until(condition: Callable[[], object], timeout: float) -> None:
    """Block the event loop (the watchdog's case) until ``condition()`` or ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)


@pytest.mark.parametrize("backend", ["sqlite", "postgresql", "mariadb"], indirect=True)
async def test_the_watchdog_of_a_process_whose_id_was_taken_renews_nothing_and_tells_the_loop(
    db: Database,
) -> None:
    clock = ManualClock(datetime(2030, 1, 1, tzinfo=UTC))
    old, new = await taken_over(db, clock)
    mine = await running_row(db, clock, 1)
    _, lease = await row(db, mine)
    taken_at = await heartbeat_at(db)
    await clock.advance(1)
    for incarnation, renews in ((old, False), (new, True)):
        runs = Runs()
        runs.add(held(mine, clock))
        told: list[str] = []
        dog = watchdog(db, clock, runs, incarnation, told)
        dog.start()
        try:
            await asyncio.sleep(0)  # the ticker marks the loop alive once
            block_until(lambda: dog.id_taken or dog.renewals, 10 * STALL)  # noqa: B023
            await wait_for(lambda: told or renews, what="the watchdog to tell the loop")  # noqa: B023
        finally:
            await dog.stop()
        if renews:
            assert dog.renewals >= 1 and not dog.id_taken and not told
            assert await row(db, mine) == (
                "RUNNING",
                clock.now() + timedelta(milliseconds=LEASE_MS),
            )
        else:
            assert dog.id_taken and dog.renewals == 0 and told == ["superseded"]
            assert await row(db, mine) == ("RUNNING", lease), "a taken-over watchdog renewed"
            assert await heartbeat_at(db) == taken_at


@pytest.mark.parametrize("backend", ["sqlite", "postgresql", "mariadb"], indirect=True)
async def test_a_service_whose_id_was_taken_stops_claiming_shuts_down_leaving_the_row_and_exits_1(
    db: Database, start_service: ServiceFactory
) -> None:
    registry = Registry()

    @every(seconds=3600, name="idle", registry=registry)
    async def idle() -> None: ...

    service = await start_service(list(registry), heartbeat_seconds=0.1)
    async with db.transaction() as conn:  # another process took the id over
        await conn.execute(
            update(instances)
            .where(instances.c.instance_id == service.instance_id)
            .values(incarnation="another", state="running")
        )
    await wait_for(service.signals.requested.is_set, what="the shutdown to be requested")
    assert service.signals.hurry.is_set(), "a drain would wait for runs fenced anyway"
    assert service.exit_status == 1 and service.id_taken
    await service.stop(service.signals)
    async with db.read() as conn:
        incarnation, state = (
            await conn.execute(
                select(instances.c.incarnation, instances.c.state).where(
                    instances.c.instance_id == service.instance_id
                )
            )
        ).one()
    assert (incarnation, state) == ("another", "running"), "the holder's row was written"


@pytest.mark.parametrize("backend", ["sqlite", "postgresql", "mariadb"], indirect=True)
async def test_a_start_up_retried_after_it_took_the_id_takes_its_own_row_back_at_once(
    db: Database,
) -> None:
    clock = ManualClock(datetime(2030, 1, 1, tzinfo=UTC))
    mine = await hold_instance_id(db, instance_id=ID, lapse=LAPSE, clock=clock)
    # The same process again (a later start-up step failed, or the first commit's answer was
    # lost): the row names its own incarnation and a heartbeat of a moment ago. The manual
    # clock never moves, so waiting for the row to lapse would never end.
    async with asyncio.timeout(5):
        again = await hold_instance_id(
            db, instance_id=ID, lapse=LAPSE, clock=clock, incarnation=mine
        )
    assert again == mine
    with pytest.raises(TimeoutError):  # another process's incarnation still waits for it
        async with asyncio.timeout(0.5):
            await hold_instance_id(db, instance_id=ID, lapse=LAPSE, clock=clock)


@pytest.mark.parametrize("backend", ["sqlite", "postgresql", "mariadb"], indirect=True)
async def test_a_service_whose_start_up_fails_after_registering_retries_without_waiting_for_itself(
    start_service: ServiceFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    from slotcron.store import registrations
    from sqlalchemy.exc import OperationalError

    real = registrations.register_jobs
    failures: list[int] = []

    async def flaky(*args: object, **kwargs: object) -> object:
        if not failures:  # a transient error (a Galera certification conflict, say) once
            failures.append(1)
            raise OperationalError("register_jobs", {}, Exception("deadlock; try again"))
        return await real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(registrations, "register_jobs", flaky)
    registry = Registry()

    @every(seconds=3600, name="hourly", registry=registry)
    async def hourly() -> None: ...

    began = time.monotonic()
    async with asyncio.timeout(30):
        service = await start_service(list(registry), instance_id=ID, lease_seconds=20)
    assert failures == [1]
    assert time.monotonic() - began < 10, "start-up waited for its own registration"
    assert service.state == "running"
