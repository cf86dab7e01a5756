"""Runs whose instance died (their lease lapsed unrenewed): recorded ABANDONED, maybe retried,
or, when their body never started, handed back to the queue for another instance to run. The
instance id itself, held by one live process at a time: :mod:`slotcron.store.instance_ids`."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, insert, select, update

from slotcron.store import markers
from slotcron.store.database import Database
from slotcron.store.dialects import Dialect
from slotcron.store.tables import executions, guard, jobs

log = logging.getLogger("slotcron.service")

QUEUED_CHANNEL = "slotcron_queued"
BACKFILL_CREATED = "backfill"
"""The payload on :data:`QUEUED_CHANNEL` that says a backfill was created."""


async def announce_queued(conn: Any, dialect: Dialect, available_at: datetime) -> None:
    """Wake listening instances when this transaction commits: a QUEUED execution becomes
    available at ``available_at``."""
    await dialect.notify(conn, QUEUED_CHANNEL, available_at.isoformat())


@dataclass(frozen=True)
class Abandoned:
    execution_id: int
    job_name: str
    scheduled_at: datetime
    instance_id: str | None
    lease_until: datetime
    retry_id: int | None
    alert: bool = True  # the job's stored `alert` option (the leader may not have the job)
    handed_back: bool = False
    """Its body never started: not ABANDONED but QUEUED again, same slot and attempt."""
    attempt: int | None = None
    trigger: str | None = None
    started_at: datetime | None = None
    """When its body started, as recorded (a chunk's marker's time for a run claimed ahead)."""
    error: str | None = None
    """The reason recorded with it (why its lease lapsed)."""
    params: dict[str, Any] = field(default_factory=dict)


async def queue_retry(
    conn: Any,
    *,
    row: Any,
    now: datetime,
    backoff: float,
    dialect: Dialect,
    reason_trigger: str = "retry",
) -> int | None:
    """Insert the next attempt of ``row``'s slot as QUEUED, carrying its params and state."""
    await announce_queued(conn, dialect, now + timedelta(seconds=backoff))
    result = await conn.execute(
        insert(executions).values(
            job_name=row.job_name,
            scheduled_at=row.scheduled_at,
            trigger=reason_trigger,
            status="QUEUED",
            attempt=row.attempt + 1,
            created_at=now,
            available_at=now + timedelta(seconds=backoff),
            params=row.params or {},
            state=row.state or {},
        )
    )
    return int(result.inserted_primary_key[0])


async def abandon_lapsed(db: Database, *, now: datetime, limit: int = 200) -> list[Abandoned]:
    """Mark RUNNING executions whose lease lapsed before ``now`` ABANDONED; queue a retry for
    each whose job allows another attempt (``max_attempts`` in the job's stored options). Those
    whose body never started (no ``started_at``) are handed back instead (:func:`hand_back`)."""
    return await _abandon(
        db,
        now=now,
        limit=limit,
        which=executions.c.lease_until < db.now_in_sql(),
        why=lambda row: (
            f"instance {row.instance_id} stopped renewing the lease, which lapsed at "
            f"{row.lease_until.isoformat()}"
        ),
    )


async def abandon_orphans(db: Database, *, instance_id: str, now: datetime) -> list[Abandoned]:
    """At start-up: RUNNING executions already tagged with this instance id belong to a
    previous process under the same id (a fixed pod name), which died with them. A new process
    runs nothing yet, so they are ABANDONED now, rather than kept alive by our heartbeat."""
    return await _abandon(
        db,
        now=now,
        limit=10_000,
        which=executions.c.instance_id == instance_id,
        why=lambda row: (
            f"instance {row.instance_id} restarted; the run did not survive its previous process"
        ),
    )


async def _abandon(
    db: Database, *, now: datetime, limit: int, which: Any, why: Any
) -> list[Abandoned]:
    lapsed = await _lapsed_runs(db, now=now, limit=limit, which=which)
    found: list[Abandoned] = []
    # A run claimed ahead in a chunk started when its chunk's marker did: settle each chunk
    # first (a tombstone where none started: its instance then starts none of it).
    chunks = await markers.settle(
        db, {row.start_key for row in lapsed if row.started_at is None and row.start_key}, now=now
    )
    started = {
        row.id: row.started_at or (chunks.get(row.start_key) if row.start_key else None)
        for row in lapsed
    }
    unstarted = [row for row in lapsed if started[row.id] is None]
    if unstarted:
        back = await hand_back(db, [row.id for row in unstarted], which=which, now=now)
        found += [
            Abandoned(
                row.id, row.job_name, row.scheduled_at, row.instance_id, row.lease_until, None,
                handed_back=True,
            )
            for row in unstarted
            if row.id in back
        ]  # fmt: skip
    for row in lapsed:
        if (when := started[row.id]) is not None:
            abandoned = await _record_abandoned(db, row, when, now=now, why=why)
            if abandoned is not None:
                found.append(abandoned)
    return found


