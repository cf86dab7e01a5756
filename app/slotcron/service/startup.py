"""Start-up steps, in the order an instance takes them (:meth:`Service._prepare_database`):
the schema checked (or migrated), connections warmed up, the clock synchronised, and the
instance and its jobs registered. Each step takes plain values; a step that fails on a
database error is retried with the others by the service (a step done already finds its own
earlier work).
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncConnection

from slotcron.clock import Clock, DatabaseClock
from slotcron.config import Settings
from slotcron.engine.supersession import Supersession
from slotcron.errors import ConfigError, InvalidJobError
from slotcron.jobs.registry import Job
from slotcron.schedule.slots import Schedule
from slotcron.store import batch as batch_store
from slotcron.store import claims as claim_store
from slotcron.store import markers, migrate, registrations
from slotcron.store import runs as run_store
from slotcron.store import schedules as schedule_store
from slotcron.store import starts as start_store
from slotcron.store.database import Database
from slotcron.store.registrations import JobRow, Registered
from slotcron.version import __version__

log = logging.getLogger("slotcron.service")


async def schema(db: Database, settings: Settings) -> None:
    """Migrate the schema to head (``SCHEDULER_AUTO_MIGRATE``), or refuse to start on one that
    is not at head."""
    if settings.migrate_on_start:
        before, after = await migrate.upgrade(db.engine, db.dialect)
        if before != after:
            log.info("database migrated from %s to %s", before or "empty", after)
        return
    current = await migrate.current_revision(db.engine)
    if current != migrate.HEAD:
        raise ConfigError(
            "SCHEDULER_AUTO_MIGRATE",
            f"database schema is at {current or 'nothing'}, this version needs {migrate.HEAD}: "
            "run `slotcron migrate` (or set SCHEDULER_AUTO_MIGRATE=true)",
        )


def rehearsal(db: Database) -> Callable[[AsyncConnection], Awaitable[None]]:
    """What a warmed-up connection runs once: the hot path's statements, prepared."""

    async def rehearse(conn: AsyncConnection) -> None:
        await claim_store.rehearse(db, conn)
        await batch_store.rehearse(db, conn)
        await start_store.rehearse(db, conn)
        await markers.rehearse(db, conn)
        await run_store.rehearse(conn, db.dialect)

    return rehearse


async def warm_up(db: Database, settings: Settings, jobs: int) -> None:
    """Open connections ahead, each rehearsed. Behind a pooler every connection held is one of
    the pooler's few: one is opened ahead (the rest as a burst needs them, closed again once
    idle)."""
    ahead = 1 if settings.database_pooler != "none" else jobs
    await db.warm_up(min(settings.pool_size, max(ahead, 1)), rehearsal(db))


async def sync_clock(clock: Clock) -> None:
    """Measure the database clock's offset (a test's manual clock has none)."""
    if isinstance(clock, DatabaseClock):
        offset = await clock.sync()
        log.info(
            "clock offset to the database: %+.1f ms (round trip %.1f ms)",
            offset.total_seconds() * 1000,
            clock.round_trip.total_seconds() * 1000,
        )


async def register_instance(db: Database, instance_id: str, now: datetime) -> None:
    await registrations.register_instance(
        db,
        instance_id=instance_id,
        host=socket.gethostname(),
        pid=os.getpid(),
        version=__version__,
        now=now,
    )


async def register_jobs(
    db: Database,
    settings: Settings,
    *,
    jobs: Sequence[Job],
    tasks: Sequence[Job],
    schedules: Mapping[str, Schedule],
    supersession: Supersession,
    now: datetime,
) -> dict[str, datetime | None]:
    """Register the code jobs and tasks; each job's expected slot (where its planner starts)."""
    rows = [_row(job, schedules[job.name], settings, now) for job in jobs]
    taken = await schedule_store.schedule_ids_among(db, [row.name for row in rows])
    if taken:  # registering would overwrite a runtime schedule's row
        raise InvalidJobError(
            taken[0], "name", "is the id of a runtime schedule: rename the job or remove it"
        )
    instance_id = settings.instance_id
    registered = await registrations.register_jobs(
        db, rows, now=now, instance_id=instance_id, version=__version__
    )
    supersession.registered(registered.fingerprints)
    await schedule_store.register_tasks(
        db, tasks, now=now, instance_id=instance_id, version=__version__
    )
    return {row.name: _expected(row, registered) for row in rows}


def _row(job: Job, schedule: Schedule, settings: Settings, now: datetime) -> JobRow:
    return JobRow(
        name=job.name,
        kind=job.kind,
        schedule=schedule.describe(),
        timezone=job.timezone or settings.timezone,
        options=job.options(),
        first_slot=schedule.next_after(now),
        slots=schedule,
    )


def _expected(row: JobRow, registered: Registered) -> datetime | None:
    """A job's expected slot. A new job expects the slot computed when it was registered, so a
    second boundary passing before the planner starts is fired, not recorded MISSED. So does a
    job whose schedule this registration changed: nothing of the old schedule is owed."""
    prior = registered.stored.get(row.name)
    took_over = row.name in registered.took_over
    if took_over and prior is not None:
        # The newest registration wins: instances still running the old schedule are refused
        # their claims of this job from now on (slotcron.engine.supersession).
        log.warning(
            "schedule of %s changed: %s (%s) here takes over the cluster from %s (%s) "
            "registered by %s (version %s)",
            row.name,
            row.schedule,
            row.timezone,
            prior.schedule,
            prior.timezone,
            prior.updated_by,
            prior.version,
        )
    return prior.next_slot_at if prior and not took_over else row.first_slot
