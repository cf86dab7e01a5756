"""What an instance reads to fire runtime schedules (:mod:`slotcron.engine.runtime`): the
schedules due within its horizon, one page at a time by the ``next_slot_at`` index; single
schedules by id; the change token it polls where it has no notifications; the tasks that have
schedules.

None of these reads grows with the number of schedules an instance is not about to fire.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import String, and_, bindparam, func, or_, select

from slotcron.store.database import Database
from slotcron.store.tables import SCHEDULE_COLUMNS, UTCDateTime, changes, instances, jobs, tasks

PAGE = 20_000
"""Schedules per page of the horizon's range read (five short columns each). Large: a page
after the first continues within its slot by id, and a burst's rows share one slot; with
statistics from before the burst was added (it was, seconds ago), PostgreSQL reads every row
of the slot left and sorts them for each page, whatever the index (100,000 at once, pages of
1,000: 100 pages of 60-110 ms, 18 s to load; pages of 20,000: 7.7 s, most of it building the
jobs)."""
CHUNK = 1000
"""Ids per ``IN (...)`` list."""
MAX_TASKS = 10_000
"""How many distinct tasks the search for tasks without a live instance walks, at most."""

_DUE_COLUMNS = (*SCHEDULE_COLUMNS, jobs.c.fingerprint)
"""A schedule's whole row and its version mark."""

_RANGE_COLUMNS = (
    jobs.c.name,
    jobs.c.task,
    jobs.c.updated_at,
    jobs.c.next_slot_at,
    jobs.c.fingerprint,
)
"""What the horizon's range read returns: enough to tell whether a schedule is held already
(its version and mark), not its params or options: every refresh reads again the schedules held, and
decoding their JSON each time cost seconds for 100,000 (while their burst was being claimed)."""

_AFTER = bindparam("p_after", type_=UTCDateTime())
_BEFORE = bindparam("p_before", type_=UTCDateTime())
_DUE_FIRST = (
    select(*_RANGE_COLUMNS)
    .where(
        jobs.c.task.in_(bindparam("p_tasks", expanding=True)),
        jobs.c.next_slot_at < _BEFORE,
    )
    .order_by(jobs.c.next_slot_at, jobs.c.name)
    .limit(bindparam("p_limit"))
)
_DUE_NEXT = _DUE_FIRST.where(
    or_(
        jobs.c.next_slot_at > _AFTER,
        and_(jobs.c.next_slot_at == _AFTER, jobs.c.name > bindparam("p_name", type_=String())),
    )
)


async def due_before(
    db: Database, task_names: Sequence[str], before: datetime, page: int = PAGE
) -> AsyncIterator[list[Any]]:
    """Pages of the schedules of ``task_names`` whose next slot is before ``before`` (overdue
    ones included), in slot order: a range read on the ``next_slot_at`` index, keyset-paged so
    no statement holds more than ``page`` rows. Each row has ``name``, ``task``,
    ``updated_at``, ``next_slot_at`` and ``fingerprint`` only: the rest of those not held yet
    is read by :func:`by_ids`."""
    if not task_names:
        return
    params: dict[str, Any] = {"p_tasks": list(task_names), "p_before": before, "p_limit": page}
    query = _DUE_FIRST
    while True:
        # Alone: on PostgreSQL one statement in autocommit, no BEGIN and COMMIT around it (an
        # idle instance's cost is counted in statements).
        async with db.alone(write=False) as conn:
            rows = list(await conn.execute(query, params))
        if rows:
            yield rows
        if len(rows) < page:
            return
        last = rows[-1]
        query = _DUE_NEXT
        params = {**params, "p_after": last.next_slot_at, "p_name": last.name}


async def by_ids(db: Database, ids: Sequence[str]) -> dict[str, Any]:
    """The rows of these schedules that still exist, by id (a removed one is absent)."""
    found: dict[str, Any] = {}
    # One list parameter (one array on PostgreSQL): a literal IN list is rendered element by
    # element at every execution, and loading 100,000 schedules spent a third of its CPU so.
    statement = select(*_DUE_COLUMNS).where(
        db.dialect.among(jobs.c.name, "p_ids", String()), jobs.c.task.is_not(None)
    )
    for start in range(0, len(ids), CHUNK):
        async with db.alone(write=False) as conn:
            rows = await conn.execute(statement, {"p_ids": list(ids[start : start + CHUNK])})
            found.update((row.name, row) for row in rows)
    return found


_TOKEN = select(changes.c.token).where(changes.c.name == bindparam("p_name"))


async def change_token(db: Database, row: str) -> str | None:
    """The token every schedule write touching a slot soon rewrites: one primary-key read."""
    async with db.alone(write=False) as conn:
        return (await conn.execute(_TOKEN, {"p_name": row})).scalar_one_or_none()


async def tasks_with_schedules(db: Database) -> list[str]:
    """The distinct tasks that have schedules, one index probe each on ``(task, name)``: the
    cost grows with the number of tasks, not of schedules."""
    found: list[str] = []
    probe = select(func.min(jobs.c.task)).where(jobs.c.task > bindparam("p_after", type_=String()))
    async with db.read() as conn:
        after = ""
        while len(found) < MAX_TASKS:
            name = (await conn.execute(probe, {"p_after": after})).scalar_one_or_none()
            if name is None:
                break
            found.append(name)
            after = name
    return found


async def live_tasks(db: Database, names: Sequence[str], *, alive_since: datetime) -> set[str]:
    """Of ``names``, the tasks whose last registering instance is live (heartbeat since
    ``alive_since``, not stopped)."""
    if not names:
        return set()
    query = (
        select(tasks.c.name)
        .join(instances, instances.c.instance_id == tasks.c.updated_by)
        .where(
            tasks.c.name.in_(list(names)),
            instances.c.state != "stopped",
            instances.c.heartbeat_at >= alive_since,
        )
    )
    async with db.read() as conn:
        return {row.name for row in await conn.execute(query)}


async def task_is_live(db: Database, task: str, *, lapse: float) -> bool:
    """Whether an instance that registers ``task`` is live (its last registering instance
    heartbeat within ``lapse`` seconds, by the database's clock): shown with a schedule, whose
    slots wait while no instance has its task."""
    since = await db.now() - timedelta(seconds=lapse)
    return task in await live_tasks(db, [task], alive_since=since)
