"""The claim: one short transaction that decides, once and for the whole cluster, a slot's fate.

    SELECT paused, last_slot_at FROM scheduler_jobs WHERE name = :job FOR UPDATE NOWAIT
    last_slot_at >= :slot      -> rollback: SlotTaken
    paused                     -> INSERT execution SKIPPED,  UPDATE last_slot_at
    forbid and a live lease    -> INSERT execution SKIPPED,  UPDATE last_slot_at
    otherwise                  -> INSERT execution RUNNING,  UPDATE last_slot_at
    COMMIT

The unique key (job_name, scheduled_at, attempt) is the last line of defence: an
IntegrityError is a lost race (SlotTaken), never a failure.

:func:`claim_many` decides many jobs' slots in one transaction of constant round trips: the
same rules, but rows another claimer holds are skipped (``SKIP LOCKED``) and handed back, to
be retried, never dropped.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import Any

from sqlalchemy import JSON, Integer, String, bindparam, insert, literal, select, update
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from app.errors import RowBusy, SlotsUndecided, SlotTaken
from app.status import Status
from app.store.database import Database
from app.store.dialects import Dialect
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
        executions.c.status == Status.RUNNING,
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
class _Batch:
    """The statements of :func:`claim_many`, built once per dialect. Each takes the batch's
    job names as one list parameter, ``p_names``."""

    lock: Any
    high_water: Any
    holders: Any
    insert_runs: Any
    insert_rows: Any
    advance: Any


@functools.cache
def _batch(dialect: Dialect) -> _Batch:
    names = dialect.among(jobs.c.name, "p_names", String())
    now = bindparam("p_now", type_=UTCDateTime())
    # A run's row is built by the database from each job name: one statement, whatever the
    # number of runs, and no per-row parameters to bind.
    runs = select(
        jobs.c.name,
        bindparam("p_slot", type_=UTCDateTime()),
        bindparam("p_trigger", type_=String()),
        literal(Status.RUNNING.value, String()),
        literal(1, Integer()),
        bindparam("p_instance", type_=String()),
        now,
        bindparam("p_started", type_=UTCDateTime()),
        now,
        bindparam("p_lease_until", type_=UTCDateTime()),
        bindparam("p_lease_ms", type_=Integer()),
        bindparam("p_params", type_=JSON()),
        bindparam("p_state", type_=JSON()),
    ).where(names)
    columns = [
        "job_name", "scheduled_at", "trigger", "status", "attempt", "instance_id", "created_at",
        "started_at", "heartbeat_at", "lease_until", "lease_ms", "params", "state",
    ]  # fmt: skip
    return _Batch(
        lock=select(
            jobs.c.name,
            jobs.c.paused,
            jobs.c.paused_reason,
            jobs.c.last_slot_at,
            jobs.c.next_slot_at,
        )
        .where(names)
        .with_for_update(skip_locked=True),
        high_water=select(jobs.c.name, jobs.c.last_slot_at).where(names),
        holders=select(executions.c.job_name, executions.c.id, executions.c.instance_id).where(
            dialect.among(executions.c.job_name, "p_names", String()),
            executions.c.status == Status.RUNNING,
            executions.c.lease_until > now,
        ),
        insert_runs=insert(executions)
        .from_select(columns, runs)
        .returning(executions.c.id, executions.c.job_name),
        insert_rows=insert(executions).returning(executions.c.id, sort_by_parameter_order=True),
        advance=update(jobs)
        .where(names)
        .values(
            last_slot_at=bindparam("p_slot", type_=UTCDateTime()),
            next_slot_at=bindparam("p_next", type_=UTCDateTime()),
        ),
    )


class Fate(Enum):
    """What a claim decides for a slot (see :func:`judge`)."""

    TAKEN = "taken"
    """Already decided by someone else: the slot is closed."""
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
) -> Verdict:
    """The claim rules, once for every path: ``row`` is the job's locked row (``paused``,
    ``paused_reason``, ``last_slot_at``, ``next_slot_at``), ``holder`` the run holding the
    job's lease (``forbid`` jobs only; None if none)."""
    if row.last_slot_at is not None and row.last_slot_at >= slot:
        return Verdict(Fate.TAKEN)
    if check_gap and row.next_slot_at is not None and row.next_slot_at < slot:
        return Verdict(Fate.UNDECIDED)
    if missed_reason is not None:
        return Verdict(Fate.NOT_RUN, Status.MISSED, missed_reason)
    if row.paused:
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


