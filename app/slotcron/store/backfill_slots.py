"""Which slots of a backfill run: the rule, and the step that queues them.

A slot of the range runs when none of its attempts ``COMPLETED`` (guarantee 1), once it is decided
and not in flight. The step considers slots oldest first and stops (the cursor stays) at a slot

- after the job's high-water mark ``last_slot_at``: the live schedule decides it when it comes (a
  claim and a step take the same row lock, so one of them decides it, never both);
- in flight (``RUNNING``, ``QUEUED``: the live schedule, a restart or another backfill has it),
  until its outcome is written: a slot whose run then fails, or is abandoned by an instance that
  died, is run by the backfill; one that completes is passed over.

and passes over, counting the reason:

- a slot that completed;
- a slot an operator skipped (``slotcron skip``);
- a slot with no row at all that is older than the history kept
  (``SCHEDULER_HISTORY_RETENTION_DAYS``) but not older than the job: its row may have been pruned
  after it completed, and running it again could run a completed slot twice.

A step holds the backfill's row (``FOR UPDATE SKIP LOCKED``: one instance steps a backfill at a
time; another finds it busy and leaves it) and the job's (``FOR UPDATE``, as claims take it), and
moves the cursor only from where the caller read it: a step on a stale view changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from slotcron.status import Status
from slotcron.store.database import Database
from slotcron.store.lifeline import announce_queued
from slotcron.store.tables import backfills, executions, jobs, skips

IN_FLIGHT = (Status.RUNNING, Status.QUEUED)
LIVE = "live"
BUSY = "in flight"
WAITS = (LIVE, BUSY)
"""What the cursor stops at until it changes."""
GONE = "its job was removed"


@dataclass(frozen=True)
class History:
    """What the database knows of a job and of some of its slots, read under its row lock."""

    last_slot_at: datetime | None
    registered_at: datetime
    paused: bool
    params: dict[str, Any]
    attempts: dict[datetime, list[Any]] = field(default_factory=dict)
    """Each slot's attempts (``status``, ``attempt``, ``state``), oldest first."""
    skipped: set[datetime] = field(default_factory=set)

    def why_not(self, slot: datetime, *, kept_since: datetime) -> str | None:
        """Why ``slot`` is not run by the backfill now (one of :data:`WAITS`, or a reason it is
        passed over), or None."""
        if slot > (self.last_slot_at or self.registered_at):
            return LIVE
        if slot in self.skipped:
            return "skipped"
        attempts = self.attempts.get(slot, [])
        if any(a.status == Status.COMPLETED for a in attempts):
            return "completed"
        if any(a.status in IN_FLIGHT for a in attempts):
            return BUSY
        if not attempts and self.registered_at <= slot < kept_since:
            return "history pruned"
        return None


async def history(
    conn: AsyncConnection, job: str, slots: Sequence[datetime], *, lock: bool
) -> History | None:
    """The job's row (locked when ``lock``) and the attempts and skips of ``slots``; None when
    the job is gone."""
    query = select(jobs.c.last_slot_at, jobs.c.registered_at, jobs.c.paused, jobs.c.params).where(
        jobs.c.name == job
    )
    row = (await conn.execute(query.with_for_update() if lock else query)).one_or_none()
    if row is None:
        return None
    found = History(row.last_slot_at, row.registered_at, bool(row.paused), dict(row.params or {}))
    if not slots:
        return found
    within = (executions.c.scheduled_at >= slots[0]) & (executions.c.scheduled_at <= slots[-1])
    attempts = await conn.execute(
        select(
            executions.c.scheduled_at, executions.c.status, executions.c.attempt,
            executions.c.state,
        )
        .where(executions.c.job_name == job, within)
        .order_by(executions.c.scheduled_at, executions.c.attempt)
    )  # fmt: skip
    for a in attempts:
        found.attempts.setdefault(a.scheduled_at, []).append(a)
    skipped = await conn.execute(
        select(skips.c.scheduled_at).where(
            skips.c.job_name == job,
            skips.c.scheduled_at >= slots[0],
            skips.c.scheduled_at <= slots[-1],
        )
    )
    found.skipped.update(skipped.scalars())
    return found


