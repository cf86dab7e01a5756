"""Runtime schedules in the database: each a row of ``scheduler_jobs`` whose ``task`` is set.

Why a row of the jobs table rather than a table of its own: a schedule's slots obey every
guarantee of a job's, and those guarantees live in that row (the ``FOR UPDATE NOWAIT`` lock of a
claim, the ``last_slot_at`` high-water mark, ``paused``, the fencing token, the stored options
the leader reads for retries and alerts). Sharing the row shares them, with pause, resume,
trigger, restart and history by id, and makes ids unique among jobs and schedules by the
primary key, race-free. ``next_slot_at`` is indexed, so an instance can load only what is due
soon; listings of code jobs filter on ``task IS NULL``.

Each write computes the schedule's next slot by the database's clock and, on PostgreSQL,
announces itself on :data:`CHANNEL` when it commits, when it touches a slot within
:data:`ANNOUNCE_WITHIN` (payloads ``add <earliest next slot>``, ``update <id> <next slot>``,
``remove <id>``), so an instance holding the slots due soon can take it into account within a
second. A change further ahead needs no word: the firing's range query over ``next_slot_at``
finds it before it is due.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError

from slotcron.errors import InvalidJobError, NotFound, Refused
from slotcron.jobs.registry import REGISTRY, Job, Registry
from slotcron.jobs.schedule_rows import read_row
from slotcron.jobs.schedules import (
    IdTaken,
    ScheduleRecord,
    ScheduleSpec,
    TaskInfo,
    changed_spec,
    new_spec,
)
from slotcron.store.database import Database
from slotcron.store.queue import settle_queued
from slotcron.store.schedule_inserts import (
    PAGES,
    changed_options,
    insert_row,
    insert_rows,
    taken_ids,
)
from slotcron.store.tables import SCHEDULE_COLUMNS, changes, executions, jobs, tasks
from slotcron.text import iso

CHANNEL = "slotcron_schedules"
CHANGES_ROW = "schedules"
ANNOUNCE_WITHIN = timedelta(minutes=10)
"""Writes touching a slot this close are announced. The firing's horizon (how far ahead an
instance loads due slots) must stay below it; one round trip less for the rest (an add of a
tenant's 09:00 report, hours away)."""
CHUNK = 1000
"""Names per ``IN (...)`` list: under every driver's limit of bound parameters (asyncpg's
32,767; SQLite's 32,766)."""


_COLUMNS = (*SCHEDULE_COLUMNS, jobs.c.registered_at)


def _record(row: Any) -> ScheduleRecord:
    """A stored schedule; an unreadable one (:attr:`ScheduleRecord.error`) rather than an error."""
    return ScheduleRecord(
        spec=read_row(row),
        created_at=row.registered_at,
        updated_at=row.updated_at,
        next_slot=row.next_slot_at,
    )


# Tasks


async def register_tasks(
    db: Database, registered: Sequence[Job], *, now: datetime, instance_id: str, version: str
) -> None:
    """Record (or refresh) this instance's ``@task`` names, so writers that do not import the
    task code know them and their options."""
    if not registered:
        return
    rows = [
        {
            "name": t.name,
            "options": t.options(),
            "timezone": t.timezone,
            "registered_at": now,
            "updated_at": now,
            "updated_by": instance_id,
            "version": version,
        }
        for t in registered
    ]
    statement = db.dialect.upsert(
        tasks, keys=["name"], update=["options", "timezone", "updated_at", "updated_by", "version"]
    )
    async with db.transaction() as conn:
        await conn.execute(statement, rows)  # one row's parameters at a time: no limit to chunk


async def known_tasks(
    db: Database, names: Collection[str], registry: Registry = REGISTRY
) -> dict[str, TaskInfo]:
    """What this process knows of each named task: its own ``@task`` registration first, else
    what an instance recorded. A name in neither is absent (an unknown task)."""
    found: dict[str, TaskInfo] = {}
    for name in names:
        local = registry.task(name)
        if local is not None:
            found[name] = TaskInfo(name, local.options(), local.timezone)
    missing = [n for n in names if n not in found]
    for start in range(0, len(missing), CHUNK):
        async with db.read() as conn:
            rows = await conn.execute(
                select(tasks.c.name, tasks.c.options, tasks.c.timezone).where(
                    tasks.c.name.in_(missing[start : start + CHUNK])
                )
            )
            for r in rows:
                found[r.name] = TaskInfo(r.name, dict(r.options or {}), r.timezone)
    return found


# Writes


def version_mark() -> str:
    """A runtime schedule's version, new with each write that creates or updates it, kept in
    the row's ``fingerprint`` (a code job's holds its schedule's
    :mod:`slotcron.schedule.fingerprint`): what
    an instance's claims of the schedule present, refused once another is in force
    (:func:`slotcron.store.claims.judge`). Random, not the write's time: two writes in the same
    microsecond (a test's clock) are still two versions."""
    return f"v:{uuid.uuid4().hex[:16]}"


async def create(
    db: Database,
    items: Sequence[Mapping[str, Any]],
    *,
    default_timezone: str,
    by: str,
    registry: Registry = REGISTRY,
    now: datetime | None = None,
    remembered: dict[str, TaskInfo] | None = None,
) -> list[ScheduleRecord]:
    """Check and store new schedules (each a mapping of :data:`slotcron.jobs.schedules.FIELDS`),
    all or
    none: the one write path of the CLI, the API and the client. ``now`` defaults to a sample
    of the database's clock; ``remembered`` keeps tasks found known across calls (a task, once
    recorded, stays: a long-lived writer asks for it once)."""
    for position, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise InvalidJobError(
                "?", f"schedules[{position}]", f"must be a mapping, got {type(item).__name__}"
            )
    names = {t for item in items if isinstance(t := item.get("task"), str)}
    known = {n: remembered[n] for n in names if remembered is not None and n in remembered}
    if len(known) < len(names):
        known.update(await known_tasks(db, names - set(known), registry))
        if remembered is not None:
            remembered.update(known)
    specs = [
        new_spec(
            item,
            task=known.get(t) if isinstance(t := item.get("task"), str) else None,
            default_timezone=default_timezone,
        )
        for item in items
    ]
    when = now if now is not None else await db.now()
    return await add_many(db, specs, tasks=known, now=when, by=by)


async def add(
    db: Database, spec: ScheduleSpec, *, task: TaskInfo, now: datetime, by: str
) -> ScheduleRecord:
    """Store one schedule; :func:`add_many` with one."""
    return (await add_many(db, [spec], tasks={task.name: task}, now=now, by=by))[0]


async def add_many(
    db: Database,
    specs: Sequence[ScheduleSpec],
    *,
    tasks: Mapping[str, TaskInfo],
    now: datetime,
    by: str,
) -> list[ScheduleRecord]:
    """Store many schedules in one transaction, all or none, one multi-row INSERT per page
    (:data:`slotcron.store.schedule_inserts.PAGES`). An id given twice in ``specs`` refuses the
    whole batch with :class:`InvalidJobError` naming it; an id already taken by a job or a
    schedule, with :class:`IdTaken` (a conflict: exit 1, HTTP 409), whose message holds no
    other row's data (the driver's error, which does, goes no further). ``tasks`` gives each
    task's options, stored with its schedules for what reads them without the code (the
    leader)."""
    seen: set[str] = set()
    for spec in specs:
        if spec.id in seen:
            raise InvalidJobError(spec.id, "id", "given twice in this batch")
        seen.add(spec.id)
    records = [ScheduleRecord(s, now, now, s.schedule().next_after(now)) for s in specs]
    # A batch that is one INSERT (one schedule, a page) is all or none by itself: on PostgreSQL
    # it goes alone, in autocommit (one round trip instead of BEGIN, INSERT, COMMIT), and its
    # announcement follows its commit. A longer batch is one transaction.
    alone = len(records) in PAGES
    try:
        async with db.alone(write=True) if alone else db.transaction() as conn:
            mark = version_mark()
            await insert_rows(conn, [insert_row(r, tasks[r.spec.task], by, mark) for r in records])
            earliest = min((r.next_slot for r in records if r.next_slot is not None), default=None)
            if _soon(earliest, now):
                await _announce(db, conn, f"add {iso(earliest)}", now)
    except IntegrityError:
        taken = await taken_ids(db, [s.id for s in specs])
        if not taken:  # taken, then freed again before we looked: a lost race all the same
            who = specs[0].id if len(specs) == 1 else f"{specs[0].id} (of {len(specs)})"
            raise IdTaken(who, "taken by a concurrent write; try again") from None
        raise IdTaken(taken[0], "already taken by a job or a schedule") from None
    return records


async def update(
    db: Database, schedule_id: str, changes: Mapping[str, Any], *, now: datetime, by: str
) -> ScheduleRecord:
    """Apply ``changes`` (:data:`slotcron.jobs.schedules.CHANGEABLE`) to a schedule. A new
    timing takes effect from its first slot after both now and the last slot decided (a decided
    slot is never re-opened); else the next slot stays. A code job is :class:`Refused`.

    The row gets a new :func:`version_mark`: from its commit, a claim presenting the one it
    replaces (an instance that has not heard of the update yet) is refused under the row lock,
    so the old timing and params decide no slot after the commit."""
    async with db.transaction() as conn:
        row = await _locked(conn, schedule_id)
        current = _record(row)
        spec = changed_spec(current.spec, changes)
        next_slot = current.next_slot
        if spec.timing() != current.spec.timing() or next_slot is None:
            after = max(now, row.last_slot_at) if row.last_slot_at is not None else now
            next_slot = spec.schedule().next_after(after)
        await conn.execute(
            sa.update(jobs)
            .where(jobs.c.name == schedule_id)
            .values(
                kind=spec.kind,
                schedule=spec.expression,
                timezone=spec.timezone,
                params=spec.params,
                jitter=spec.jitter,
                paused=spec.paused,
                next_slot_at=next_slot,
                updated_at=now,
                updated_by=by,
                fingerprint=version_mark(),
                **changed_options(row.options, current.spec, spec),
            )
        )
        if _soon(current.next_slot, now) or _soon(next_slot, now):
            await _announce(db, conn, f"update {schedule_id} {iso(next_slot)}", now)
    return ScheduleRecord(spec, current.created_at, now, next_slot)


async def remove(db: Database, schedule_id: str, *, now: datetime) -> None:
    """Delete a schedule: no further slot of it runs (its runs waiting QUEUED are recorded
    SKIPPED, saying why); its history stays."""
    async with db.transaction() as conn:
        row = await _locked(conn, schedule_id)
        await conn.execute(delete(jobs).where(jobs.c.name == schedule_id))
        # Its runs waiting in the queue would never run: settled now, saying why.
        await settle_queued(conn, schedule_id, now=now)
        if _soon(row.next_slot_at, now):
            await _announce(db, conn, f"remove {schedule_id}", now)


async def _announce(db: Database, conn: Any, payload: str, now: datetime) -> None:
    """Tell the instances, once this write commits: a notification where the database has them
    (PostgreSQL), and a new token in ``scheduler_changes`` for those that poll instead (other
    databases, or a listener whose connection was lost)."""
    await db.dialect.notify(conn, CHANNEL, payload)
    row = {"name": CHANGES_ROW, "token": uuid.uuid4().hex, "changed_at": now}
    await conn.execute(
        db.dialect.upsert(changes, keys=["name"], update=["token", "changed_at"]), row
    )


def _soon(slot: datetime | None, now: datetime) -> bool:
    return slot is not None and slot <= now + ANNOUNCE_WITHIN


async def _locked(conn: Any, schedule_id: str) -> Any:
    row = (
        await conn.execute(
            select(*_COLUMNS, jobs.c.last_slot_at)
            .where(jobs.c.name == schedule_id)
            .with_for_update()
        )
    ).one_or_none()
    if row is None:
        raise NotFound(f"no schedule with id {schedule_id!r}")
    if row.task is None:
        raise Refused(
            f"{schedule_id!r} is a @cron/@every job, owned by its code: change it there, not "
            "at runtime"
        )
    return row


# Reads


async def get(db: Database, schedule_id: str) -> ScheduleRecord:
    async with db.read() as conn:
        row = (
            await conn.execute(select(*_COLUMNS).where(jobs.c.name == schedule_id))
        ).one_or_none()
    if row is None or row.task is None:
        what = "" if row is None else f" ({schedule_id!r} is a @cron/@every job)"
        raise NotFound(f"no schedule with id {schedule_id!r}{what}")
    return _record(row)


async def list_schedules(
    db: Database, *, task: str | None = None, limit: int = 100, offset: int = 0
) -> list[ScheduleRecord]:
    """Schedules ordered by id, ``task``'s only when given."""
    which = jobs.c.task.is_not(None) if task is None else jobs.c.task == task
    async with db.read() as conn:
        rows = await conn.execute(
            select(*_COLUMNS).where(which).order_by(jobs.c.name).limit(limit).offset(offset)
        )
        return [_record(r) for r in rows]


@dataclass(frozen=True)
class LastRun:
    """A schedule's latest execution, as the jobs listing reads a job's (QUEUED aside: a run
    nobody has taken yet is not an outcome)."""

    status: str
    scheduled_at: datetime
    """Its slot (for a manual run, when it was requested)."""


async def last_runs(db: Database, ids: Sequence[str]) -> dict[str, LastRun]:
    """The latest execution of each schedule of ``ids`` (a page of a listing, at most
    :data:`CHUNK`) that has one, in one query whatever the length of their history: for each id,
    a walk down the ``(job_name, id)`` index from its newest row, stopping at the first that is
    not QUEUED (a ``GROUP BY job_name`` with ``max(id)`` would read every row of every history
    on PostgreSQL, which has no loose index scan)."""
    if not ids:
        return {}
    if len(ids) > CHUNK:
        raise ValueError(f"at most {CHUNK} ids at once, got {len(ids)}")

    def latest(column: Any) -> Any:
        return (
            select(column)
            .where(executions.c.job_name == jobs.c.name, executions.c.status != "QUEUED")
            .order_by(executions.c.id.desc())
            .limit(1)
            .correlate(jobs)
            .scalar_subquery()
        )

    # Two small walks of the same index rather than a join on the newest id: a join condition
    # that holds a correlated subquery is a nested loop over the whole history on PostgreSQL.
    # One statement is one snapshot on every backend, so both read the same newest row.
    query = select(
        jobs.c.name,
        latest(executions.c.status).label("status"),
        latest(executions.c.scheduled_at).label("scheduled_at"),
    ).where(jobs.c.name.in_(list(ids)))
    async with db.read() as conn:
        rows = (await conn.execute(query)).all()
    return {r.name: LastRun(r.status, r.scheduled_at) for r in rows if r.status is not None}


async def schedule_ids_among(db: Database, names: Sequence[str]) -> list[str]:
    """Which of ``names`` are schedules: a code job cannot take a schedule's id."""
    found: list[str] = []
    for start in range(0, len(names), CHUNK):
        async with db.read() as conn:
            rows = await conn.execute(
                select(jobs.c.name).where(
                    jobs.c.name.in_(names[start : start + CHUNK]), jobs.c.task.is_not(None)
                )
            )
            found.extend(r.name for r in rows)
    return found
