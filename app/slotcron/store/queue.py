"""QUEUED executions (retries now; manual runs and restarts later), taken by any live instance."""

from __future__ import annotations

import functools
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Integer, String, bindparam, func, select, tuple_, update
from sqlalchemy.ext.asyncio import AsyncConnection

from slotcron.status import Status
from slotcron.store.claims import Claim
from slotcron.store.database import Database, now_in_sql
from slotcron.store.dialects import Dialect
from slotcron.store.tables import UTCDateTime, executions, guard, jobs


@dataclass(frozen=True)
class Queued:
    execution_id: int
    job_name: str
    available_at: datetime


PER_JOB = 3
"""Queued executions of one job a page lists at most: a job's queue is taken one at a time,
and a thousand of one job's (a schedule triggered in a loop) must not fill every page and hide
the other jobs' behind them."""


@functools.cache
def _due() -> Any:
    rank = func.row_number().over(
        partition_by=executions.c.job_name,
        order_by=(executions.c.available_at, executions.c.id),
    )
    ranked = (
        select(
            executions.c.id,
            executions.c.job_name,
            executions.c.available_at,
            rank.label("rank"),
        )
        .where(
            executions.c.status == Status.QUEUED,
            executions.c.available_at <= bindparam("p_now", type_=UTCDateTime()),
        )
        .subquery("ranked")
    )
    return (
        select(ranked.c.id, ranked.c.job_name, ranked.c.available_at)
        .where(
            ranked.c.rank <= PER_JOB,
            tuple_(ranked.c.available_at, ranked.c.id)
            > tuple_(
                bindparam("p_after_at", type_=UTCDateTime()),
                bindparam("p_after_id", type_=executions.c.id.type),
            ),
        )
        .order_by(ranked.c.available_at, ranked.c.id)
        .limit(bindparam("p_limit", type_=Integer()))
    )


BEGINNING = (datetime(1970, 1, 1, tzinfo=UTC), 0)


async def due(
    db: Database,
    *,
    now: datetime,
    limit: int = 100,
    after: tuple[datetime, int] = BEGINNING,
) -> list[Queued]:
    """QUEUED executions due by ``now``, oldest first, at most :data:`PER_JOB` of one job, after
    ``after`` (the ``(available_at, id)`` of the last one of the previous page)."""
    async with db.read() as conn:
        rows = (
            await conn.execute(
                _due(),
                {"p_now": now, "p_after_at": after[0], "p_after_id": after[1], "p_limit": limit},
            )
        ).all()
    return [Queued(int(r.id), r.job_name, r.available_at) for r in rows]


REMOVED = "not run: its job or schedule was removed while it waited"


async def settle_queued(conn: Any, name: str, *, now: datetime) -> int:
    """Record ``SKIPPED`` every queued execution of ``name``, whose job or schedule is gone (in
    the caller's transaction, beside its removal)."""
    result = await conn.execute(
        update(executions)
        .where(executions.c.job_name == name, executions.c.status == Status.QUEUED)
        .values(status=Status.SKIPPED, finished_at=now, error=REMOVED)
    )
    return int(result.rowcount)


async def settle_orphans(db: Database, names: Collection[str], *, now: datetime) -> dict[str, int]:
    """Record ``SKIPPED`` every queued execution of those ``names`` that no longer exist as a
    job or schedule (a schedule removed while runs of it waited): nobody would ever take them.
    Returns how many were settled, by name."""
    if not names:
        return {}
    settled: dict[str, int] = {}
    async with db.transaction() as conn:
        existing = set(
            (
                await conn.execute(select(jobs.c.name).where(jobs.c.name.in_(sorted(names))))
            ).scalars()
        )
        for name in sorted(set(names) - existing):
            settled[name] = await settle_queued(conn, name, now=now)
    return settled


async def queued_count(conn: Any, job_name: str, *, at_most: int) -> int:
    """How many executions of ``job_name`` wait QUEUED, counted up to ``at_most``."""
    waiting = (
        select(executions.c.id)
        .where(executions.c.job_name == job_name, executions.c.status == Status.QUEUED)
        .limit(at_most)
        .subquery()
    )
    return int((await conn.execute(select(func.count()).select_from(waiting))).scalar_one())


@dataclass(frozen=True)
class Wanted:
    """A queued execution to take, with what its job asks of a run."""

    execution_id: int
    job_name: str
    lease_ms: int
    forbid_overlap: bool


@dataclass
class Taken:
    """What :func:`take_many` made of each execution asked for."""

    claims: list[Claim] = field(default_factory=list)
    busy: list[Wanted] = field(default_factory=list)
    """Their job's row was locked by another claimer: look again shortly."""
    held: dict[int, datetime] = field(default_factory=dict)
    """Of ``forbid`` jobs whose lease a run still holds: when that lease ends, by id."""