async def lease_holder(conn: AsyncConnection, job_name: str, now: datetime) -> Any:
    """A run of the job that still holds its lease at ``now``, or None."""
    return (await conn.execute(_LEASE_HOLDER, {"p_job": job_name, "p_now": now})).one_or_none()


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
            row = await lock_job(conn, job_name)
            if row is None:
                raise LookupError(f"job {job_name!r} is not registered in the database")
            rules = functools.partial(
                judge,
                row,
                slot=slot,
                now=now,
                check_gap=check_gap,
                missed_reason=missed_reason,
                may_defer=False,
            )
            verdict = rules(holder=None)
            if verdict.fate is Fate.RUN and forbid_overlap:  # only then is the lease read
                verdict = rules(holder=await lease_holder(conn, job_name, now))
            if verdict.fate is Fate.TAKEN:
                raise SlotTaken(f"{job_name} @ {slot.isoformat()}")
            if verdict.fate is Fate.UNDECIDED:
                raise SlotsUndecided(job_name, row.next_slot_at)
            assert verdict.status is not None
            status, reason = verdict.status, verdict.reason
            running = status == Status.RUNNING
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


@dataclass(frozen=True)
class Due:
    """One job's slot to decide in a :func:`claim_many` batch."""

    job_name: str
    slot: datetime
    following: datetime
    trigger: str
    lease_ms: int
    forbid_overlap: bool
    missed_reason: str | None = None
    """Record the slot ``MISSED`` with this reason instead of running it (misfire)."""
    check_gap: bool = True
    """False when deciding late slots in order: earlier ones were passed over on purpose."""


@dataclass
class Decided:
    """What one :func:`claim_many` transaction decided, job by job."""

    claims: dict[str, Claim] = field(default_factory=dict)
    taken: set[str] = field(default_factory=set)
    """Already decided by someone else: the slot is closed."""
    held: list[Due] = field(default_factory=list)
    """Rows another claimer held at that moment: not decided, to be tried again."""
    deferred: list[Due] = field(default_factory=list)
    """Claimed ahead of their time while a run still held the job's lease (``forbid``): not
    decided, to be claimed when their time comes (the run may have ended by then)."""
    undecided: list[Due] = field(default_factory=list)
    """Slots before this one were never decided: for the misfire path first."""
    expected: dict[str, datetime] = field(default_factory=dict)
    """Of each ``undecided`` job, the first slot never decided."""


async def claim_many(db: Database, items: list[Due], *, instance_id: str, now: datetime) -> Decided:
    """Decide every item's slot by the rules of :func:`claim_slot`, in one transaction.

    Round trips do not grow with the batch: lock the rows (skipping held ones), read the live
    leases of ``forbid`` jobs, insert the runs (one statement per slot and lease length), the
    slots not run, and advance the jobs. Raises :class:`RowBusy` only where the whole database
    is one lock (SQLite).

    A slot may be claimed ahead of its time (``now`` before it): its run is recorded as starting
    at the slot, and a ``forbid`` job whose lease is still held is deferred rather than
    ``SKIPPED``, since overlap is judged when the slot comes."""
    decided = Decided()
    by_name = {item.job_name: item for item in items}
    sql = _batch(db.dialect)
    try:
        async with db.transaction(nowait=True) as conn:
            locked = {
                row.name: row for row in await conn.execute(sql.lock, {"p_names": list(by_name)})
            }
            if len(locked) < len(by_name):
                unlocked = [name for name in by_name if name not in locked]
                known = {
                    row.name for row in await conn.execute(sql.high_water, {"p_names": unlocked})
                }
                missing = set(unlocked) - known
                if missing:
                    raise LookupError(f"jobs not registered in the database: {sorted(missing)}")
                decided.held = [by_name[name] for name in unlocked]
            forbid = [n for n, r in locked.items() if by_name[n].forbid_overlap and not r.paused]
            holders: dict[str, Any] = {}
            if forbid:
                for h in await conn.execute(sql.holders, {"p_names": forbid, "p_now": now}):
                    holders.setdefault(h.job_name, h)
            runs: dict[tuple[datetime, str, int], list[str]] = {}
            not_run: list[tuple[Due, str, str]] = []
            advance: dict[tuple[datetime, datetime], list[str]] = {}
            for name, row in locked.items():
                item = by_name[name]
                verdict = judge(
                    row,
                    slot=item.slot,
                    now=now,
                    check_gap=item.check_gap,
                    missed_reason=item.missed_reason,
                    holder=holders.get(name),
                    may_defer=True,
                )
                if verdict.fate is Fate.TAKEN:
                    decided.taken.add(name)
                    continue
                if verdict.fate is Fate.UNDECIDED:
                    decided.undecided.append(item)
                    decided.expected[name] = row.next_slot_at
                    continue
                if verdict.fate is Fate.DEFERRED:
                    decided.deferred.append(item)
                    continue
                if verdict.fate is Fate.NOT_RUN:
                    assert verdict.status is not None and verdict.reason is not None
                    not_run.append((item, verdict.status, verdict.reason))
                else:
                    runs.setdefault((item.slot, item.trigger, item.lease_ms), []).append(name)
                advance.setdefault((item.slot, item.following), []).append(name)
            ids: dict[str, int] = {}
            for (slot, trigger, lease_ms), names in runs.items():
                inserted = await conn.execute(
                    sql.insert_runs,
                    {
                        "p_names": names,
                        "p_slot": slot,
                        "p_trigger": trigger,
                        "p_instance": instance_id,
                        "p_now": now,
                        "p_started": max(now, slot),
                        "p_lease_until": now + timedelta(milliseconds=lease_ms),
                        "p_lease_ms": lease_ms,
                        "p_params": {},
                        "p_state": {},
                    },
                )
                ids.update((row.job_name, int(row.id)) for row in inserted)
            if not_run:
                inserted_ids = await conn.execute(
                    sql.insert_rows,
                    [
                        _not_run_row(i, status, reason, instance_id, now)
                        for i, status, reason in not_run
                    ],
                )
                for (item, _, _), execution_id in zip(not_run, inserted_ids.scalars(), strict=True):
                    ids[item.job_name] = int(execution_id)
            for (slot, following), names in advance.items():
                await conn.execute(
                    sql.advance, {"p_names": names, "p_slot": slot, "p_next": following}
                )
    except IntegrityError:
        # Only a claimer that skipped our locks could collide: let each job retry on its own.
        return Decided(held=list(items))
    except DBAPIError as exc:
        if db.dialect.is_lock_unavailable(exc):
            raise RowBusy(f"{len(items)} jobs") from None
        raise
    for names in runs.values():
        for name in names:
            item = by_name[name]
            decided.claims[name] = Claim(
                execution_id=ids[name],
                job_name=name,
                scheduled_at=item.slot,
                trigger=item.trigger,
                status=Status.RUNNING,
                attempt=1,
                lease_until=now + timedelta(milliseconds=item.lease_ms),
                lease_ms=item.lease_ms,
            )
    for item, status, reason in not_run:
        decided.claims[item.job_name] = Claim(
            execution_id=ids[item.job_name],
            job_name=item.job_name,
            scheduled_at=item.slot,
            trigger=item.trigger,
            status=status,
            attempt=1,
            lease_until=None,
            lease_ms=None,
            reason=reason,
        )
    return decided


