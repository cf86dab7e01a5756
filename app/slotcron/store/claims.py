"""The claim: one short transaction that decides, once and for the whole cluster, a slot's fate.

    SELECT paused, last_slot_at, skip_at FROM scheduler_jobs WHERE name = :job FOR UPDATE NOWAIT
    last_slot_at >= :slot      -> rollback: SlotTaken
    skip_at = :slot            -> INSERT execution SKIPPED,  UPDATE last_slot_at, skip_at
    paused                     -> INSERT execution SKIPPED,  UPDATE last_slot_at
    forbid and a live lease    -> INSERT execution SKIPPED,  UPDATE last_slot_at
    otherwise                  -> INSERT execution RUNNING,  UPDATE last_slot_at
    COMMIT

The unique key (job_name, scheduled_at, attempt) is the last line of defence: an
IntegrityError is a lost race (SlotTaken), never a failure.

The rules themselves are :func:`judge`, shared by every path that decides a slot: this single
claim, the batch claim (:mod:`slotcron.store.batch`) and the taking of a queued run
(:mod:`slotcron.store.queue`).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import Enum
from typing import Any

from sqlalchemy import BigInteger, bindparam, insert, select, update
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from slotcron.errors import LeaseHeld, RowBusy, SlotsUndecided, SlotTaken, Superseded
from slotcron.status import Status
from slotcron.store import counted
from slotcron.store.database import Database, now_in_sql
from slotcron.store.dialects import Dialect
from slotcron.store.execution_rows import execution_row
from slotcron.store.skips import moved_on, skip_reason
from slotcron.store.tables import UTCDateTime, executions, jobs

# Built once: a claim is on the hot path, and SQLAlchemy then only looks up the cached SQL.
_LOCK_JOB = (
    select(
        jobs.c.paused,
        jobs.c.paused_reason,
        jobs.c.last_slot_at,
        jobs.c.next_slot_at,
        jobs.c.fencing_token,
        jobs.c.fingerprint,
        jobs.c.skip_at,
        jobs.c.skip_reason,
        jobs.c.runs_completed,
    )
    .where(jobs.c.name == bindparam("p_job"))
    .with_for_update(nowait=True)
)


def _lease_holder(db: Database) -> Any:
    return _lease_holder_sql(db.dialect, db.server_clock)


@functools.cache
def _lease_holder_sql(dialect: Dialect, server_clock: bool) -> Any:
    return (
        select(
            executions.c.id,
            executions.c.instance_id,
            executions.c.lease_until,
            executions.c.trigger,
        )
        .where(
            executions.c.job_name == bindparam("p_job"),
            executions.c.status == Status.RUNNING,
            executions.c.lease_until > now_in_sql(dialect, server_clock),
        )
        .limit(1)
    )


_INSERT = insert(executions)
_SLOT = bindparam("p_slot", type_=UTCDateTime())
_ADVANCE = (
    update(jobs)
    .where(jobs.c.name == bindparam("p_job"))
    .ordered_values(
        (jobs.c.last_slot_at, _SLOT),
        (jobs.c.next_slot_at, bindparam("p_next", type_=UTCDateTime())),
        (jobs.c.fencing_token, bindparam("p_token", type_=BigInteger())),
        *moved_on(_SLOT),
    )
)


class Fate(Enum):
    """What a claim decides for a slot (see :func:`judge`)."""

    TAKEN = "taken"
    """Already decided by someone else: the slot is closed."""
    SUPERSEDED = "superseded"
    """The claimer's schedule is not the one in force: a newer registration, or a runtime
    schedule's update, changed it."""
    UNDECIDED = "undecided"
    """Earlier slots of the job were never decided: they go to the misfire path first."""
    DEFERRED = "deferred"
    """Claimed ahead of its time while a run holds the job's lease (``forbid``): decided when
    its time comes, when the run may have ended."""
    RUN = "run"
    NOT_RUN = "not run"
    """Recorded ``MISSED`` (misfire) or ``SKIPPED`` (paused, or overlap under ``forbid``)."""


@dataclass(frozen=True)
class Verdict:
    fate: Fate
    status: Status | None = None
    reason: str | None = None


