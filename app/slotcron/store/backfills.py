"""Backfills: ``slotcron backfill JOB --from T1 --to T2``, a row any live instance carries on.

:func:`create` checks the request and writes the row; the instances step it
(:func:`slotcron.store.backfill_slots.step`, from :mod:`slotcron.engine.backfilling`), queueing
each slot that never completed as an attempt with trigger ``backfill``; the queue of manual runs
takes them (:mod:`slotcron.engine.queued`) under the job's overlap policy. :func:`listing` gives
each backfill's progress; :func:`cancel` stops one (its queued attempts are recorded
``SKIPPED``; runs under way finish).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, func, insert, select, update

from slotcron.errors import NotFound, Refused, UsageError
from slotcron.jobs.stored import StoredJob
from slotcron.status import Status
from slotcron.store.backfill_slots import IN_FLIGHT, history
from slotcron.store.database import Database
from slotcron.store.lifeline import BACKFILL_CREATED, QUEUED_CHANNEL
from slotcron.store.tables import backfills, executions, jobs
from slotcron.text import iso

MAX_SLOTS = 100_000
"""Slots one backfill may span (its range is counted, and a dry run lists them, at once)."""
DEFAULT_RATE = 10.0
"""Starts a second when none is asked."""
MAX_RATE = 10_000.0
CANCELLED = "not run: its backfill was cancelled"
FAILED = (Status.FAILED, Status.ABANDONED, Status.STOPPED)


@dataclass(frozen=True)
class Backfill:
    id: int
    job: str
    start: datetime
    end: datetime
    rate: float
    status: str
    next_at: datetime | None
    total: int
    seen: int
    queued: int
    passed: int
    note: str | None
    created_at: datetime
    updated_at: datetime
    done: int = 0
    failed: int = 0
    in_flight: int = 0

    @property
    def left(self) -> int:
        """Slots not decided yet: not considered, or queued and not finished."""
        return 0 if self.status == "CANCELLED" else self.total - self.seen + self.in_flight

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "job": self.job,
            "from": iso(self.start),
            "to": iso(self.end),
            "rate": self.rate,
            "status": self.status,
            "next_at": None if self.next_at is None else iso(self.next_at),
            "slots": self.total,
            "done": self.done,
            "failed": self.failed,
            "in_flight": self.in_flight,
            "left": self.left,
            "passed": self.passed,
            "note": self.note,
            "created_at": iso(self.created_at),
            "updated_at": iso(self.updated_at),
        }


def check_request(start: datetime, end: datetime, rate: float | None) -> float:
    """The rate asked (or the default); a range that is empty or backwards, or a rate that is
    negative or absurd, is bad input (:class:`UsageError`)."""
    if end <= start:
        raise UsageError(f"--to {iso(end)} is not after --from {iso(start)}")
    return DEFAULT_RATE if rate is None else check_rate(rate)


def check_rate(rate: float) -> float:
    """A rate of starts a second, 0 to :data:`MAX_RATE` (0: as fast as capacity allows)."""
    if not (math.isfinite(rate) and 0 <= rate <= MAX_RATE):
        raise UsageError(f"--rate must be between 0 (as fast as capacity allows) and {MAX_RATE:g}")
    return rate


async def _job(db: Database, name: str) -> StoredJob:
    async with db.read() as conn:
        row = (
            await conn.execute(
                select(
                    jobs.c.name, jobs.c.kind, jobs.c.schedule, jobs.c.timezone, jobs.c.options,
                    jobs.c.paused,
                ).where(jobs.c.name == name)
            )
        ).one_or_none()  # fmt: skip
    if row is None:
        raise NotFound(f"no job named {name!r} is known to the database")
    return StoredJob.of(row)


def _slots(job: StoredJob, start: datetime, end: datetime) -> list[datetime]:
    slots = list(itertools.islice(job.slots(start, end), MAX_SLOTS + 1))
    if len(slots) > MAX_SLOTS:
        raise UsageError(
            f"{iso(start)} to {iso(end)} holds more than {MAX_SLOTS} slots of {job.name!r}: "
            "backfill a shorter range at a time"
        )
    return slots


async def would_run(
    db: Database, *, job: str, start: datetime, end: datetime, now: datetime, kept_since: datetime
) -> list[datetime]:
    """The slots a backfill of ``job`` over [``start``, ``end``) would run, were it made now
    (``--dry-run``): nothing is written."""
    stored = await _job(db, job)
    slots = _slots(stored, start, end)
    async with db.read() as conn:
        known = await history(conn, job, slots, lock=False)
    if known is None:
        raise NotFound(f"no job named {job!r} is known to the database")
    return [s for s in slots if known.why_not(s, kept_since=kept_since) is None]


async def create(
    db: Database, *, job: str, start: datetime, end: datetime, rate: float | None, now: datetime
) -> Backfill:
    """Record a backfill of ``job``'s slots in [``start``, ``end``); the live instances carry it
    on. A paused job, or one with ``max_runs`` (its count would race the backfill's runs), is
    refused (:class:`Refused`)."""
    rate = check_request(start, end, rate)
    stored = await _job(db, job)
    if stored.paused:
        raise Refused(f"{job!r} is paused: resume it before backfilling it")
    if stored.max_runs is not None:
        raise Refused(f"{job!r} has max_runs={stored.max_runs}: a bounded job is not backfilled")
    slots = _slots(stored, start, end)
    values = {
        "job_name": job, "start_at": start, "end_at": end, "rate": rate,
        "status": "RUNNING" if slots else "COMPLETED", "next_at": slots[0] if slots else None,
        "slots_total": len(slots), "slots_seen": 0, "slots_queued": 0, "slots_passed": 0,
        "created_at": now, "updated_at": now,
    }  # fmt: skip
    async with db.transaction() as conn:
        result: Any = await conn.execute(insert(backfills).values(**values))
        if slots:  # instances that listen start it at once, whatever their idle poll
            await db.dialect.notify(conn, QUEUED_CHANNEL, BACKFILL_CREATED)
    return Backfill(
        int(result.inserted_primary_key[0]), job, start, end, rate, str(values["status"]),
        slots[0] if slots else None, len(slots), 0, 0, 0, None, now, now,
    )  # fmt: skip


async def request(
    db: Database,
    *,
    job: str,
    start: datetime,
    end: datetime,
    rate: float | None,
    dry_run: bool,
    now: datetime,
    retention_days: float,
) -> dict[str, Any]:
    """What ``slotcron backfill``, ``POST /api/jobs/{name}/backfill`` and
    :meth:`slotcron.Client.backfill` do, as they answer it: the backfill made, or with
    ``dry_run`` the slots it would run (nothing written)."""
    if not dry_run:
        return (await create(db, job=job, start=start, end=end, rate=rate, now=now)).as_dict()
    check_request(start, end, rate)
    slots = await would_run(
        db, job=job, start=start, end=end, now=now, kept_since=kept_since(now, retention_days)
    )
    return {
        "job": job,
        "from": iso(start),
        "to": iso(end),
        "dry_run": True,
        "count": len(slots),
        "slots": [iso(slot) for slot in slots],
    }


def _read(row: Any, counts: dict[tuple[int, str], int]) -> Backfill:
    def count(*statuses: str) -> int:
        return sum(counts.get((int(row.id), s), 0) for s in statuses)

    return Backfill(
        int(row.id), row.job_name, row.start_at, row.end_at, float(row.rate), row.status,
        row.next_at, row.slots_total, row.slots_seen, row.slots_queued, row.slots_passed,
        row.note, row.created_at, row.updated_at,
        done=count(Status.COMPLETED), failed=count(*FAILED), in_flight=count(*IN_FLIGHT),
    )  # fmt: skip


async def _listed(db: Database, query: Any, *, in_flight_only: bool = False) -> list[Backfill]:
    async with db.read() as conn:
        rows = (await conn.execute(query)).all()
        ids = [int(r.id) for r in rows]
        counts: dict[tuple[int, str], int] = {}
        if ids:
            which: ColumnElement[bool] = executions.c.backfill_id.in_(ids)
            if in_flight_only:  # an index range each, whatever the backfill's history
                which &= executions.c.status.in_(list(IN_FLIGHT))
            grouped = await conn.execute(
                select(executions.c.backfill_id, executions.c.status, func.count())
                .where(which)
                .group_by(executions.c.backfill_id, executions.c.status)
            )
            counts = {(int(b), str(s)): int(n) for b, s, n in grouped}
    return [_read(row, counts) for row in rows]


async def listing(db: Database, *, job: str | None = None, limit: int = 100) -> list[Backfill]:
    """The newest backfills first (``job``'s only, when given), with their progress."""
    query = select(backfills).order_by(backfills.c.id.desc()).limit(limit)
    if job is not None:
        query = query.where(backfills.c.job_name == job)
    return await _listed(db, query)


async def active(db: Database) -> list[Backfill]:
    """The backfills under way, oldest first, with their runs in flight (``done`` and
    ``failed`` are not counted: :func:`listing` counts them)."""
    return await _listed(
        db,
        select(backfills).where(backfills.c.status == "RUNNING").order_by(backfills.c.id),
        in_flight_only=True,
    )


async def complete(db: Database, backfill_id: int, *, now: datetime) -> bool:
    """Record a backfill COMPLETED once every slot was considered and none is in flight."""
    async with db.transaction() as conn:
        busy = (
            await conn.execute(
                select(executions.c.id)
                .where(
                    executions.c.backfill_id == backfill_id,
                    executions.c.status.in_(list(IN_FLIGHT)),
                )
                .limit(1)
            )
        ).first()
        if busy is not None:
            return False
        result = await conn.execute(
            update(backfills)
            .where(
                backfills.c.id == backfill_id,
                backfills.c.status == "RUNNING",
                backfills.c.next_at.is_(None),
            )
            .values(status="COMPLETED", updated_at=now)
        )
    return bool(result.rowcount)


async def cancel(db: Database, backfill_id: int, *, now: datetime) -> int:
    """Stop a backfill: its queued attempts are recorded SKIPPED (runs under way finish).
    Returns how many queued attempts were settled."""
    async with db.transaction() as conn:
        row = (
            await conn.execute(
                select(backfills.c.status).where(backfills.c.id == backfill_id).with_for_update()
            )
        ).one_or_none()
        if row is None:
            raise NotFound(f"no backfill with id {backfill_id}")
        if row.status != "RUNNING":
            raise Refused(f"backfill {backfill_id} is already {row.status}")
        await conn.execute(
            update(backfills)
            .where(backfills.c.id == backfill_id)
            .values(status="CANCELLED", note="cancelled", next_at=None, updated_at=now)
        )
        settled = await conn.execute(
            update(executions)
            .where(
                executions.c.backfill_id == backfill_id,
                executions.c.status == Status.QUEUED,
            )
            .values(status=Status.SKIPPED, finished_at=now, error=CANCELLED)
        )
    return int(settled.rowcount)


def kept_since(now: datetime, retention_days: float) -> datetime:
    """The oldest slot whose rows the history surely still holds: pruning deletes rows created
    before ``retention_days`` ago, and a row is created at most a claim-ahead horizon before its
    slot (an hour's margin; a catch-up creates it later, which keeps it longer)."""
    return now - timedelta(days=retention_days) + timedelta(hours=1)
