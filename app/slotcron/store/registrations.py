"""Who is here: job rows (one per job name) and instance rows (one per live or recent instance)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import select, update

from slotcron.schedule.fingerprint import fingerprint, same_schedule
from slotcron.schedule.slots import Schedule
from slotcron.store import leadership
from slotcron.store.database import Database
from slotcron.store.tables import instances, jobs

_CHUNK = 500


@dataclass(frozen=True)
class StoredJob:
    kind: str
    schedule: str
    timezone: str
    next_slot_at: datetime | None
    updated_by: str | None
    version: str | None
    schedules: dict[str, str]
    fingerprint: str | None = None
    """The schedule in force before this registration (:mod:`slotcron.schedule.fingerprint`)."""


@dataclass(frozen=True)
class JobRow:
    name: str
    kind: str
    schedule: str
    timezone: str
    options: dict[str, Any]
    first_slot: datetime | None = None
    slots: Schedule | None = None
    """The job's slots as this instance computes them: what its fingerprint is computed from.
    None registers no fingerprint (the schedule in force stays as it is)."""


@dataclass
class Registered:
    """What a registration found and left: ``stored`` is each known job's row before it;
    ``fingerprints`` the schedule in force after it, as this instance computes it (what its
    claims present); ``took_over`` the jobs whose schedule in force this registration
    replaced with a different one (the newest registration wins)."""

    stored: dict[str, StoredJob] = field(default_factory=dict)
    fingerprints: dict[str, str] = field(default_factory=dict)
    took_over: set[str] = field(default_factory=set)


async def register_jobs(
    db: Database, rows: Sequence[JobRow], *, now: datetime, instance_id: str, version: str
) -> Registered:
    """Insert new job rows and refresh the definition of known ones, under their row locks.

    The newest registration wins: a job whose schedule places its slots other than where the
    schedule in force does (compared by instants,
    :func:`slotcron.schedule.fingerprint.same_schedule`) takes
    over at once, with a new fingerprint, and expects its own next slot; instances still
    presenting the old fingerprint are refused their claims from this commit on. A schedule
    that places its slots alike keeps the fingerprint in force.

    Never touches ``paused`` or ``last_slot_at``, nor ``next_slot_at`` unless the schedule
    changed: those belong to the cluster, not to whichever instance started last.
    """
    registered = Registered()
    for start in range(0, len(rows), _CHUNK):
        chunk = rows[start : start + _CHUNK]
        # New jobs are inserted first, as they are (a row another instance inserted meanwhile
        # is left alone): then every row exists and is locked before anything is decided, so
        # two instances starting together decide one after the other. Locking a missing key
        # would take a gap lock on MariaDB, and two such registrations would deadlock.
        known = await _known_names(db, [row.name for row in chunk])
        new = [
            _values(row, Registered(), {}, now=now, instance_id=instance_id, version=version)
            for row in chunk
            if row.name not in known
        ]
        if new:
            async with db.transaction() as conn:
                await conn.execute(db.dialect.upsert(jobs, keys=["name"], update=["name"]), new)
        async with db.transaction() as conn:
            superseded = await _lock_stored(conn, chunk, registered, instance_id)
            values = [
                _values(
                    row, registered, superseded, now=now, instance_id=instance_id, version=version
                )
                for row in chunk
            ]
            await conn.execute(db.dialect.upsert(jobs, keys=["name"], update=_REFRESHED), values)
    return registered


_REFRESHED = [
    "kind",
    "schedule",
    "timezone",
    "options",
    "updated_at",
    "updated_by",
    "version",
    "schedules",
    "next_slot_at",
    "fingerprint",
    "superseded",
]
"""What a registration rewrites of a known job's row."""


async def _known_names(db: Database, names: list[str]) -> set[str]:
    async with db.read() as conn:
        return set(
            (await conn.execute(select(jobs.c.name).where(jobs.c.name.in_(names)))).scalars()
        )


async def _lock_stored(
    conn: Any, chunk: Sequence[JobRow], registered: Registered, instance_id: str
) -> dict[str, dict[str, str]]:
    """Lock the chunk's rows (in name order) and keep each as it was in ``registered.stored``;
    return each job's ``superseded`` without this instance (registering again ends its
    supersession)."""
    found = await conn.execute(
        select(
            jobs.c.name,
            jobs.c.kind,
            jobs.c.schedule,
            jobs.c.timezone,
            jobs.c.next_slot_at,
            jobs.c.updated_by,
            jobs.c.version,
            jobs.c.schedules,
            jobs.c.fingerprint,
            jobs.c.superseded,
        )
        .where(jobs.c.name.in_(sorted(row.name for row in chunk)))
        .order_by(jobs.c.name)
        .with_for_update()
    )
    superseded: dict[str, dict[str, str]] = {}
    for r in found:
        registered.stored[r.name] = StoredJob(
            r.kind,
            r.schedule,
            r.timezone,
            r.next_slot_at,
            r.updated_by,
            r.version,
            dict(r.schedules or {}),
            r.fingerprint,
        )
        superseded[r.name] = {k: v for k, v in (r.superseded or {}).items() if k != instance_id}
    return superseded


