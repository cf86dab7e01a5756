"""What the store conformance tests share: fixed instants, job rows, and reading tables back."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from slotcron import JobContext
from slotcron.jobs.registry import Registry, task
from slotcron.jobs.schedules import ScheduleRecord
from slotcron.store import batch, registrations, schedules
from slotcron.store.batch import Due
from slotcron.store.database import Database
from slotcron.store.registrations import JobRow
from slotcron.store.tables import executions, jobs, start_markers
from sqlalchemy import ColumnElement, Table, insert, select, update

SLOT = datetime(2026, 11, 22, 0, 10, tzinfo=UTC)
"""A slot in the manual clock's time (the ``db`` fixture judges leases by the ``now`` given)."""
NOW = SLOT + timedelta(milliseconds=3)
EARLY = SLOT - timedelta(milliseconds=40)
"""Before SLOT: a claim now is a claim ahead of its slot."""
NEXT = SLOT + timedelta(minutes=1)
LEASE_MS = 60_000
LEASE = timedelta(milliseconds=LEASE_MS)

ODD = datetime(2026, 11, 22, 5, 40, 7, 123457, tzinfo=timezone(timedelta(hours=5, minutes=30)))
"""An instant given in another zone, with microseconds: stored and read back as the same
instant, in UTC, to the microsecond."""


def is_utc(moment: datetime | None) -> bool:
    return moment is not None and moment.tzinfo is not None and moment.utcoffset() == timedelta(0)


async def register(
    db: Database,
    *names: str,
    schedule: str = "* * * * *",
    options: dict[str, Any] | None = None,
    now: datetime = NOW,
    first_slot: datetime | None = None,
) -> None:
    """Code jobs, registered as an instance registers them."""
    rows = [
        JobRow(
            name=name,
            kind="cron",
            schedule=schedule,
            timezone="UTC",
            options=dict(options or {}),
            first_slot=first_slot,
        )
        for name in names
    ]
    await registrations.register_jobs(db, rows, now=now, instance_id="test", version="test")


async def set_job(db: Database, name: str, **values: Any) -> None:
    async with db.transaction() as conn:
        await conn.execute(update(jobs).where(jobs.c.name == name).values(**values))


async def job_row(db: Database, name: str) -> dict[str, Any]:
    async with db.read() as conn:
        result = await conn.execute(select(jobs).where(jobs.c.name == name))
        return dict(result.mappings().one())


async def run_row(db: Database, execution_id: int) -> dict[str, Any]:
    async with db.read() as conn:
        result = await conn.execute(select(executions).where(executions.c.id == execution_id))
        return dict(result.mappings().one())


async def table_rows(
    db: Database, table: Table, *where: ColumnElement[bool], order: Any = None
) -> list[dict[str, Any]]:
    """Every row of ``table`` (those ``where`` selects), in ``order`` (default: its key)."""
    keys = list(table.primary_key.columns) if order is None else [order]
    async with db.read() as conn:
        result = await conn.execute(select(table).where(*where).order_by(*keys))
        return [dict(r) for r in result.mappings()]


async def statuses(db: Database) -> dict[int, str]:
    """Every execution's status, by id."""
    return {r["id"]: r["status"] for r in await table_rows(db, executions)}


async def add_run(
    db: Database,
    job: str = "job",
    slot: datetime = SLOT,
    *,
    status: str = "RUNNING",
    instance: str | None = "a",
    attempt: int = 1,
    trigger: str = "cron",
    now: datetime = NOW,
    started: bool = True,
    lease_ms: int = LEASE_MS,
    **values: Any,
) -> int:
    """Insert an execution row as a claim (``RUNNING``), the queue (``QUEUED``) or an outcome
    would have left it; returns its id."""
    running = status == "RUNNING"
    finished = status not in ("RUNNING", "QUEUED")
    row: dict[str, Any] = {
        "job_name": job,
        "scheduled_at": slot,
        "trigger": trigger,
        "status": status,
        "attempt": attempt,
        "instance_id": instance if status != "QUEUED" else None,
        "created_at": now,
        "available_at": now if status == "QUEUED" else None,
        "started_at": now if (running and started) or finished else None,
        "heartbeat_at": now if running else None,
        "lease_until": now + timedelta(milliseconds=lease_ms) if running else None,
        "lease_ms": lease_ms if running else None,
        "finished_at": now if finished else None,
        "params": {},
        "state": {},
    }
    row.update(values)
    async with db.transaction() as conn:
        result = await conn.execute(insert(executions).values(**row))
    return int(result.inserted_primary_key[0])  # type: ignore[index]


async def markers_of(db: Database) -> list[tuple[str, str | None, datetime | None, bool]]:
    async with db.read() as conn:
        rows = await conn.execute(select(start_markers).order_by(start_markers.c.start_key))
        return [(r.start_key, r.instance_id, r.started_at, bool(r.handed_back)) for r in rows]


def due(name: str, slot: datetime = SLOT, *, forbid: bool = True, **kw: Any) -> Due:
    """One job's slot for a batch claim."""
    return Due(
        job_name=name,
        slot=slot,
        following=slot + timedelta(minutes=1),
        trigger="cron",
        lease_ms=LEASE_MS,
        forbid_overlap=forbid,
        **kw,
    )


async def claim_ahead(
    db: Database, *names: str, instance: str = "me", now: datetime = EARLY
) -> tuple[str, dict[str, int]]:
    """Claim ``names`` ahead of SLOT in one batch: their chunk's start key, and each one's run."""
    decided = await batch.claim_many(db, [due(n) for n in names], instance_id=instance, now=now)
    keys = {decided.start_keys[n] for n in names}
    assert len(keys) == 1, decided
    assert all(not decided.claims[n].started for n in names)
    return keys.pop(), {n: decided.claims[n].execution_id for n in names}


TASK = "tests.report"


def task_registry(*names: str, **options: Any) -> Registry:
    """A registry of ``@task`` functions, one per name (options shared)."""
    registry = Registry()
    for name in names:

        async def body(ctx: JobContext) -> None:
            pass

        task(name=name, registry=registry, **options)(body)
    return registry


async def record_tasks(
    db: Database,
    *names: str,
    instance: str = "test",
    now: datetime = NOW,
    **options: Any,
) -> None:
    """Record ``names`` as an instance of the task code records them at its start."""
    registry = task_registry(*names, **options)
    await schedules.register_tasks(
        db, registry.tasks(), now=now, instance_id=instance, version="test"
    )


async def add_schedules(
    db: Database, *items: dict[str, Any], now: datetime = NOW, by: str = "test"
) -> list[ScheduleRecord]:
    """Store schedules of recorded tasks, as the CLI, the API and the client do."""
    return await schedules.create(
        db, items, default_timezone="UTC", by=by, registry=Registry(), now=now
    )


def differs_on(request: pytest.FixtureRequest, backend: str, on: str, reason: str) -> None:
    """The test's promise does not hold on backend ``on``: a finding (reported), kept as a
    strict xfail there, so that the day it holds the test says so."""
    if backend == on:
        request.applymarker(pytest.mark.xfail(strict=True, reason=reason))


def nested(depth: int) -> Any:
    """A JSON value of ``depth`` nested arrays."""
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value
