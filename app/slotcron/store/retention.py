"""Pruning history past ``SCHEDULER_HISTORY_RETENTION_DAYS``, in small batches.

Pruning never reopens a slot: a slot is closed by its job's ``last_slot_at`` high-water mark,
which pruning leaves alone. Only finished executions go; RUNNING and QUEUED ones stay.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import delete, select

from slotcron.store import markers
from slotcron.store.database import Database
from slotcron.store.tables import executions, instances

FINISHED = ("COMPLETED", "FAILED", "SKIPPED", "MISSED", "STOPPED", "ABANDONED")


async def prune_markers(db: Database, *, before: datetime) -> int:
    """Delete start markers created before ``before`` whose chunk has no run in flight: each
    finished run holds its own ``started_at`` by then (:mod:`slotcron.store.markers`)."""
    return await markers.prune(db, before=before)


async def prune(db: Database, *, before: datetime, batch: int = 500) -> int:
    """Delete up to ``batch`` finished executions created before ``before``, and instance rows
    stopped since before it. Returns how many executions went."""
    async with db.transaction() as conn:
        ids = [
            r.id
            for r in await conn.execute(
                select(executions.c.id)
                .where(executions.c.created_at < before, executions.c.status.in_(FINISHED))
                .order_by(executions.c.created_at)
                .limit(batch)
            )
        ]
        if ids:
            await conn.execute(delete(executions).where(executions.c.id.in_(ids)))
        await conn.execute(
            delete(instances).where(
                instances.c.state == "stopped", instances.c.heartbeat_at < before
            )
        )
    return len(ids)
