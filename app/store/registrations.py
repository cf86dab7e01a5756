"""Who is here: job rows (one per job name) and instance rows (one per live or recent instance)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select, update

from app.store import leadership
from app.store.database import Database
from app.store.tables import instances, jobs

_CHUNK = 500


@dataclass(frozen=True)
class StoredJob:
    kind: str
    schedule: str
    timezone: str
    next_slot_at: datetime | None
    updated_by: str | None
    version: str | None
    schedules: dict[str, str]


@dataclass(frozen=True)
class JobRow:
    name: str
    kind: str
    schedule: str
    timezone: str
    options: dict[str, Any]
    first_slot: datetime | None = None


async def register_jobs(
    db: Database, rows: Sequence[JobRow], *, now: datetime, instance_id: str, version: str
) -> dict[str, StoredJob]:
    """Insert new job rows and refresh the definition of known ones; return what the cluster
    had stored for each before (schedule and the slot it expects next).

    Never touches ``paused``, ``last_slot_at`` or ``next_slot_at``: those belong to the
    cluster, not to whichever instance started last.
    """
    stored: dict[str, StoredJob] = {}
    names = [row.name for row in rows]
    for start in range(0, len(names), _CHUNK):
        async with db.read() as conn:
            found = await conn.execute(
                select(
                    jobs.c.name,
                    jobs.c.kind,
                    jobs.c.schedule,
                    jobs.c.timezone,
                    jobs.c.next_slot_at,
                    jobs.c.updated_by,
                    jobs.c.version,
                    jobs.c.schedules,
                ).where(jobs.c.name.in_(names[start : start + _CHUNK]))
            )
            for r in found:
                stored[r.name] = StoredJob(
                    r.kind,
                    r.schedule,
                    r.timezone,
                    r.next_slot_at,
                    r.updated_by,
                    r.version,
                    dict(r.schedules or {}),
                )
    for start in range(0, len(rows), _CHUNK):
        values = [
            {
                "name": row.name,
                "kind": row.kind,
                "schedule": row.schedule,
                "timezone": row.timezone,
                "options": row.options,
                "paused": False,
                "last_slot_at": None,
                "next_slot_at": row.first_slot,
                "registered_at": now,
                "updated_at": now,
                "updated_by": instance_id,
                "version": version,
                "schedules": {
                    **(stored[row.name].schedules if row.name in stored else {}),
                    version: f"{row.schedule} ({row.timezone})",
                },
            }
            for row in rows[start : start + _CHUNK]
        ]
        stmt = db.dialect.upsert(
            jobs,
            values,
            keys=["name"],
            update=[
                "kind",
                "schedule",
                "timezone",
                "options",
                "updated_at",
                "updated_by",
                "version",
                "schedules",
            ],
        )
        async with db.transaction() as conn:
            await conn.execute(stmt)
    return stored


async def register_instance(
    db: Database, *, instance_id: str, host: str, pid: int, version: str, now: datetime
) -> None:
    stmt = db.dialect.upsert(
        instances,
        [
            {
                "instance_id": instance_id,
                "host": host,
                "pid": pid,
                "version": version,
                "started_at": now,
                "heartbeat_at": now,
                "state": "running",
                "is_leader": False,
            }
        ],
        keys=["instance_id"],
        update=["host", "pid", "version", "started_at", "heartbeat_at", "state"],
    )
    async with db.transaction() as conn:
        await conn.execute(stmt)


async def set_instance_state(db: Database, *, instance_id: str, state: str, now: datetime) -> None:
    async with db.transaction() as conn:
        await conn.execute(
            update(instances)
            .where(instances.c.instance_id == instance_id)
            .values(state=state, heartbeat_at=now)
        )


@dataclass(frozen=True)
class InstanceRecord:
    instance_id: str
    host: str
    pid: int
    version: str
    started_at: datetime
    heartbeat_at: datetime
    state: str
    leader: bool


async def list_instances(db: Database) -> list[InstanceRecord]:
    """Every instance row, newest heartbeat first; ``leader`` from the live leadership lease."""
    holder, lease_until = await leadership.current(db)
    now = await db.now()
    async with db.read() as conn:
        rows = (
            await conn.execute(select(instances).order_by(instances.c.heartbeat_at.desc()))
        ).all()
    live_holder = holder if lease_until is not None and lease_until > now else None
    return [
        InstanceRecord(
            instance_id=r.instance_id,
            host=r.host,
            pid=r.pid,
            version=r.version,
            started_at=r.started_at,
            heartbeat_at=r.heartbeat_at,
            state=r.state,
            leader=r.instance_id == live_holder,
        )
        for r in rows
    ]


async def overdue_jobs(
    db: Database, *, before: datetime, limit: int = 100
) -> list[tuple[str, datetime]]:
    """Jobs whose expected slot is older than ``before``: nobody decided it (an outage, or
    every instance down). ``(name, next_slot_at)``, most overdue first."""
    async with db.read() as conn:
        rows = await conn.execute(
            select(jobs.c.name, jobs.c.next_slot_at)
            # Runtime schedules' overdue slots are decided by their loader (app/runtime.py).
            .where(jobs.c.next_slot_at < before, jobs.c.task.is_(None))
            .order_by(jobs.c.next_slot_at)
            .limit(limit)
        )
        return [(r.name, r.next_slot_at) for r in rows]


async def mark_silent_instances(db: Database, *, before: datetime) -> list[str]:
    """Instances that stopped heartbeating (killed, or cut off) before ``before``: recorded
    ``stopped``, so ``instances`` does not show the dead as running."""
    async with db.transaction() as conn:
        silent = [
            r.instance_id
            for r in await conn.execute(
                select(instances.c.instance_id).where(
                    instances.c.state != "stopped", instances.c.heartbeat_at < before
                )
            )
        ]
        if silent:
            await conn.execute(
                update(instances)
                .where(instances.c.instance_id.in_(silent), instances.c.heartbeat_at < before)
                .values(state="stopped", is_leader=False)
            )
    return silent
