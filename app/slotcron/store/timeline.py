"""The slot timeline: each job's last slots and what became of them, for the dashboard.

No read here grows with the length of the history: a job's timeline is one query down the
unique key ``(job_name, scheduled_at, attempt)``, newest slot first, at most ``limit`` rows; the
change marker reads the primary key's two ends, the in-flight rows (the ``(status, ...)``
index) and the job rows (one per job, as ``/api/jobs`` does).

A schedule id is a job name here: its executions carry the id in ``job_name``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Integer, Select, and_, bindparam, case, exists, func, select
from sqlalchemy.orm import aliased

from slotcron.store import markers
from slotcron.store.database import Database
from slotcron.store.history import RECORD_COLUMNS, ExecutionRecord, execution_record
from slotcron.store.tables import executions, jobs, skips

IN_FLIGHT = ("QUEUED", "RUNNING")
"""The only statuses a row ever leaves: every other status is final, so a change to an existing
row always shows in the in-flight set."""


@dataclass(frozen=True)
class SlotCell:
    """One slot of a job: its latest attempt."""

    id: int
    slot: datetime
    status: str
    attempt: int
    trigger: str
    instance_id: str | None
    started_at: datetime | None
    finished_at: datetime | None
    reason: str | None = None
    """Why a SKIPPED or MISSED slot did not run (its first :data:`REASON_CHARS` characters)."""

    @property
    def lag_ms(self) -> int | None:
        """Start of the body minus its slot; None when it never started."""
        if self.started_at is None:
            return None
        return round((self.started_at - self.slot).total_seconds() * 1000)

    @property
    def duration_ms(self) -> int | None:
        if self.started_at is None or self.finished_at is None:
            return None
        return round((self.finished_at - self.started_at).total_seconds() * 1000)


@dataclass(frozen=True)
class JobTimeline:
    job: str
    known: bool
    """False when no job or schedule row has this name (its history may outlive it)."""
    paused: bool
    next_slot: datetime | None
    """The slot the cluster expects next, not yet decided."""
    cells: list[SlotCell]
    """Newest slot first, at most the ``limit`` asked."""
    skips: list[tuple[datetime, str | None]] = field(default_factory=list)
    """Upcoming slots an operator asked to skip (``slotcron skip``), with the reason, the
    earliest :data:`SKIPS_SHOWN` of them."""


_later = aliased(executions, name="later")

REASON_CHARS = 200
SKIPS_SHOWN = 20

_COLUMNS = (
    executions.c.id,
    executions.c.scheduled_at,
    executions.c.status,
    executions.c.attempt,
    executions.c.trigger,
    executions.c.instance_id,
    markers.started_at().label("started_at"),
    executions.c.finished_at,
    case(
        (
            executions.c.status.in_(("SKIPPED", "MISSED")),
            func.substr(executions.c.error, 1, REASON_CHARS),
        ),
        else_=None,
    ).label("reason"),
)


def _slots_query() -> Select[Any]:
    # The latest attempt of each slot: no row of the same slot has a higher attempt. Both the
    # scan and the NOT EXISTS probe are ranges of the unique key. Built once, with the job and
    # the limit as parameters: one compiled statement (one prepared statement per connection).
    newer_attempt = exists().where(
        and_(
            _later.c.job_name == executions.c.job_name,
            _later.c.scheduled_at == executions.c.scheduled_at,
            _later.c.attempt > executions.c.attempt,
        )
    )
    return (
        select(*_COLUMNS)
        .where(executions.c.job_name == bindparam("p_job"), ~newer_attempt)
        .order_by(executions.c.scheduled_at.desc(), executions.c.attempt.desc())
        .limit(bindparam("p_limit", type_=Integer()))
    )


SLOTS = _slots_query()
"""One job's last slots, newest first: parameters ``p_job`` and ``p_limit``."""


async def timelines(db: Database, names: Sequence[str], *, limit: int) -> list[JobTimeline]:
    """The last ``limit`` slots of each of ``names`` (in the order given, duplicates once), each
    slot as its latest attempt, with the job's next expected slot. One read transaction: one
    query for the job rows, then one bounded query per job."""
    wanted = list(dict.fromkeys(names))
    out: list[JobTimeline] = []
    async with db.read() as conn:
        rows = {
            r.name: r
            for r in await conn.execute(
                select(jobs.c.name, jobs.c.paused, jobs.c.next_slot_at, jobs.c.skip_at).where(
                    jobs.c.name.in_(wanted)
                )
            )
        }
        for name in wanted:
            found = (await conn.execute(SLOTS, {"p_job": name, "p_limit": limit})).all()
            row = rows.get(name)
            skipped: list[tuple[datetime, str | None]] = []
            if row is not None and row.skip_at is not None:  # one undecided at least
                skipped = [
                    (r.scheduled_at, r.reason)
                    for r in await conn.execute(
                        select(skips.c.scheduled_at, skips.c.reason)
                        .where(skips.c.job_name == name, skips.c.scheduled_at >= row.skip_at)
                        .order_by(skips.c.scheduled_at)
                        .limit(SKIPS_SHOWN)
                    )
                ]
            out.append(
                JobTimeline(
                    job=name,
                    known=row is not None,
                    paused=bool(row.paused) if row is not None else False,
                    next_slot=row.next_slot_at if row is not None else None,
                    cells=[
                        SlotCell(
                            id=int(r.id),
                            slot=r.scheduled_at,
                            status=r.status,
                            attempt=r.attempt,
                            trigger=r.trigger,
                            instance_id=r.instance_id,
                            started_at=r.started_at,
                            finished_at=r.finished_at,
                            reason=r.reason,
                        )
                        for r in found
                    ],
                    skips=skipped,
                )
            )
    return out


async def execution(db: Database, execution_id: int) -> ExecutionRecord | None:
    """One execution by id, or None."""
    async with db.read() as conn:
        row = (
            (await conn.execute(select(*RECORD_COLUMNS).where(executions.c.id == execution_id)))
            .mappings()
            .one_or_none()
        )
    return execution_record(row) if row is not None else None


async def change_marker(db: Database) -> str:
    """An opaque string that changes whenever what the dashboard shows of executions and jobs
    may have changed: a row added (the newest id) or pruned (the oldest id), a row leaving or
    entering QUEUED or RUNNING (count and id sum per in-flight status: every later status is
    final), a job paused or resumed, registered or redefined. Cheap: no scan of the history."""
    in_flight = (
        select(
            executions.c.status,
            func.count().label("n"),
            func.sum(executions.c.id).label("ids"),
        )
        .where(executions.c.status.in_(IN_FLIGHT))
        .group_by(executions.c.status)
    )
    async with db.read() as conn:
        newest = await conn.scalar(select(func.max(executions.c.id)))
        oldest = await conn.scalar(select(func.min(executions.c.id)))
        flight = sorted(
            (r.status, int(r.n), int(r.ids or 0)) for r in await conn.execute(in_flight)
        )
        defined = (
            await conn.execute(select(func.count(), func.max(jobs.c.updated_at)).select_from(jobs))
        ).one()
        paused = sorted(
            r.name for r in await conn.execute(select(jobs.c.name).where(jobs.c.paused))
        )
    text = repr((newest, oldest, flight, tuple(defined), paused))
    return hashlib.sha256(text.encode()).hexdigest()[:20]
