"""Skipping one slot: ``slotcron skip JOB --at T`` records that slot ``SKIPPED`` when it comes.

A skip is a row of ``scheduler_skips``; the job's row carries the earliest one not decided yet
(``skip_at``, ``skip_reason``), so every claim, which locks that row anyway, sees it without a
further statement (:func:`slotcron.store.claims.judge`). Every statement that moves the job's
high-water mark past ``skip_at`` moves ``skip_at`` on to the next skip (:func:`moved_on`).

A skip and a claim take the same row lock: a skip committed before the claim is honoured; a slot
already decided (claimed, even ahead of its time) can no longer be skipped or unskipped, and the
operator is told so (:class:`slotcron.errors.Refused`).

    SELECT kind, schedule, timezone, last_slot_at FROM scheduler_jobs WHERE name = :job FOR UPDATE
    not one of the job's slots  -> UsageError (nothing written)
    last_slot_at >= :at         -> Refused: already decided
    INSERT / DELETE scheduler_skips
    UPDATE scheduler_jobs SET skip_at, skip_reason = the earliest skip after last_slot_at
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import BindParameter, ColumnElement, case, delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from slotcron.errors import NotFound, Refused, UsageError
from slotcron.jobs.stored import schedule_of
from slotcron.store.database import Database
from slotcron.store.tables import jobs, skips
from slotcron.text import iso

MAX_REASON = 400
"""As ``scheduler_skips.reason``."""


def skip_reason(reason: str | None) -> str:
    """What a skipped slot's execution records."""
    return f"skipped: {reason}" if reason else "skipped by an operator"


def moved_on(slot: BindParameter[Any]) -> list[tuple[Any, ColumnElement[Any]]]:
    """The SET pairs, in this order, that move a job's ``skip_at`` past ``slot`` once slots up to
    it are decided: the job's next skip after it (NULL: none). In this order because MySQL
    assigns left to right, each assignment seeing the ones before it."""
    passed = jobs.c.skip_at <= slot
    later = (skips.c.job_name == jobs.c.name) & (skips.c.scheduled_at > slot)
    next_at = select(func.min(skips.c.scheduled_at)).where(later).scalar_subquery()
    next_reason = (
        select(skips.c.reason)
        .where(later)
        .order_by(skips.c.scheduled_at)
        .limit(1)
        .scalar_subquery()
    )
    return [
        (jobs.c.skip_reason, case((passed, next_reason), else_=jobs.c.skip_reason)),
        (jobs.c.skip_at, case((passed, next_at), else_=jobs.c.skip_at)),
    ]


@dataclass(frozen=True)
class Skip:
    job: str
    at: datetime
    reason: str | None
    created: bool
    """False when the slot was already skipped (its reason is then the one given now)."""


async def skip(db: Database, *, job: str, at: datetime, reason: str | None, now: datetime) -> Skip:
    """Record that slot ``at`` of ``job`` is to be ``SKIPPED`` with ``reason`` (at most
    :data:`MAX_REASON` characters)."""
    if reason is not None and len(reason) > MAX_REASON:
        raise UsageError(f"--reason has at most {MAX_REASON} characters, got {len(reason)}")
    at = at.astimezone(UTC)
    async with db.transaction() as conn:
        row = await _locked(conn, job, at)
        values = {"job_name": job, "scheduled_at": at, "reason": reason, "created_at": now}
        created = not await _exists(conn, job, at)
        if created:
            try:
                await conn.execute(insert(skips).values(values))
            except IntegrityError:  # only a racing skip of the same slot: it is recorded
                created = False
        if not created:
            await conn.execute(
                update(skips)
                .where(skips.c.job_name == job, skips.c.scheduled_at == at)
                .values(reason=reason)
            )
        await _point_at_next(conn, job, row.last_slot_at)
    return Skip(job=job, at=at, reason=reason, created=created)


async def unskip(db: Database, *, job: str, at: datetime) -> None:
    """Take back the skip of slot ``at`` of ``job`` while it is not decided."""
    at = at.astimezone(UTC)
    async with db.transaction() as conn:
        row = await _locked(conn, job, at)
        if not await _exists(conn, job, at):
            raise Refused(f"{job}: slot {iso(at)} is not skipped")
        await conn.execute(delete(skips).where(skips.c.job_name == job, skips.c.scheduled_at == at))
        await _point_at_next(conn, job, row.last_slot_at)


async def pending(db: Database, job: str) -> list[tuple[datetime, str | None]]:
    """The job's skips not decided yet, earliest first."""
    async with db.read() as conn:
        mark = (await conn.execute(select(jobs.c.last_slot_at).where(jobs.c.name == job))).scalar()
        return [(r.scheduled_at, r.reason) for r in await conn.execute(_undecided(job, mark))]


async def _locked(conn: AsyncConnection, job: str, at: datetime) -> Any:
    """The job's row, locked as a claim locks it, once ``at`` is known to be one of its
    undecided slots."""
    row = (
        await conn.execute(
            select(jobs.c.kind, jobs.c.schedule, jobs.c.timezone, jobs.c.last_slot_at)
            .where(jobs.c.name == job)
            .with_for_update()
        )
    ).one_or_none()
    if row is None:
        raise NotFound(f"no job named {job!r} is known to the database")
    try:
        schedule = schedule_of(row)
    except (ValueError, KeyError) as exc:
        raise Refused(f"{job}: its stored schedule cannot be read: {exc}") from None
    if schedule.next_after(at - timedelta(microseconds=1)) != at:
        raise UsageError(
            f"--at {iso(at)} is not a slot of {job} ({schedule.describe()}); its next slot after "
            f"that is {iso(schedule.next_after(at))}"
        )
    if row.last_slot_at is not None and row.last_slot_at >= at:
        raise Refused(f"{job}: slot {iso(at)} is already decided (see `slotcron history {job}`)")
    return row


def _undecided(job: str, mark: datetime | None) -> Any:
    """The job's skips after its high-water mark ``mark``, earliest first."""
    query = select(skips.c.scheduled_at, skips.c.reason).where(skips.c.job_name == job)
    if mark is not None:
        query = query.where(skips.c.scheduled_at > mark)
    return query.order_by(skips.c.scheduled_at)


async def _exists(conn: AsyncConnection, job: str, at: datetime) -> bool:
    query = select(skips.c.job_name).where(skips.c.job_name == job, skips.c.scheduled_at == at)
    return (await conn.execute(query)).first() is not None


async def _point_at_next(conn: AsyncConnection, job: str, mark: datetime | None) -> None:
    """Make the job's ``skip_at`` its earliest skip after ``mark`` (its high-water mark)."""
    first = (await conn.execute(_undecided(job, mark).limit(1))).first()
    await conn.execute(
        update(jobs)
        .where(jobs.c.name == job)
        .values(
            skip_at=first.scheduled_at if first else None,
            skip_reason=first.reason if first else None,
        )
    )
