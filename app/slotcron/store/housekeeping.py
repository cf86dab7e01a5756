"""What the leader's housekeeping finds to do, asked in one statement.

An idle cluster is asked this every tick; the writes that act on it run only when it finds
something, so a quiet instance costs the database a handful of statements a minute. Where the
database can hold a write in a read (PostgreSQL), the leader's renewal of its lease is the same
statement: an idle leader sends one statement a tick.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import CompoundSelect, Select, func, literal, select, union_all

from slotcron.store import leadership, markers
from slotcron.store.database import Database
from slotcron.store.tables import executions, instances, jobs, leader


@dataclass(frozen=True)
class Pending:
    lapsed_runs: int
    """RUNNING executions whose lease lapsed: to be recorded ABANDONED."""
    silent_instances: int
    """Instances not stopped that stopped heartbeating: to be recorded stopped."""
    overdue_jobs: int
    """Jobs whose expected slot nobody decided in time: for their misfire policy."""
    unstarted_runs: int
    """RUNNING executions not started yet (claimed ahead of their slot, or just claimed): the
    leader then asks when the first of their leases lapses."""


def _looks(db: Database, *, silent_before: datetime, overdue_before: datetime) -> list[Select[Any]]:
    running = executions.c.status == "RUNNING"
    return [
        select(literal("lapsed").label("what"), func.count().label("n"))
        .select_from(executions)
        .where(running, executions.c.lease_until < db.now_in_sql()),
        select(literal("unstarted"), func.count())
        .select_from(executions)
        .where(running, markers.started_at().is_(None)),
        select(literal("silent"), func.count())
        .select_from(instances)
        .where(instances.c.state != "stopped", instances.c.heartbeat_at < silent_before),
        select(literal("overdue"), func.count())
        .select_from(jobs)
        # Runtime schedules' overdue slots are decided by their loader
        # (app/slotcron/engine/runtime.py).
        .where(jobs.c.next_slot_at < overdue_before, jobs.c.task.is_(None)),
    ]


async def _counts(
    db: Database, query: CompoundSelect[Any], now: datetime, *, write: bool
) -> dict[str, int]:
    """Run the union of counts in autocommit: each part's ``what`` and its count."""
    async with db.alone(write=write) as conn:
        return {row.what: int(row.n) for row in await conn.execute(query, {"p_now": now})}


def _pending(counts: dict[str, int]) -> Pending:
    return Pending(counts["lapsed"], counts["silent"], counts["overdue"], counts["unstarted"])


async def pending(
    db: Database, *, now: datetime, silent_before: datetime, overdue_before: datetime
) -> Pending:
    query = union_all(*_looks(db, silent_before=silent_before, overdue_before=overdue_before))
    return _pending(await _counts(db, query, now, write=False))


async def renew_and_look(
    db: Database,
    *,
    instance_id: str,
    now: datetime,
    lease: float,
    silent_before: datetime,
    overdue_before: datetime,
) -> Pending | None:
    """Renew this instance's leadership lease and, while it is ours, say what housekeeping
    finds (None: the lease is no longer ours). One statement where the database has writes in
    common table expressions, the renewal and the read then sharing one snapshot; else the
    renewal and then the read."""
    if not db.dialect.modifying_cte:
        if not await leadership.renew(db, instance_id=instance_id, now=now, lease=lease):
            return None
        return await pending(
            db, now=now, silent_before=silent_before, overdue_before=overdue_before
        )
    renewed = (
        leadership.renewal(instance_id=instance_id, now=now, lease=lease)
        .returning(leader.c.name)
        .cte("renewed")
    )
    query = union_all(
        *_looks(db, silent_before=silent_before, overdue_before=overdue_before),
        select(literal("renewed"), func.count()).select_from(renewed),
    )
    counts = await _counts(db, query, now, write=True)
    return _pending(counts) if counts["renewed"] else None
