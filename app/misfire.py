"""Deciding late slots: pure functions of a job, its schedule, the late slot and the time.

A slot is *late* once it is past its grace (until its successor is due, between
:data:`MIN_GRACE` and :data:`MAX_GRACE`): it is no longer started as if on time, and the job's
``misfire`` policy decides it (:func:`decide`): ``skip`` records each ``MISSED``; ``once`` runs
the newest as a ``catchup`` run and records the rest ``MISSED``; ``all`` runs each in order as
``catchup``. Slots older than ``catchup_window`` are passed over, never enumerated: an outage
of days must not stall anything (:func:`window_start`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from app.registry import Job
from app.slots import Schedule, slots_between

log = logging.getLogger("slotcron.scheduler")

MIN_GRACE = timedelta(seconds=1)
MAX_GRACE = timedelta(seconds=60)
TICK = timedelta(microseconds=1)
"""The smallest step of time: ``next_after(slot - TICK)`` is ``slot`` itself."""


def grace(schedule: Schedule, slot: datetime) -> timedelta:
    """How late a slot may still be started: until its successor is due, between 1 s and 60 s."""
    return min(max(schedule.next_after(slot) - slot, MIN_GRACE), MAX_GRACE)


def is_late(schedule: Schedule, slot: datetime, now: datetime) -> bool:
    return now - slot > grace(schedule, slot)


def missed_reason(job: Job, slot: datetime, now: datetime) -> str:
    """Why a late slot is recorded MISSED: how late it was reached, and the policy."""
    lateness = (now - slot).total_seconds()
    return f"misfire: not claimed until {lateness:.1f} s after its time (misfire={job.misfire!r})"


def window_start(job: Job, first: datetime, now: datetime) -> datetime:
    """Where deciding late slots starts: ``first``, or the edge of ``catchup_window``.
    Older slots are passed over (not enumerated: an outage of days must not stall us)."""
    edge = now - timedelta(seconds=job.catchup_window)
    if first >= edge:
        return first
    log.warning(
        "%s: slots from %s to %s are older than catchup_window=%gs: passed over",
        job.name,
        first.isoformat(),
        edge.isoformat(),
        job.catchup_window,
    )
    return edge


def late_slots(
    job: Job, schedule: Schedule, first: datetime, now: datetime
) -> tuple[list[datetime], datetime]:
    """The slots from ``first`` on that are past their grace, within ``catchup_window``, and
    the first slot that is not late (where normal firing resumes)."""
    late: list[datetime] = []
    slot = schedule.next_after(window_start(job, first, now) - TICK)
    while slot <= now and is_late(schedule, slot, now):
        late.append(slot)
        slot = schedule.next_after(slot)
    return late, slot


def undecided_before(
    job: Job, schedule: Schedule, expected: datetime, slot: datetime, now: datetime
) -> list[datetime]:
    """The slots from ``expected`` (the first the cluster never decided) up to, not including,
    ``slot``, within ``catchup_window``."""
    start = window_start(job, expected, now)
    return list(slots_between(schedule, start - TICK, slot - TICK))


@dataclass(frozen=True)
class Verdict:
    """What the policy makes of one late slot: run it as ``catchup``, or record it MISSED."""

    slot: datetime
    run: bool


def decide(job: Job, late: list[datetime]) -> list[Verdict]:
    """The misfire policy over late slots, in order: the one entry point of the policy."""
    to_run = {"skip": [], "once": late[-1:], "all": late}[job.misfire]
    return [Verdict(slot, slot in to_run) for slot in late]