@dataclass(frozen=True)
class _TakeMany:
    lock: Any
    holders: Any
    start: Any
    read: Any
    advance: Any


@functools.cache
def _take_many(dialect: Dialect, server_clock: bool) -> _TakeMany:
    names = dialect.among(jobs.c.name, "p_names", String())
    ids = dialect.among(executions.c.id, "p_ids", executions.c.id.type)
    now = bindparam("p_now", type_=UTCDateTime())
    token = (
        select(jobs.c.fencing_token + 1)
        .where(jobs.c.name == executions.c.job_name)
        .scalar_subquery()
    )
    return _TakeMany(
        lock=select(jobs.c.name).where(names).with_for_update(skip_locked=True),
        holders=select(executions.c.job_name, executions.c.lease_until).where(
            dialect.among(executions.c.job_name, "p_names", String()),
            executions.c.status == Status.RUNNING,
            executions.c.lease_until > now_in_sql(dialect, server_clock),
        ),
        start=update(executions)
        .where(ids, guard(executions.c.status) == Status.QUEUED.value)
        .values(
            status=Status.RUNNING,
            instance_id=bindparam("p_instance"),
            started_at=None,  # stamped just before its body starts (slotcron.store.starts)
            heartbeat_at=now,
            lease_until=bindparam("p_lease_until", type_=UTCDateTime()),
            lease_ms=bindparam("p_lease_ms", type_=Integer()),
            fencing_token=token,  # the job's counter, taken below in the same transaction
        ),
        read=select(executions).where(
            ids,
            guard(executions.c.status) == Status.RUNNING.value,
            guard(executions.c.instance_id) == bindparam("p_instance"),
        ),
        advance=update(jobs).where(names).values(fencing_token=jobs.c.fencing_token + 1),
    )


async def take_many(
    db: Database, wanted: list[Wanted], *, instance_id: str, now: datetime
) -> Taken:
    """Start many QUEUED executions on this instance in one transaction, at most one per job
    (the others are left for the next look), in a few statements whatever their number. The
    job's row lock orders a take against scheduled claims, so ``forbid`` holds across both: a
    run holding a ``forbid`` job's lease keeps its queued execution waiting (``held``).
    Executions another instance took meanwhile are simply absent."""
    by_job: dict[str, Wanted] = {}
    for item in wanted:
        by_job.setdefault(item.job_name, item)
    out = Taken()
    if not by_job:
        return out
    sql = _take_many(db.dialect, db.server_clock)
    async with db.transaction() as conn:
        locked = set((await conn.execute(sql.lock, {"p_names": list(by_job)})).scalars())
        out.busy = [item for name, item in by_job.items() if name not in locked]
        forbid = [name for name in locked if by_job[name].forbid_overlap]
        if forbid:
            holders = await conn.execute(sql.holders, {"p_names": forbid, "p_now": now})
            for row in holders:
                out.held[by_job[row.job_name].execution_id] = row.lease_until
        go = [by_job[n] for n in locked if by_job[n].execution_id not in out.held]
        await _start(conn, sql.start, go, instance_id=instance_id, now=now)
        if not go:
            return out
        rows = (
            await conn.execute(
                sql.read, {"p_ids": [i.execution_id for i in go], "p_instance": instance_id}
            )
        ).all()
        if rows:
            await conn.execute(sql.advance, {"p_names": [r.job_name for r in rows]})
    out.claims = [_taken_claim(row) for row in rows]
    return out


async def _start(
    conn: AsyncConnection, start: Any, go: list[Wanted], *, instance_id: str, now: datetime
) -> None:
    """Start the taken executions: one statement per lease length."""
    groups: dict[int, list[int]] = {}
    for item in go:
        groups.setdefault(item.lease_ms, []).append(item.execution_id)
    for lease_ms, ids in groups.items():
        await conn.execute(
            start,
            {
                "p_ids": ids,
                "p_instance": instance_id,
                "p_now": now,
                "p_lease_until": now + timedelta(milliseconds=lease_ms),
                "p_lease_ms": lease_ms,
            },
        )


def _taken_claim(row: Any) -> Claim:
    """The claim of a queued execution this instance took (its start is stamped before its
    body: :mod:`slotcron.store.starts`)."""
    return Claim(
        execution_id=int(row.id),
        job_name=row.job_name,
        scheduled_at=row.scheduled_at,
        trigger=row.trigger,
        status=Status.RUNNING,
        attempt=row.attempt,
        lease_until=row.lease_until,
        lease_ms=row.lease_ms,
        params=dict(row.params or {}),
        state=dict(row.state or {}),
        fencing_token=int(row.fencing_token),
        started=False,
    )