async def mark_superseded(
    db: Database, names: list[str], *, instance_id: str, schedules: Mapping[str, str]
) -> None:
    """Write into each job row's ``superseded`` that this instance (whose schedule of the job
    is ``schedules[name]``) stopped firing it: a newer registration's schedule is in force."""
    async with db.transaction() as conn:
        rows = await conn.execute(
            select(jobs.c.name, jobs.c.superseded)
            .where(jobs.c.name.in_(names))
            .order_by(jobs.c.name)
            .with_for_update()
        )
        for row in rows.all():
            marked = {**(row.superseded or {}), instance_id: schedules.get(row.name, "?")}
            await conn.execute(
                update(jobs).where(jobs.c.name == row.name).values(superseded=marked)
            )


def _values(
    row: JobRow,
    registered: Registered,
    superseded: dict[str, dict[str, str]],
    *,
    now: datetime,
    instance_id: str,
    version: str,
) -> dict[str, Any]:
    """The row to upsert, deciding (under the row lock) whether this schedule takes over."""
    prior = registered.stored.get(row.name)
    in_force = prior.fingerprint if prior else None
    next_slot_at = prior.next_slot_at if prior else row.first_slot
    if row.slots is not None:
        if in_force is None:  # a new job, or one registered before fingerprints
            in_force = fingerprint(row.slots, now)
        elif not same_schedule(row.slots, in_force):
            registered.took_over.add(row.name)
            # The new schedule's slots from now on: none of the old one is owed.
            next_slot_at = row.first_slot
            in_force = fingerprint(row.slots, now)
        registered.fingerprints[row.name] = in_force
    return {
        "name": row.name,
        "kind": row.kind,
        "schedule": row.schedule,
        "timezone": row.timezone,
        "options": row.options,
        "paused": False,
        "last_slot_at": None,
        "next_slot_at": next_slot_at,
        "registered_at": now,
        "updated_at": now,
        "updated_by": instance_id,
        "version": version,
        "schedules": {
            **(prior.schedules if prior else {}),
            version: f"{row.schedule} ({row.timezone})",
        },
        "fingerprint": in_force,
        "superseded": superseded.get(row.name, {}),
    }


async def register_instance(
    db: Database,
    *,
    instance_id: str,
    host: str,
    pid: int,
    version: str,
    now: datetime,
    jobs_digest: str | None = None,
) -> None:
    row = {
        "instance_id": instance_id,
        "host": host,
        "pid": pid,
        "version": version,
        "started_at": now,
        "heartbeat_at": now,
        "state": "running",
        "is_leader": False,
        "jobs_digest": jobs_digest,
    }
    stmt = db.dialect.upsert(
        instances,
        keys=["instance_id"],
        update=["host", "pid", "version", "started_at", "heartbeat_at", "state", "jobs_digest"],
    )
    async with db.transaction() as conn:
        await conn.execute(stmt, row)


async def set_instance_state(db: Database, *, instance_id: str, state: str, now: datetime) -> None:
    async with db.transaction() as conn:
        await conn.execute(
            update(instances)
            .where(instances.c.instance_id == instance_id)
            .values(state=state, heartbeat_at=now)
        )


@dataclass(frozen=True)
class InstanceRecord:
    instance_id: str
    host: str
    pid: int
    version: str
    started_at: datetime
    heartbeat_at: datetime
    state: str
    leader: bool


async def list_instances(db: Database) -> list[InstanceRecord]:
    """Every instance row, newest heartbeat first; ``leader`` from the live leadership lease."""
    holder, lease_until = await leadership.current(db)
    now = await db.now()
    async with db.read() as conn:
        rows = (
            await conn.execute(select(instances).order_by(instances.c.heartbeat_at.desc()))
        ).all()
    live_holder = holder if lease_until is not None and lease_until > now else None
    return [
        InstanceRecord(
            instance_id=r.instance_id,
            host=r.host,
            pid=r.pid,
            version=r.version,
            started_at=r.started_at,
            heartbeat_at=r.heartbeat_at,
            state=r.state,
            leader=r.instance_id == live_holder,
        )
        for r in rows
    ]


async def overdue_jobs(
    db: Database, *, before: datetime, limit: int = 100
) -> list[tuple[str, datetime]]:
    """Jobs whose expected slot is older than ``before``: nobody decided it (an outage, or
    every instance down). ``(name, next_slot_at)``, most overdue first."""
    async with db.read() as conn:
        rows = await conn.execute(
            select(jobs.c.name, jobs.c.next_slot_at)
            # Runtime schedules' overdue slots are decided by their loader
            # (app/slotcron/engine/runtime.py).
            .where(jobs.c.next_slot_at < before, jobs.c.task.is_(None))
            .order_by(jobs.c.next_slot_at)
            .limit(limit)
        )
        return [(r.name, r.next_slot_at) for r in rows]


async def mark_silent_instances(db: Database, *, before: datetime) -> list[str]:
    """Instances that stopped heartbeating (killed, or cut off) before ``before``: recorded
    ``stopped``, so ``instances`` does not show the dead as running."""
    async with db.transaction() as conn:
        silent = [
            r.instance_id
            for r in await conn.execute(
                select(instances.c.instance_id).where(
                    instances.c.state != "stopped", instances.c.heartbeat_at < before
                )
            )
        ]
        if silent:
            await conn.execute(
                update(instances)
                .where(instances.c.instance_id.in_(silent), instances.c.heartbeat_at < before)
                .values(state="stopped", is_leader=False)
            )
    return silent
