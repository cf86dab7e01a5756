"""Who shares the planning of this instance's jobs: the live instances with its job digest
(:mod:`slotcron.engine.shares`)."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime

from sqlalchemy import false, func, or_, select, update

from slotcron.store.database import Database
from slotcron.store.tables import instances, jobs


async def members(db: Database, *, jobs_digest: str, alive_after: datetime) -> list[str]:
    """The ids of the running instances with ``jobs_digest`` that heartbeat after
    ``alive_after``: one read of the instance rows (a few per live instance, the stopped
    ones until the history's retention prunes them)."""
    async with db.read() as conn:
        rows = await conn.execute(
            select(instances.c.instance_id).where(
                instances.c.jobs_digest == jobs_digest,
                instances.c.state == "running",
                instances.c.heartbeat_at > alive_after,
            )
        )
        return [r.instance_id for r in rows]


async def join(db: Database, *, jobs_digest: str, instance_id: str, now: datetime) -> None:
    """``instance_id`` joins the running instances with ``jobs_digest``, once it plans: its row
    says the digest (registered without one, a starting instance is nobody's member: one whose
    start-up fails and retries must not be counted on) and that it is alive at ``now``
    (registering thousands of jobs can take longer than the others' silence limit), and the
    others are told (their next heartbeat finds their ``reshare`` flag set, and they read the
    members again)."""
    async with db.transaction() as conn:
        await conn.execute(
            update(instances)
            .where(instances.c.instance_id == instance_id)
            .values(jobs_digest=jobs_digest, heartbeat_at=now)
        )
        await conn.execute(
            update(instances)
            .where(
                instances.c.jobs_digest == jobs_digest,
                instances.c.state == "running",
                instances.c.instance_id != instance_id,
                instances.c.reshare == false(),
            )
            .values(reshare=True)
        )


async def overdue(
    db: Database,
    *,
    before: datetime,
    after: datetime,
    limit: int,
    tasks: Collection[str] = (),
) -> list[tuple[str, str | None, datetime]]:
    """Jobs and schedules whose next slot is in ``(after, before]``: nobody decided it in time
    (its owner dead, paused or cut off; a paused job's slot too: it is recorded ``SKIPPED`` by
    whoever claims it). Code jobs, and the schedules of ``tasks`` only (those of a task no
    live instance registers wait, and must not hide the others). ``(name, task,
    next_slot_at)``, newest first (the slots that can still run within their grace). One range
    read on the ``next_slot_at`` index."""
    of_tasks = jobs.c.task.in_(list(tasks)) if tasks else None
    runnable = jobs.c.task.is_(None) if of_tasks is None else or_(jobs.c.task.is_(None), of_tasks)
    async with db.read() as conn:
        rows = await conn.execute(
            select(jobs.c.name, jobs.c.task, jobs.c.next_slot_at)
            .where(jobs.c.next_slot_at <= before, jobs.c.next_slot_at > after, runnable)
            .order_by(jobs.c.next_slot_at.desc(), jobs.c.name)
            .limit(limit)
        )
        return [(r.name, r.task, r.next_slot_at) for r in rows]


async def next_due(db: Database, *, after: datetime) -> datetime | None:
    """The earliest next slot of any job or schedule after ``after``."""
    async with db.read() as conn:
        found: datetime | None = await conn.scalar(
            select(func.min(jobs.c.next_slot_at)).where(jobs.c.next_slot_at > after)
        )
        return found


CHUNK = 1000
"""Names per ``IN (...)`` list."""


async def next_slots(db: Database, names: list[str]) -> dict[str, datetime | None]:
    """Each job's next undecided slot as stored (what an instance that starts planning a job,
    at start-up or when it comes to own it, starts from)."""
    found: dict[str, datetime | None] = {}
    async with db.read() as conn:
        for start in range(0, len(names), CHUNK):
            some = names[start : start + CHUNK]
            rows = await conn.execute(
                select(jobs.c.name, jobs.c.next_slot_at).where(jobs.c.name.in_(some))
            )
            found.update((r.name, r.next_slot_at) for r in rows)
    return found
