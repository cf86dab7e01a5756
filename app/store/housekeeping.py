"""What the leader's housekeeping finds to do, asked in one statement.

An idle cluster is asked this every tick; the writes that act on it run only when it finds
something, so a quiet instance costs the database a handful of statements a minute.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, literal, select, union_all

from app.store.database import Database
from app.store.tables import executions, instances, jobs


@dataclass(frozen=True)
class Pending:
    lapsed_runs: int
    """RUNNING executions whose lease lapsed: to be recorded ABANDONED."""
    silent_instances: int
    """Instances not stopped that stopped heartbeating: to be recorded stopped."""
    overdue_jobs: int
    """Jobs whose expected slot nobody decided in time: for their misfire policy."""


async def pending(
    db: Database, *, now: datetime, silent_before: datetime, overdue_before: datetime
) -> Pending:
    query = union_all(
        select(literal("lapsed").label("what"), func.count().label("n"))
        .select_from(executions)
        .where(executions.c.status == "RUNNING", executions.c.lease_until < db.now_in_sql()),
        select(literal("silent"), func.count())
        .select_from(instances)
        .where(instances.c.state != "stopped", instances.c.heartbeat_at < silent_before),
        select(literal("overdue"), func.count())
        .select_from(jobs)
        # Runtime schedules' overdue slots are decided by their loader (app/runtime.py).
        .where(jobs.c.next_slot_at < overdue_before, jobs.c.task.is_(None)),
    )
    async with db.alone(write=False) as conn:
        counts = {row.what: int(row.n) for row in await conn.execute(query, {"p_now": now})}
    return Pending(counts["lapsed"], counts["silent"], counts["overdue"])