async def longest_recent_run(db: Database, job: str, *, runs: int = 10) -> float:
    """Seconds the longest of ``job``'s last ``runs`` finished runs took (0 with none)."""
    async with db.read() as conn:
        rows = await conn.execute(
            select(executions.c.started_at, executions.c.finished_at)
            .where(
                executions.c.job_name == job,
                executions.c.started_at.is_not(None),
                executions.c.finished_at.is_not(None),
            )
            .order_by(executions.c.id.desc())
            .limit(runs)
        )
        took = [(r.finished_at - r.started_at).total_seconds() for r in rows]
    return max(took, default=0.0)


@dataclass(frozen=True)
class Stepped:
    """What one step did."""

    queued: list[datetime] = field(default_factory=list)
    passed: dict[str, int] = field(default_factory=dict)
    """Slots passed over, by reason."""
    waiting: str | None = None
    """Why the cursor stopped (one of :data:`WAITS`), if it did."""
    at: datetime | None = None
    """The slot it stopped at."""
    moved: bool = False
    """False: nothing changed (the backfill was busy, moved on, ended, or its job is paused)."""
    paused: bool = False


async def step(
    db: Database,
    backfill_id: int,
    *,
    cursor: datetime,
    slots: Sequence[datetime],
    following: datetime | None,
    budget: int,
    now: datetime,
    kept_since: datetime,
) -> Stepped:
    """Consider ``slots`` (the backfill's next ones, from ``cursor``, oldest first) and queue up
    to ``budget`` of them, due now (the carrier paces the budgets: queued runs due later would
    need a wake-up of their own on every instance); the cursor moves to the first slot not
    considered (``following`` when all were)."""
    async with db.transaction() as conn:
        row = (
            await conn.execute(
                select(backfills.c.job_name, backfills.c.next_at)
                .where(backfills.c.id == backfill_id, backfills.c.status == "RUNNING")
                .with_for_update(skip_locked=True)
            )
        ).one_or_none()
        if row is None or row.next_at != cursor:
            return Stepped()
        known = await history(conn, row.job_name, slots, lock=True)
        if known is None:
            await _end(conn, backfill_id, "CANCELLED", GONE, now)
            return Stepped(moved=True)
        if known.paused:
            return Stepped(paused=True)
        done = Stepped(moved=True)
        left = list(slots)
        while left and len(done.queued) < budget:
            reason = known.why_not(left[0], kept_since=kept_since)
            if reason in WAITS:
                done = replace(done, waiting=reason, at=left[0])
                break
            slot = left.pop(0)
            if reason is None:
                done.queued.append(slot)
            else:
                done.passed[reason] = done.passed.get(reason, 0) + 1
        if done.waiting and len(left) == len(slots):
            return done  # stopped at the cursor: nothing to write
        await _queue(conn, db, backfill_id, row.job_name, done.queued, known, now)
        await conn.execute(
            update(backfills)
            .where(backfills.c.id == backfill_id)
            .values(
                next_at=left[0] if left else following,
                slots_seen=backfills.c.slots_seen + len(slots) - len(left),
                slots_queued=backfills.c.slots_queued + len(done.queued),
                slots_passed=backfills.c.slots_passed + sum(done.passed.values()),
                updated_at=now,
            )
        )
    return done


async def _queue(
    conn: AsyncConnection,
    db: Database,
    backfill_id: int,
    job: str,
    slots: list[datetime],
    known: History,
    now: datetime,
) -> None:
    """Insert a QUEUED attempt (trigger ``backfill``) of each slot: the slot's next attempt,
    with its last checkpointed state; a runtime schedule's params."""
    if not slots:
        return
    rows = []
    for slot in slots:
        attempts = known.attempts.get(slot, [])
        rows.append(
            {
                "job_name": job,
                "scheduled_at": slot,
                "trigger": "backfill",
                "status": Status.QUEUED,
                "attempt": attempts[-1].attempt + 1 if attempts else 1,
                "created_at": now,
                "available_at": now,
                "params": known.params,
                "state": dict(attempts[-1].state or {}) if attempts else {},
                "backfill_id": backfill_id,
            }
        )
    await conn.execute(insert(executions), rows)
    await announce_queued(conn, db.dialect, now)


async def _end(
    conn: AsyncConnection, backfill_id: int, status: str, note: str | None, now: datetime
) -> None:
    await conn.execute(
        update(backfills)
        .where(backfills.c.id == backfill_id)
        .values(status=status, note=note, next_at=None, updated_at=now)
    )
