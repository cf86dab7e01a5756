"""Who is here: job rows (one per job name) and instance rows (one per live or recent instance)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import update

from app.store.database import Database
from app.store.tables import instances, jobs

_CHUNK = 500


@dataclass(frozen=True)
class JobRow:
    name: str
    kind: str
    schedule: str
    timezone: str
    options: dict[str, Any]


async def register_jobs(
    db: Database, rows: Sequence[JobRow], *, now: datetime, instance_id: str, version: str
) -> None:
    """Insert new job rows and refresh the definition of known ones.

    Never touches ``paused`` or ``last_slot_at``: those belong to the cluster, not to whichever
    instance started last.
    """
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
                "registered_at": now,
                "updated_at": now,
                "updated_by": instance_id,
                "version": version,
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
            ],
        )
        async with db.transaction() as conn:
            await conn.execute(stmt)


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
                "leader_until": None,
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