async def _lapsed_runs(db: Database, *, now: datetime, limit: int, which: Any) -> list[Any]:
    """The RUNNING rows ``which`` selects (bound to ``p_now``), earliest lease first."""
    async with db.read() as conn:
        return list(
            (
                await conn.execute(
                    select(
                        executions.c.id,
                        executions.c.job_name,
                        executions.c.scheduled_at,
                        executions.c.attempt,
                        executions.c.trigger,
                        executions.c.instance_id,
                        executions.c.lease_until,
                        executions.c.started_at,
                        executions.c.start_key,
                        executions.c.params,
                        executions.c.state,
                    )
                    .where(executions.c.status == "RUNNING", which)
                    .order_by(executions.c.lease_until)
                    .limit(limit),
                    {"p_now": now},
                )
            ).all()
        )


async def _record_abandoned(
    db: Database, row: Any, started: datetime, *, now: datetime, why: Any
) -> Abandoned | None:
    """Record the started run ``row`` ABANDONED (and queue its retry if it has attempts left);
    None when it was renewed or settled meanwhile."""
    error = why(row)
    async with db.transaction() as conn:
        result = await conn.execute(
            update(executions)
            .where(
                executions.c.id == row.id,
                executions.c.status == "RUNNING",
                executions.c.lease_until == row.lease_until,  # renewed meanwhile: alive
                executions.c.started_at.is_not(None)
                if row.started_at is not None
                else executions.c.start_key == row.start_key,
            )
            .values(status="ABANDONED", finished_at=now, error=error, started_at=started)
        )
        if result.rowcount != 1:
            return None
        options = (
            await conn.execute(select(jobs.c.options).where(jobs.c.name == row.job_name))
        ).scalar_one_or_none() or {}
        retry_id = None
        alert = bool(options.get("alert", True))
        if row.attempt < int(options.get("max_attempts", 1)):
            retry_id = await queue_retry(
                conn,
                row=row,
                now=now,
                backoff=float(options.get("retry_backoff", 10)),
                dialect=db.dialect,
            )
    return Abandoned(
        row.id,
        row.job_name,
        row.scheduled_at,
        row.instance_id,
        row.lease_until,
        retry_id,
        alert,
        attempt=row.attempt,
        trigger=row.trigger,
        started_at=started,
        error=error,
        params=dict(row.params or {}),
    )


async def hand_back(
    db: Database, execution_ids: list[int], *, which: Any, now: datetime, marked_too: bool = False
) -> set[int]:
    """Hand runs whose body never started back to the queue, at once: each becomes QUEUED
    again (same slot, trigger and attempt: nothing ran), available now to any live instance,
    which takes it like any queued run (:mod:`slotcron.store.queue`) and stamps its start
    (:mod:`slotcron.store.starts`). Only rows still RUNNING with no ``started_at`` that match
    ``which`` are handed back; return their ids. A start and a hand-back of one row exclude
    each other: each is conditional on what the other writes.

    A run of a chunk whose start marker says it started is not handed back, unless
    ``marked_too``: its own instance knows its body did not start (cancelled in between)."""
    if not execution_ids:
        return set()
    unstarted = (
        executions.c.id.in_(execution_ids),
        guard(executions.c.status) == "RUNNING",
        executions.c.started_at.is_(None),
        which,
    ) + (() if marked_too else (markers.started_at().is_(None),))
    async with db.transaction() as conn:
        ids = list(
            (
                await conn.execute(
                    select(executions.c.id).where(*unstarted).with_for_update(),
                    {"p_now": now},
                )
            ).scalars()
        )
        if not ids:
            return set()
        await conn.execute(
            update(executions)
            .where(executions.c.id.in_(ids))
            .values(
                status="QUEUED",
                instance_id=None,
                available_at=now,
                heartbeat_at=None,
                lease_until=None,
                lease_ms=None,
                fencing_token=None,
                start_key=None,  # no marker speaks for it any more
            )
        )
        await announce_queued(conn, db.dialect, now)
    return {int(i) for i in ids}


async def hand_back_mine(
    db: Database,
    execution_ids: list[int],
    *,
    instance_id: str,
    now: datetime,
    marked_too: bool = False,
) -> set[int]:
    """Hand back this instance's runs that have not started their body (shutdown, or a run
    fenced before its start): see :func:`hand_back`."""
    return await hand_back(
        db,
        execution_ids,
        which=executions.c.instance_id == instance_id,
        now=now,
        marked_too=marked_too,
    )


async def next_unstarted_lapse(db: Database) -> datetime | None:
    """When the earliest lease of a run not yet started lapses (None if there is none): such a
    run is handed back then, if its instance has not started or renewed it."""
    async with db.read() as conn:
        lapse: datetime | None = (
            await conn.execute(
                select(func.min(executions.c.lease_until)).where(
                    executions.c.status == "RUNNING", markers.started_at().is_(None)
                )
            )
        ).scalar_one_or_none()
    return lapse
