"""What operators ask of the cluster: restart a slot, trigger a run, pause and resume a job.

Each is one transaction that writes a row the running instances act on (a QUEUED execution,
a paused flag); none needs to reach an instance directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, insert, select, update
from sqlalchemy.exc import IntegrityError

from slotcron.errors import MAX_QUEUED, NotFound, QueueFull, Refused
from slotcron.jobs.schedule_fields import check_params
from slotcron.store.database import Database
from slotcron.store.lifeline import announce_queued
from slotcron.store.queue import queued_count
from slotcron.store.tables import executions, instances, jobs

RESTARTABLE = ("FAILED", "STOPPED", "ABANDONED")


@dataclass(frozen=True)
class Queued:
    execution_id: int
    job: str
    scheduled_at: datetime
    attempt: int
    trigger: str


async def live_instances(db: Database, *, now: datetime, within: float) -> list[str]:
    """Instances running and heartbeating within ``within`` seconds."""
    async with db.read() as conn:
        rows = await conn.execute(
            select(instances.c.instance_id).where(
                instances.c.state == "running",
                instances.c.heartbeat_at >= now - timedelta(seconds=within),
            )
        )
        return [r.instance_id for r in rows]


async def _job_options(conn: Any, name: str) -> dict[str, Any]:
    row = (
        await conn.execute(select(jobs.c.options).where(jobs.c.name == name).with_for_update())
    ).one_or_none()
    if row is None:
        raise NotFound(f"no job named {name!r} is known to the database")
    return dict(row.options or {})


async def _room_in_queue(conn: Any, name: str) -> None:
    """Refuse a run queued past :data:`MAX_QUEUED` of one job (under the job's row lock, which
    the caller holds: two writers cannot both queue the hundred-and-first)."""
    if await queued_count(conn, name, at_most=MAX_QUEUED) >= MAX_QUEUED:
        raise QueueFull(
            f"{name!r} already has {MAX_QUEUED} runs waiting QUEUED, the most one job may "
            "have: wait for them to run (or restart fewer at once)"
        )


async def restart(db: Database, *, execution_id: int, now: datetime) -> Queued:
    """Queue a new attempt of the slot of a FAILED, STOPPED or ABANDONED execution, with the
    state last checkpointed for that slot. Spring Batch's rules: a COMPLETED slot never runs
    again; a slot already RUNNING or QUEUED is not restarted twice."""
    async with db.transaction() as conn:
        row = (
            await conn.execute(select(executions).where(executions.c.id == execution_id))
        ).one_or_none()
        if row is None:
            raise NotFound(f"no execution with id {execution_id}")
        options = await _job_options(conn, row.job_name)  # locks the job: one restart at a time
        await _room_in_queue(conn, row.job_name)
        attempts = (
            await conn.execute(
                select(executions)
                .where(
                    executions.c.job_name == row.job_name,
                    executions.c.scheduled_at == row.scheduled_at,
                )
                .order_by(executions.c.attempt)
            )
        ).all()
        slot = f"{row.job_name} slot {row.scheduled_at.isoformat()}"
        _check_restartable(slot, row, attempts, options)
        latest = attempts[-1]
        await announce_queued(conn, db.dialect, now)
        try:
            result = await conn.execute(
                insert(executions).values(
                    job_name=row.job_name,
                    scheduled_at=row.scheduled_at,
                    trigger="restart",
                    status="QUEUED",
                    attempt=latest.attempt + 1,
                    created_at=now,
                    available_at=now,
                    params=latest.params or {},
                    state=latest.state or {},
                )
            )
        except IntegrityError:
            raise Refused(f"{slot} was restarted by someone else just now") from None
    return Queued(
        _new_id(result),
        row.job_name,
        row.scheduled_at,
        latest.attempt + 1,
        "restart",
    )


def _check_restartable(
    slot: str, row: Any, attempts: Sequence[Any], options: dict[str, Any]
) -> None:
    """Refuse (:class:`Refused`) to restart execution ``row`` of a slot with these
    ``attempts``: a COMPLETED slot, one RUNNING or QUEUED, or a job declared not restartable."""
    done = [a for a in attempts if a.status == "COMPLETED"]
    if done:
        raise Refused(
            f"{slot} already COMPLETED (execution {done[0].id}); a completed slot never runs again"
        )
    busy = [a for a in attempts if a.status in ("RUNNING", "QUEUED")]
    if busy:
        raise Refused(f"{slot} is already {busy[0].status} (execution {busy[0].id})")
    if row.status not in RESTARTABLE:
        raise Refused(
            f"execution {row.id} is {row.status}; only {', '.join(RESTARTABLE)} "
            "executions can be restarted"
        )
    if not options.get("restartable", True):
        raise Refused(f"job {row.job_name!r} is declared restartable=False")


async def trigger(db: Database, *, job: str, params: dict[str, Any], now: datetime) -> Queued:
    """Queue a manual run of ``job``: its own slot (the time it was requested). ``params`` are
    checked as a schedule's are (:class:`InvalidJobError` naming ``params``)."""
    params = check_params(job, params)
    async with db.transaction() as conn:
        await _job_options(conn, job)
        await _room_in_queue(conn, job)
        # Two triggers in the same microsecond would share a slot: the unique key says so.
        latest = (
            await conn.execute(
                select(func.max(executions.c.scheduled_at)).where(
                    executions.c.job_name == job, executions.c.trigger == "manual"
                )
            )
        ).scalar_one_or_none()
        slot = now if latest is None or latest < now else latest + timedelta(microseconds=1)
        await announce_queued(conn, db.dialect, now)
        result = await conn.execute(
            insert(executions).values(
                job_name=job,
                scheduled_at=slot,
                trigger="manual",
                status="QUEUED",
                attempt=1,
                created_at=now,
                available_at=now,
                params=params,
                state={},
            )
        )
    return Queued(_new_id(result), job, slot, 1, "manual")


