"""Deciding late slots: pure functions of a job, its schedule, the late slot and the time.

A slot is *late* once it is past its grace (until its successor is due, between
:data:`MIN_GRACE` and :data:`MAX_GRACE`): it is no longer started as if on time, and the job's
``misfire`` policy decides it (:func:`decide`): ``skip`` records each ``MISSED``; ``once`` runs
the newest as a ``catchup`` run and records the rest ``MISSED``; ``all`` runs each in order as
``catchup``. Slots older than ``catchup_window`` are passed over, never enumerated one by one
(an outage of days must not stall anything), and recorded as one ``MISSED`` execution per
passed-over range (:func:`passed_over`): its ``scheduled_at`` is the first slot, its ``until``
the last, so every slot is on the record (guarantee 2).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from slotcron.jobs.registry import Job
from slotcron.schedule.slots import IntervalSchedule, Schedule, slots_between
from slotcron.text import iso

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
    Older slots are passed over (not enumerated: an outage of days must not stall us); they
    are recorded as one range (:func:`passed_over`)."""
    return max(first, now - timedelta(seconds=job.catchup_window))


COUNT_CAP = 10_000
"""Slots of a cron schedule counted one by one for a passed-over range's message, at most
(about 0.1 s of the loop for a six-field cron; an interval's are counted by arithmetic)."""


@dataclass(frozen=True)
class PassedOver:
    """Slots ``first`` to ``last`` (both slots of the job) older than ``catchup_window``: one
    ``MISSED`` execution stands for them all, ``scheduled_at`` ``first`` and ``until`` ``last``."""

    first: datetime
    last: datetime
    reason: str


def passed_over(
    job: Job, schedule: Schedule, first: datetime, now: datetime, before: datetime | None = None
) -> PassedOver | None:
    """The slots from ``first`` on that are older than ``catchup_window`` (and, if given,
    before ``before``): the range :func:`late_slots` and :func:`undecided_before` pass over.
    None when there are none. Costs a few dozen slot computations, however long the range."""
    end = now - timedelta(seconds=job.catchup_window)
    if before is not None:
        end = min(end, before)
    start = schedule.next_after(first - TICK)
    if start >= end:
        return None
    return passed_over_range(job, schedule, start, last_before(schedule, end, start))


def passed_over_range(job: Job, schedule: Schedule, first: datetime, last: datetime) -> PassedOver:
    """The passed-over range from slot ``first`` to slot ``last``, with the reason recorded."""
    count = count_slots(schedule, first, last)
    many = f"{count} slot{'s' if count != 1 else ''}" if count else f"over {COUNT_CAP} slots"
    reason = (
        f"{many} from {iso(first)} to {iso(last)} passed over: "
        f"older than catchup_window {duration(job.catchup_window)} (misfire={job.misfire!r})"
    )
    return PassedOver(first, last, reason)


def last_before(schedule: Schedule, end: datetime, floor: datetime) -> datetime:
    """The last slot before ``end``, given ``floor``, a slot before it. Looks back from ``end``
    in doubling steps, so the cost grows with the log of the gap, not with the range."""
    step = timedelta(seconds=1)
    while True:
        slot = schedule.next_after(max(end - step, floor) - TICK)
        if slot < end:
            while (following := schedule.next_after(slot)) < end:
                slot = following
            return slot
        step *= 2


def count_slots(schedule: Schedule, first: datetime, last: datetime) -> int | None:
    """How many slots from ``first`` to ``last`` (both slots); None past :data:`COUNT_CAP`."""
    if isinstance(schedule, IntervalSchedule):
        return round((last - first) / schedule.interval) + 1
    count, slot = 1, first
    while slot < last:
        if count >= COUNT_CAP:
            return None
        slot, count = schedule.next_after(slot), count + 1
    return count


def duration(seconds: float) -> str:
    """``3600`` as ``1h``, ``90`` as ``90s``: how the contract writes ``catchup_window``."""
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


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
