"""What happens to a run after its claim: heartbeats, checkpoints, its one finishing write.

Every write here is conditional on ``status = 'RUNNING' AND instance_id = :me``: a run can
never overwrite what another instance (or the leader) recorded about it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select, update

from app.store.database import Database
from app.store.lifeline import queue_retry
from app.store.tables import executions, instances


def _mine(execution_id: int, instance_id: str) -> Any:
    return (
        (executions.c.id == execution_id)
        & (executions.c.status == "RUNNING")
        & (executions.c.instance_id == instance_id)
    )


async def finish(
    db: Database,
    *,
    execution_id: int,
    instance_id: str,
    status: str,
    now: datetime,
    error: str | None,
    retry_backoff: float | None = None,
) -> bool:
    """Record a run's outcome; False when the record was no longer ours to write.

    With ``retry_backoff``, the next attempt of the slot is queued in the same transaction,
    carrying the params and the last checkpointed state.
    """
    async with db.transaction() as conn:
        result = await conn.execute(
            update(executions)
            .where(_mine(execution_id, instance_id))
            .values(status=status, finished_at=now, error=error, lease_until=now)
        )
        if result.rowcount != 1:
            return False
        if retry_backoff is not None:
            row = (
                await conn.execute(select(executions).where(executions.c.id == execution_id))
            ).one()
            await queue_retry(conn, row=row, now=now, backoff=retry_backoff)
    return True


async def stop_all(
    db: Database, *, execution_ids: Iterable[int], instance_id: str, now: datetime, reason: str
) -> int:
    """Record every listed run of this instance still ``RUNNING`` as ``STOPPED``; release leases."""
    ids = list(execution_ids)
    if not ids:
        return 0
    async with db.transaction() as conn:
        result = await conn.execute(
            update(executions)
            .where(
                executions.c.id.in_(ids),
                executions.c.status == "RUNNING",
                executions.c.instance_id == instance_id,
            )
            .values(status="STOPPED", finished_at=now, error=reason, lease_until=now)
        )
    return int(result.rowcount)


async def save_state(
    db: Database, *, execution_id: int, instance_id: str, state: Mapping[str, Any]
) -> bool:
    async with db.transaction() as conn:
        result = await conn.execute(
            update(executions).where(_mine(execution_id, instance_id)).values(state=dict(state))
        )
    return result.rowcount == 1


async def renew(
    db: Database,
    *,
    instance_id: str,
    now: datetime,
    lease_counts: Mapping[int, int],
    instance_state: str,
) -> set[int] | None:
    """Renew the leases of all this instance's running executions and its own instance row.

    One statement per distinct lease length (almost always one), whatever the number of runs.
    ``lease_counts`` maps a lease length (ms) to how many runs we hold with it. Returns None
    when every lease was renewed, else the ids still ours (the others were taken from us).
    """
    complete = True
    async with db.transaction() as conn:
        for lease_ms, expected in lease_counts.items():
            result = await conn.execute(
                update(executions)
                .where(
                    executions.c.instance_id == instance_id,
                    executions.c.status == "RUNNING",
                    executions.c.lease_ms == lease_ms,
                )
                .values(heartbeat_at=now, lease_until=now + timedelta(milliseconds=lease_ms))
            )
            complete = complete and result.rowcount == expected
        await conn.execute(
            update(instances)
            .where(instances.c.instance_id == instance_id)
            .values(heartbeat_at=now, state=instance_state)
        )
        if complete:
            return None
        rows = await conn.execute(
            select(executions.c.id).where(
                executions.c.instance_id == instance_id, executions.c.status == "RUNNING"
            )
        )
        return {int(r.id) for r in rows}