def judge(
    row: Any,
    *,
    slot: datetime,
    now: datetime,
    check_gap: bool,
    missed_reason: str | None,
    holder: Any,
    may_defer: bool,
    fingerprint: str | None = None,
    excluded: str | None = None,
) -> Verdict:
    """The claim rules, once for every path: ``row`` is the job's locked row (``paused``,
    ``paused_reason``, ``last_slot_at``, ``next_slot_at``, and ``fingerprint`` when the
    claimer presents one), ``holder`` the run holding the job's lease (``forbid`` jobs only;
    None if none). A claimer presenting another ``fingerprint`` than the row's fires a schedule
    no longer in force: refused, whatever the slot. For a code job that is a newer registration
    (issue 12, item 5); for a runtime schedule, a write committed since the claimer read it
    (:data:`slotcron.store.schedules.version_mark`): an update is in force for every claim after its
    commit, whether the claimer has heard of it yet or not."""
    if fingerprint is not None and row.fingerprint not in (None, fingerprint):
        return Verdict(Fate.SUPERSEDED)
    if row.last_slot_at is not None and row.last_slot_at >= slot:
        return Verdict(Fate.TAKEN)
    if check_gap and row.next_slot_at is not None and row.next_slot_at < slot:
        return Verdict(Fate.UNDECIDED)
    if row.skip_at is not None and row.skip_at == slot:  # an operator's `slotcron skip`
        return Verdict(Fate.NOT_RUN, Status.SKIPPED, skip_reason(row.skip_reason))
    if excluded is not None:  # the job's calendar or excluded dates (slotcron.jobs.calendars)
        return Verdict(Fate.NOT_RUN, Status.SKIPPED, excluded)
    if missed_reason is not None:
        return Verdict(Fate.NOT_RUN, Status.MISSED, missed_reason)
    # Claimed ahead of its time, a paused job's slot is not decided yet: a resume may commit
    # before the slot comes. It is claimed like any other, and its start at the slot
    # (slotcron.store.starts) records it SKIPPED if the job is paused then.
    if row.paused and not (may_defer and slot > now):
        reason = "job is paused" + (f": {row.paused_reason}" if row.paused_reason else "")
        return Verdict(Fate.NOT_RUN, Status.SKIPPED, reason)
    if holder is not None and may_defer and slot > now:
        return Verdict(Fate.DEFERRED)
    if holder is not None:
        return Verdict(Fate.NOT_RUN, Status.SKIPPED, overlap_reason(holder))
    return Verdict(Fate.RUN, Status.RUNNING)


def overlap_reason(holder: Any) -> str:
    return (
        f"overlap: execution {holder.id} is still running "
        f"on {holder.instance_id} (overlap='forbid')"
    )


async def lock_job(conn: AsyncConnection, job_name: str) -> Any:
    """Lock the job's row, NOWAIT (the claim's order against every other claimer of the job);
    None if the job is not registered."""
    return (await conn.execute(_LOCK_JOB, {"p_job": job_name})).one_or_none()


async def lease_holder(db: Database, conn: AsyncConnection, job_name: str, now: datetime) -> Any:
    """A run of the job that still holds its lease (by the database's clock, or ``now`` where
    the scheduler's clock is a test's), or None."""
    query = _lease_holder(db)
    return (await conn.execute(query, {"p_job": job_name, "p_now": now})).one_or_none()


RunKey = tuple[int, str, datetime, int]
"""A run's row: ``(execution id, job, slot, attempt)``."""


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
    fencing_token: int | None = None
    """The run's token (``ctx.fencing_token``): the job's counter, taken as the run started."""
    sent: float = 0.0
    """When the claim's transaction began, by this process's monotonic clock: the run's lease
    is trusted from then, not from when the answer came back."""
    started: bool = True
    """Whether the claim itself stamped ``started_at`` (a run claimed at its time, its body
    starting at once). False for a run claimed ahead of its slot, taken from the queue, or
    delayed by jitter: its start is stamped just before its body (:mod:`slotcron.store.starts`),
    and until then it can be handed back."""

    @property
    def key(self) -> RunKey:
        """What identifies this run's row for every write after the claim (never its id alone:
        after a failover that lost commits the id sequence may have handed the id to another
        run)."""
        return (self.execution_id, self.job_name, self.scheduled_at, self.attempt)


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
    excluded: str | None = None,
    max_runs: int | None = None,
    check_gap: bool = True,
    fingerprint: str | None = None,
    started: bool = True,
    wait_for_lease: str | None = None,
) -> Claim:
    """Claim ``slot`` of ``job_name``, making ``following`` the job's expected slot; ``started``:
    the claim stamps ``started_at`` (else :func:`slotcron.store.starts.start_runs` does). Raises
    :class:`SlotTaken` (closed), :class:`RowBusy` (row held) and what :func:`_verdict` raises."""
    with _closed_or_busy(db, job_name, slot):
        async with db.transaction(nowait=True) as conn:
            locked = await _lock_open(conn, job_name, slot)
            verdict = await _verdict(
                db,
                conn,
                locked,
                job_name=job_name,
                slot=slot,
                now=now,
                check_gap=check_gap,
                missed_reason=missed_reason,
                excluded=excluded,
                max_runs=max_runs,
                fingerprint=fingerprint,
                forbid_overlap=forbid_overlap,
                wait_for_lease=wait_for_lease,
            )
            assert verdict.status is not None
            token = int(locked.fencing_token) + (1 if verdict.status == Status.RUNNING else 0)
            row = execution_row(
                job_name=job_name,
                slot=slot,
                trigger=trigger,
                status=verdict.status,
                instance_id=instance_id,
                now=now,
                lease_ms=lease_ms,
                reason=verdict.reason,
                fencing_token=token if verdict.status == Status.RUNNING else None,
                started=started,
            )
            result = await conn.execute(_INSERT, row)
            await conn.execute(
                _ADVANCE, {"p_job": job_name, "p_slot": slot, "p_next": following, "p_token": token}
            )
    return _claim(int(result.inserted_primary_key[0]), row)  # type: ignore[index]


