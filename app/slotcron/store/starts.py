"""The start of a run's body, written ahead of it: what makes ``started_at`` true and an
unstarted claim safe to hand to another instance.

A claimed run whose row has no ``started_at`` has not started its body, and may be handed back
(:func:`slotcron.store.lifeline.hand_back`) if its instance dies, stops or is fenced. Its body
starts
only once :func:`start_runs` has stamped ``started_at`` on its row, a statement conditional on the
row still being ours, ``RUNNING``, its lease live and its slot come (both by the database's
clock): a hand-back and a start exclude each other, row by row, so nothing runs twice.

The same statement reads the job's ``paused`` column, the truth whoever set it: a scheduled run
(cron, interval, catch-up) whose job is paused is recorded ``SKIPPED`` instead of starting.
So a pause committed before a slot's time is honoured even by a run claimed ahead of it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import String, and_, bindparam, case, func, literal, select, true, update
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.elements import ColumnElement

from slotcron.status import Status, Trigger
from slotcron.store.database import Database, now_in_sql
from slotcron.store.dialects import Dialect
from slotcron.store.tables import UTCDateTime, executions, guard, jobs

SCHEDULED = (Trigger.CRON.value, Trigger.INTERVAL.value, Trigger.CATCHUP.value)
"""The triggers a pause stops. A manual run, a restart or a retry was asked for: it runs."""


@dataclass(frozen=True)
class _Start:
    write: Any
    write_returning: Any
    read: Any


def paused_reason(reason: ColumnElement[Any]) -> ColumnElement[Any]:
    """Why a paused job's slot is ``SKIPPED``, in SQL: "job is paused", and the pause's reason."""
    return literal("job is paused", String()) + func.coalesce(
        literal(": ", String()) + reason, literal("", String())
    )


@functools.cache
def _start(dialect: Dialect, server_clock: bool) -> _Start:
    ids = dialect.among(executions.c.id, "p_ids", executions.c.id.type)
    now = bindparam("p_now", type_=UTCDateTime())
    db_now = now_in_sql(dialect, server_clock)
    # Joined to the job's row (UPDATE ... FROM, or MySQL's multiple-table UPDATE): its `paused`
    # is read once per run. MySQL does not promise the order of a joined UPDATE's assignments,
    # so `skip` reads no column the statement sets.
    skip = and_(executions.c.trigger.in_(SCHEDULED), jobs.c.paused == true())
    reason = paused_reason(jobs.c.paused_reason)
    # Never before the slot: the scheduler's clock may be a hair behind the database's.
    started = case((executions.c.scheduled_at > now, executions.c.scheduled_at), else_=now)
    write = (
        update(executions)
        .where(
            ids,
            executions.c.job_name == jobs.c.name,
            guard(executions.c.status) == Status.RUNNING.value,
            guard(executions.c.instance_id) == bindparam("p_instance"),
            executions.c.lease_until > db_now,
            executions.c.scheduled_at <= db_now,
        )
        .values(
            {
                executions.c.status: case((skip, Status.SKIPPED.value), else_=executions.c.status),
                executions.c.error: case((skip, reason), else_=executions.c.error),
                executions.c.finished_at: case((skip, now), else_=executions.c.finished_at),
                executions.c.lease_until: case((skip, now), else_=executions.c.lease_until),
                executions.c.started_at: case((skip, None), else_=started),
            }
        )
    )
    return _Start(
        write=write,
        write_returning=write.returning(executions.c.id, executions.c.status, executions.c.error),
        read=select(
            executions.c.id,
            executions.c.status,
            executions.c.error,
            executions.c.instance_id,
            executions.c.started_at,
        ).where(ids),
    )


@dataclass
class Starts:
    """What :func:`start_runs` made of each run."""

    started: set[int] = field(default_factory=set)
    """Stamped: the body may start."""
    skipped: dict[int, str] = field(default_factory=dict)
    """Recorded ``SKIPPED`` (the job is paused), with the reason written."""
    early: set[int] = field(default_factory=set)
    """Still ours, but the database's clock has not reached the slot yet: try again shortly."""
    gone: set[int] = field(default_factory=set)
    """No longer ours (handed back, or recorded by another instance): the body must not start."""


async def start_runs(
    db: Database, execution_ids: list[int], *, instance_id: str, now: datetime
) -> Starts:
    """Stamp ``started_at`` on this instance's runs, or record them SKIPPED if their job is
    paused; one statement whatever their number (plus a read where the database has no
    ``UPDATE ... RETURNING``, or some row was not stamped)."""
    sql = _start(db.dialect, db.server_clock)
    params = {"p_ids": execution_ids, "p_instance": instance_id, "p_now": now}
    out = Starts()
    async with db.transaction() as conn:
        if db.dialect.update_returning:
            for row in await conn.execute(sql.write_returning, params):
                _sort(out, row)
            rest = [i for i in execution_ids if i not in out.started and i not in out.skipped]
            if rest:
                _classify(out, await conn.execute(sql.read, {"p_ids": rest}), instance_id)
        else:
            await conn.execute(sql.write, params)
            _classify(out, await conn.execute(sql.read, params), instance_id, now)
    out.gone |= set(execution_ids) - out.started - set(out.skipped) - out.early
    return out


def _sort(out: Starts, row: Any) -> None:
    if row.status == Status.SKIPPED:
        out.skipped[int(row.id)] = row.error
    else:
        out.started.add(int(row.id))


def _classify(out: Starts, rows: Any, instance_id: str, now: datetime | None = None) -> None:
    """Sort rows read after the write (``now``: the write's own time, where it returned
    nothing; None: these rows were not stamped by it)."""
    for row in rows:
        ours = row.instance_id == instance_id
        if ours and row.status == Status.RUNNING and row.started_at is None:
            out.early.add(int(row.id))
        elif now is not None and ours and row.status == Status.RUNNING:
            out.started.add(int(row.id))
        elif now is not None and ours and row.status == Status.SKIPPED:
            out.skipped[int(row.id)] = row.error


async def rehearse(db: Database, conn: AsyncConnection) -> None:
    """Run :func:`start_runs`'s statements once, writing nothing (see ``claims.rehearse``)."""
    sql = _start(db.dialect, db.server_clock)
    params: dict[str, Any] = {
        "p_ids": [],
        "p_instance": "",
        "p_now": datetime(2000, 1, 1, tzinfo=UTC),
    }
    await conn.execute(sql.write_returning if db.dialect.update_returning else sql.write, params)
    await conn.execute(sql.read, params)