async def still_open(db: Database, items: list[Due]) -> list[Due]:
    """The items whose slot is not closed yet, by a plain read that waits for no lock."""
    if not items:
        return []
    async with db.read() as conn:
        rows = await conn.execute(
            _batch(db.dialect).high_water, {"p_names": [i.job_name for i in items]}
        )
        high: dict[str, datetime | None] = {row.name: row.last_slot_at for row in rows}
    return [i for i in items if (h := high.get(i.job_name)) is None or h < i.slot]


def _not_run_row(
    item: Due, status: str, reason: str, instance_id: str, now: datetime
) -> dict[str, Any]:
    return {
        "job_name": item.job_name,
        "scheduled_at": item.slot,
        "trigger": item.trigger,
        "status": status,
        "attempt": 1,
        "instance_id": instance_id,
        "created_at": now,
        "finished_at": now,
        "error": reason,
        "params": {},
        "state": {},
    }


async def rehearse(conn: AsyncConnection, dialect: Dialect) -> None:
    """Run every claim statement once, deciding nothing (no job matches): called on each pooled
    connection at start-up, in a transaction that is rolled back."""
    sql = _batch(dialect)
    nobody: dict[str, Any] = {"p_names": []}
    epoch = datetime(2000, 1, 1, tzinfo=UTC)
    await conn.execute(_LOCK_JOB, {"p_job": ""})
    await conn.execute(_LEASE_HOLDER, {"p_job": "", "p_now": epoch})
    await conn.execute(sql.lock, nobody)
    await conn.execute(sql.high_water, nobody)
    await conn.execute(sql.holders, {**nobody, "p_now": epoch})
    await conn.execute(
        sql.insert_runs,
        {
            **nobody,
            "p_slot": epoch,
            "p_trigger": "cron",
            "p_instance": "",
            "p_now": epoch,
            "p_started": epoch,
            "p_lease_until": epoch,
            "p_lease_ms": 0,
            "p_params": {},
            "p_state": {},
        },
    )
    await conn.execute(_ADVANCE, {"p_job": "", "p_slot": epoch, "p_next": epoch})
    await conn.execute(sql.advance, {**nobody, "p_slot": epoch, "p_next": epoch})