async def _lock_open(conn: AsyncConnection, job_name: str, slot: datetime) -> Any:
    """The job's row, locked; :class:`SlotTaken` when there is none (a runtime schedule
    removed: none of its slots is open)."""
    locked = await lock_job(conn, job_name)
    if locked is None:
        raise SlotTaken(f"{job_name} @ {slot.isoformat()}: no such job or schedule")
    return locked


@contextlib.contextmanager
def _closed_or_busy(db: Database, job_name: str, slot: datetime) -> Iterator[None]:
    """A claim's failures as what they mean: a unique key hit is the slot closed
    (:class:`SlotTaken`), a row lock refused is the row busy (:class:`RowBusy`)."""
    try:
        yield
    except IntegrityError:
        raise SlotTaken(f"{job_name} @ {slot.isoformat()}") from None
    except DBAPIError as exc:
        if db.dialect.is_lock_unavailable(exc):
            raise RowBusy(job_name) from None
        raise


def _claim(execution_id: int, row: dict[str, Any]) -> Claim:
    """The claim of the execution row :func:`claim_slot` inserted."""
    return Claim(
        execution_id=execution_id,
        job_name=row["job_name"],
        scheduled_at=row["scheduled_at"],
        trigger=row["trigger"],
        status=row["status"],
        attempt=1,
        lease_until=row["lease_until"],
        lease_ms=row["lease_ms"],
        reason=row["error"],
        fencing_token=row["fencing_token"],
        started=row["started_at"] is not None,
    )


async def _verdict(
    db: Database,
    conn: AsyncConnection,
    row: Any,
    *,
    job_name: str,
    slot: datetime,
    now: datetime,
    check_gap: bool,
    missed_reason: str | None,
    excluded: str | None,
    max_runs: int | None,
    fingerprint: str | None,
    forbid_overlap: bool,
    wait_for_lease: str | None,
) -> Verdict:
    """The verdict on ``slot`` of the locked job ``row`` (see :func:`claim_slot`): whether it
    runs, or why not. Raises :class:`SlotTaken` when the slot is closed, (with ``check_gap``)
    :class:`SlotsUndecided` when slots before it were never decided, :class:`Superseded` when
    ``fingerprint`` is not the schedule in force, and, with ``wait_for_lease`` (``"any"``, or
    ``"catchup"``: only a catch-up run's), :class:`LeaseHeld` when such a run holds a ``forbid``
    job's lease (nothing written) instead of recording the slot ``SKIPPED``."""
    rules = functools.partial(
        judge,
        row,
        slot=slot,
        now=now,
        check_gap=check_gap,
        missed_reason=missed_reason,
        may_defer=False,
        fingerprint=fingerprint,
        excluded=excluded,
    )
    counted.exhausted(row, job_name, max_runs)
    verdict = rules(holder=None)
    if verdict.fate is Fate.RUN and max_runs is not None:  # its runs in flight: read here only
        full = await counted.room_for_one(conn, row, job_name, max_runs)
        verdict = verdict if full is None else Verdict(Fate.NOT_RUN, Status.SKIPPED, full)
    if verdict.fate is Fate.RUN and forbid_overlap:  # only then is the lease read
        holder = await lease_holder(db, conn, job_name, now)
        if holder is not None and wait_for_lease in ("any", holder.trigger):
            raise LeaseHeld(job_name, holder.lease_until)
        verdict = rules(holder=holder)
    if verdict.fate is Fate.SUPERSEDED:
        raise Superseded(job_name)
    if verdict.fate is Fate.TAKEN:
        raise SlotTaken(f"{job_name} @ {slot.isoformat()}")
    if verdict.fate is Fate.UNDECIDED:
        raise SlotsUndecided(job_name, row.next_slot_at)
    return verdict


async def rehearse(db: Database, conn: AsyncConnection) -> None:
    """Run the single claim's statements once, deciding nothing (no job matches): called on each
    pooled connection at start-up, in a transaction that is rolled back."""
    epoch = datetime(2000, 1, 1, tzinfo=UTC)
    await conn.execute(_LOCK_JOB, {"p_job": ""})
    await conn.execute(_lease_holder(db), {"p_job": "", "p_now": epoch})
    await conn.execute(_ADVANCE, {"p_job": "", "p_slot": epoch, "p_next": epoch, "p_token": 0})
