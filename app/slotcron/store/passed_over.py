"""Recording passed-over ranges: one ``MISSED`` execution stands for many slots.

Slots older than ``catchup_window`` are not decided one by one (:mod:`slotcron.jobs.misfire`); each
range of them is recorded by one row whose ``scheduled_at`` is its first slot and ``until``
its last, under the job's row lock, like a claim:

    SELECT name, last_slot_at, fingerprint FROM scheduler_jobs WHERE name IN (...) FOR UPDATE
    another schedule in force  -> nothing written: the recorder was superseded (item 5)
    last_slot_at >= first      -> nothing written: the range (or part of it) is decided
    otherwise                  -> INSERT execution MISSED (scheduled_at first, until last)
                                  UPDATE last_slot_at = last, next_slot_at = the slot after
    COMMIT

The high-water mark is what keeps a range from being recorded twice (two instances back from
one outage) and from overlapping slots recorded one by one: both are decided under the same
lock and advance the same mark. The unique key ``(job_name, scheduled_at, attempt)`` stays
the last line of defence: an IntegrityError is a lost race.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import bindparam, insert, select, update
from sqlalchemy.exc import IntegrityError

from slotcron.status import Status
from slotcron.store.database import Database
from slotcron.store.execution_rows import execution_row
from slotcron.store.skips import moved_on
from slotcron.store.tables import UTCDateTime, executions, jobs

_CHUNK = 200

_LAST = bindparam("p_last", type_=UTCDateTime())
_ADVANCE = (
    update(jobs)
    .where(jobs.c.name == bindparam("p_job"))
    .ordered_values(
        (jobs.c.last_slot_at, _LAST),
        (jobs.c.next_slot_at, bindparam("p_next", type_=UTCDateTime())),
        *moved_on(_LAST),  # a skip inside the range was passed over with it
    )
)


@dataclass(frozen=True)
class Range:
    """A job's passed-over slots ``first`` to ``last``; ``following`` is the slot after
    ``last`` (the job's expected slot once the range is recorded)."""

    job_name: str
    first: datetime
    last: datetime
    following: datetime
    trigger: str
    reason: str
    fingerprint: str | None = None
    """The recorder's schedule fingerprint: refused if another schedule is in force."""


@dataclass(frozen=True)
class Outcome:
    """What became of one range: recorded as ``execution_id``, found decided up to
    ``high_water`` (the job's high-water mark, at or after the range's first slot), or refused
    because the recorder's schedule was ``superseded``."""

    execution_id: int | None = None
    high_water: datetime | None = None
    superseded: bool = False


async def record(
    db: Database, ranges: Sequence[Range], *, instance_id: str, now: datetime
) -> dict[str, Outcome]:
    """Record each range (at most one per job) as one ``MISSED`` execution, unless its first
    slot is already decided; a few transactions however many ranges."""
    outcomes: dict[str, Outcome] = {}
    for begin in range(0, len(ranges), _CHUNK):
        chunk = list(ranges[begin : begin + _CHUNK])
        try:
            outcomes.update(await _record(db, chunk, instance_id=instance_id, now=now))
        except IntegrityError:
            # A row at a range's first slot that the high-water mark did not close (a manual
            # run at that very instant): record the others one by one.
            for one in chunk:
                try:
                    outcomes.update(await _record(db, [one], instance_id=instance_id, now=now))
                except IntegrityError:
                    outcomes[one.job_name] = Outcome(high_water=one.first)
    return outcomes


async def _record(
    db: Database, ranges: list[Range], *, instance_id: str, now: datetime
) -> dict[str, Outcome]:
    by_name = {r.job_name: r for r in ranges}
    outcomes: dict[str, Outcome] = {}
    async with db.transaction() as conn:
        # In name order: two recorders of overlapping sets wait for each other, never deadlock
        # (claims never wait: NOWAIT or SKIP LOCKED).
        locked = await conn.execute(
            select(jobs.c.name, jobs.c.last_slot_at, jobs.c.fingerprint)
            .where(jobs.c.name.in_(sorted(by_name)))
            .order_by(jobs.c.name)
            .with_for_update()
        )
        todo: list[Range] = []
        for row in locked:
            item = by_name[row.name]
            if item.fingerprint is not None and row.fingerprint not in (None, item.fingerprint):
                outcomes[row.name] = Outcome(superseded=True)
            elif row.last_slot_at is not None and row.last_slot_at >= item.first:
                outcomes[row.name] = Outcome(high_water=row.last_slot_at)
            else:
                todo.append(item)
        if not todo:
            return outcomes
        rows = [
            {
                **execution_row(
                    job_name=item.job_name,
                    slot=item.first,
                    trigger=item.trigger,
                    status=Status.MISSED,
                    instance_id=instance_id,
                    now=now,
                    reason=item.reason,
                ),
                "until": item.last,
            }
            for item in todo
        ]
        inserted = await conn.execute(
            insert(executions).returning(executions.c.id, sort_by_parameter_order=True), rows
        )
        for item, execution_id in zip(todo, inserted.scalars(), strict=True):
            outcomes[item.job_name] = Outcome(execution_id=int(execution_id))
        await conn.execute(
            _ADVANCE,
            [{"p_job": i.job_name, "p_last": i.last, "p_next": i.following} for i in todo],
        )
    return outcomes
