"""QUEUED executions (retries now; manual runs and restarts later), taken by any live instance."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.exc import DBAPIError

from app.errors import LeaseHeld, RowBusy
from app.status import Status
from app.store.claims import Claim, lease_holder, lock_job
from app.store.database import Database
from app.store.tables import executions, jobs


@dataclass(frozen=True)
class Queued:
    execution_id: int
    job_name: str
    available_at: datetime


async def due(db: Database, *, now: datetime, limit: int = 100) -> list[Queued]:
    async with db.read() as conn:
        rows = (
            await conn.execute(
                select(executions.c.id, executions.c.job_name, executions.c.available_at)
                .where(executions.c.status == Status.QUEUED, executions.c.available_at <= now)
                .order_by(executions.c.available_at)
                .limit(limit)
            )
        ).all()
    return [Queued(int(r.id), r.job_name, r.available_at) for r in rows]


async def take(
    db: Database,
    *,
    execution_id: int,
    job_name: str,
    instance_id: str,
    now: datetime,
    lease_ms: int,
    forbid_overlap: bool,
) -> Claim | None:
    """Start a QUEUED execution on this instance; None if another instance took it. Raises
    :class:`LeaseHeld` when (under ``forbid``) a run of the job still holds its lease, and
    :class:`RowBusy` like a claim."""
    try:
        async with db.transaction(nowait=True) as conn:
            # The job's row lock orders this against claims, so forbid holds across both.
            job = await lock_job(conn, job_name)
            if job is None:
                return None
            if forbid_overlap:
                holder = await lease_holder(db, conn, job_name, now)
                if holder is not None:
                    raise LeaseHeld(job_name, holder.lease_until)
            token = int(job.fencing_token) + 1
            lease_until = now + timedelta(milliseconds=lease_ms)
            result = await conn.execute(
                update(executions)
                .where(executions.c.id == execution_id, executions.c.status == Status.QUEUED)
                .values(
                    status=Status.RUNNING,
                    instance_id=instance_id,
                    # Stamped just before its body starts (app.store.starts): until then, a
                    # run taken here can be handed back.
                    started_at=None,
                    heartbeat_at=now,
                    lease_until=lease_until,
                    lease_ms=lease_ms,
                    fencing_token=token,
                )
            )
            if result.rowcount != 1:
                return None
            await conn.execute(
                update(jobs).where(jobs.c.name == job_name).values(fencing_token=token)
            )
            row = (
                await conn.execute(select(executions).where(executions.c.id == execution_id))
            ).one()
    except DBAPIError as exc:
        if db.dialect.is_lock_unavailable(exc):
            raise RowBusy(job_name) from None
        raise
    return Claim(
        execution_id=execution_id,
        job_name=job_name,
        scheduled_at=row.scheduled_at,
        trigger=row.trigger,
        status=Status.RUNNING,
        attempt=row.attempt,
        lease_until=lease_until,
        lease_ms=lease_ms,
        params=dict(row.params or {}),
        state=dict(row.state or {}),
        fencing_token=token,
        started=False,
    )
