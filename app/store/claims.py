"""The claim: one short transaction that decides, once and for the whole cluster, a slot's fate.

    SELECT paused, last_slot_at FROM scheduler_jobs WHERE name = :job FOR UPDATE NOWAIT
    last_slot_at >= :slot      -> rollback: SlotTaken
    paused                     -> INSERT execution SKIPPED,  UPDATE last_slot_at
    forbid and a live lease    -> INSERT execution SKIPPED,  UPDATE last_slot_at
    otherwise                  -> INSERT execution RUNNING,  UPDATE last_slot_at
    COMMIT

The unique key (job_name, scheduled_at, attempt) is the last line of defence: an
IntegrityError is a lost race (SlotTaken), never a failure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import bindparam, insert, select, update
from sqlalchemy.exc import DBAPIError, IntegrityError

from app.errors import RowBusy, SlotsUndecided, SlotTaken
from app.store.database import Database
from app.store.tables import UTCDateTime, executions, jobs

# Built once: a claim is on the hot path, and SQLAlchemy then only looks up the cached SQL.
_LOCK_JOB = (
    select(jobs.c.paused, jobs.c.paused_reason, jobs.c.last_slot_at, jobs.c.next_slot_at)
    .where(jobs.c.name == bindparam("p_job"))
    .with_for_update(nowait=True)
)
_LEASE_HOLDER = (
    select(executions.c.id, executions.c.instance_id)
    .where(
        executions.c.job_name == bindparam("p_job"),
        executions.c.status == "RUNNING",
        executions.c.lease_until > bindparam("p_now", type_=UTCDateTime()),
    )
    .limit(1)
)
_INSERT = insert(executions)
_ADVANCE = (
    update(jobs)
    .where(jobs.c.name == bindparam("p_job"))
    .values(
        last_slot_at=bindparam("p_slot", type_=UTCDateTime()),
        next_slot_at=bindparam("p_next", type_=UTCDateTime()),
    )
)


@dataclass(frozen=True)
class Claim:
    """The outcome of a claim: a run to start (``RUNNING``), or a slot recorded as not run."""

    execution_id: int
    job_name: str
    scheduled_at: datetime
    trigger: str
    status: str
    attempt: int
    lease_until: datetime | None
    lease_ms: int | None
    reason: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)


async def claim_slot(
    db: Database,
    *,
    job_name: str,
    slot: datetime,
    trigger: str,
    instance_id: str,
    now: datetime,
    lease_ms: int,
    forbid_overlap: bool,
    following: datetime,
    missed_reason: str | None = None,
    check_gap: bool = True,
) -> Claim:
    """Claim ``slot`` of ``job_name``, or record why it does not run.

    ``following`` is the job's next slot after ``slot``; it becomes the job's expected slot.
    With ``missed_reason`` the slot is recorded ``MISSED`` instead of run. Raises
    :class:`SlotTaken` when the slot is already closed (someone claimed it),
    :class:`RowBusy` when another claimer holds the job's row right now, and (with
    ``check_gap``) :class:`SlotsUndecided` when slots before this one were never decided.
    """
    try:
        async with db.transaction(nowait=True) as conn:
            row = (await conn.execute(_LOCK_JOB, {"p_job": job_name})).one_or_none()
            if row is None:
                raise LookupError(f"job {job_name!r} is not registered in the database")
            if row.last_slot_at is not None and row.last_slot_at >= slot:
                raise SlotTaken(f"{job_name} @ {slot.isoformat()}")
            if check_gap and row.next_slot_at is not None and row.next_slot_at < slot:
                raise SlotsUndecided(job_name, row.next_slot_at)
            status, reason = "RUNNING", None
            if missed_reason is not None:
                status, reason = "MISSED", missed_reason
            elif row.paused:
                status = "SKIPPED"
                reason = "job is paused" + (f": {row.paused_reason}" if row.paused_reason else "")
            elif forbid_overlap:
                holder = (
                    await conn.execute(_LEASE_HOLDER, {"p_job": job_name, "p_now": now})
                ).one_or_none()
                if holder is not None:
                    status = "SKIPPED"
                    reason = (
                        f"overlap: execution {holder.id} is still running "
                        f"on {holder.instance_id} (overlap='forbid')"
                    )
            running = status == "RUNNING"
            lease_until = now + timedelta(milliseconds=lease_ms) if running else None
            result = await conn.execute(
                _INSERT,
                dict(
                    job_name=job_name,
                    scheduled_at=slot,
                    trigger=trigger,
                    status=status,
                    attempt=1,
                    instance_id=instance_id,
                    created_at=now,
                    started_at=now if running else None,
                    heartbeat_at=now if running else None,
                    lease_until=lease_until,
                    lease_ms=lease_ms if running else None,
                    finished_at=None if running else now,
                    error=reason,
                    params={},
                    state={},
                ),
            )
            await conn.execute(_ADVANCE, {"p_job": job_name, "p_slot": slot, "p_next": following})
    except IntegrityError:
        raise SlotTaken(f"{job_name} @ {slot.isoformat()}") from None
    except DBAPIError as exc:
        if db.dialect.is_lock_unavailable(exc):
            raise RowBusy(job_name) from None
        raise
    return Claim(
        execution_id=int(result.inserted_primary_key[0]),  # type: ignore[index]
        job_name=job_name,
        scheduled_at=slot,
        trigger=trigger,
        status=status,
        attempt=1,
        lease_until=lease_until,
        lease_ms=lease_ms if running else None,
        reason=reason,
    )