async def trigger_live(
    db: Database, *, job: str, params: dict[str, Any], now: datetime, live_within: float
) -> Queued:
    """:func:`trigger`, refused when no instance is live to take the run (one heartbeating
    within ``live_within`` seconds): a manual run nobody would start must not wait silently."""
    if not await live_instances(db, now=now, within=live_within):
        raise Refused(
            f"no live instance to run {job!r}: start `slotcron run` (an instance is live while "
            f"it heartbeats within SCHEDULER_LEASE_SECONDS={live_within:g})"
        )
    return await trigger(db, job=job, params=params, now=now)


async def set_paused(db: Database, *, job: str, paused: bool, reason: str | None) -> bool:
    """Pause or resume; False when it already was. Claims read the flag, so it takes effect on
    the whole cluster at the next slot."""
    async with db.transaction() as conn:
        current = (
            await conn.execute(select(jobs.c.paused).where(jobs.c.name == job).with_for_update())
        ).one_or_none()
        if current is None:
            raise NotFound(f"no job named {job!r} is known to the database")
        if bool(current.paused) == paused:
            return False
        await conn.execute(
            update(jobs)
            .where(jobs.c.name == job)
            .values(paused=paused, paused_reason=reason if paused else None)
        )
    return True


@dataclass(frozen=True)
class JobRecord:
    name: str
    kind: str
    schedule: str
    timezone: str
    next_slot: datetime | None
    paused: bool
    paused_reason: str | None
    last_status: str | None
    last_slot: datetime | None
    last_finished: datetime | None
    registered_by: str | None
    version: str | None
    drift: dict[str, str]
    superseded: dict[str, str] = field(default_factory=dict)
    """Live instances that stopped firing the job because a newer registration changed its
    schedule: ``{instance_id: "schedule (timezone)"}`` of the schedule each still runs."""


async def list_jobs(db: Database, *, now: datetime, live_within: float) -> list[JobRecord]:
    """Every job the database knows, with its latest execution's status, and ``drift``: the
    schedule each live version registered, when live versions disagree (else empty)."""
    async with db.read() as conn:
        live = {
            r.instance_id: r.version
            for r in await conn.execute(
                select(instances.c.instance_id, instances.c.version).where(
                    instances.c.state != "stopped",
                    instances.c.heartbeat_at >= now - timedelta(seconds=live_within),
                )
            )
        }
    live_versions = set(live.values())
    latest = (
        select(executions.c.job_name, func.max(executions.c.id).label("id"))
        .where(executions.c.status.not_in(("QUEUED",)))
        .group_by(executions.c.job_name)
        .subquery()
    )
    query = (
        select(
            jobs,
            executions.c.status.label("last_status"),
            executions.c.scheduled_at.label("last_slot"),
            executions.c.finished_at.label("last_finished"),
        )
        .select_from(
            jobs.outerjoin(latest, latest.c.job_name == jobs.c.name).outerjoin(
                executions, executions.c.id == latest.c.id
            )
        )
        # Runtime schedules (a task set) are listed by `schedules list`: they can be a million.
        .where(jobs.c.task.is_(None))
        .order_by(jobs.c.name)
    )
    async with db.read() as conn:
        rows = (await conn.execute(query)).all()
    return [
        JobRecord(
            name=r.name,
            kind=r.kind,
            schedule=r.schedule,
            timezone=r.timezone,
            next_slot=r.next_slot_at,
            paused=bool(r.paused),
            paused_reason=r.paused_reason,
            last_status=r.last_status,
            last_slot=r.last_slot,
            last_finished=r.last_finished,
            registered_by=r.updated_by,
            version=r.version,
            drift=_drift(r.schedules or {}, live_versions),
            superseded={k: v for k, v in (r.superseded or {}).items() if k in live},
        )
        for r in rows
    ]


def _drift(schedules: dict[str, str], live_versions: set[str]) -> dict[str, str]:
    live = {v: s for v, s in schedules.items() if v in live_versions}
    return live if len(set(live.values())) > 1 else {}


def _new_id(result: Any) -> int:
    return int(result.inserted_primary_key[0])
