"""A job as its row in ``scheduler_jobs`` describes it: its slots, window and excluded days, for
what reads the database without the job's code (``slotcron skip``, ``slotcron backfill``, the
HTTP API of an instance that does not have the job).

A code job's row stores its schedule as it registers it (``every 30s`` for an interval) and
its options (calendar, excluded dates, window, ``max_runs``:
:meth:`slotcron.jobs.registry.Job.options`); a runtime schedule's stores an interval as its
seconds (``30``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Any

from slotcron.jobs.calendars import excluded
from slotcron.jobs.windows import stored_moment
from slotcron.schedule.slots import NEVER, IntervalSchedule, Schedule, shared, windowed


def schedule_of(row: Any) -> Schedule:
    """The slots a job's row stores (``kind``, ``schedule``, ``timezone``), without its window."""
    if row.kind == "interval":
        seconds = str(row.schedule).removeprefix("every ").removesuffix("s")
        return IntervalSchedule(timedelta(seconds=float(seconds)))
    return shared(row.schedule, row.timezone)


@dataclass(frozen=True)
class StoredJob:
    """What a job's row says of its slots."""

    name: str
    schedule: Schedule
    """Its slots within its window (``start_at``, ``end_at``)."""
    timezone: str
    calendar: str | None = None
    exclude_dates: frozenset[date] = field(default_factory=frozenset)
    overlap: str = "forbid"
    max_runs: int | None = None
    paused: bool = False

    @classmethod
    def of(cls, row: Any) -> StoredJob:
        """From a row with ``name``, ``kind``, ``schedule``, ``timezone``, ``options`` (decoded)
        and ``paused``."""
        options = dict(row.options or {})
        start, end = options.get("start_at"), options.get("end_at")
        return cls(
            name=row.name,
            schedule=windowed(schedule_of(row), stored_moment(start), stored_moment(end)),
            timezone=row.timezone,
            calendar=options.get("calendar"),
            exclude_dates=frozenset(
                date.fromisoformat(day) for day in options.get("exclude_dates") or ()
            ),
            overlap=str(options.get("overlap") or "forbid"),
            max_runs=options.get("max_runs"),
            paused=bool(row.paused),
        )

    def runs_on(self, slot: datetime) -> bool:
        """Whether ``slot`` is run (its day is not excluded by the calendar or a date)."""
        return excluded(self, slot, self.timezone) is None

    def slots(self, start: datetime, end: datetime) -> Iterator[datetime]:
        """Its slots in [``start``, ``end``) that are run, oldest first."""
        return slots_between(self.schedule, self.runs_on, start, end)


def slots_between(
    schedule: Schedule, runs_on: Callable[[datetime], bool], start: datetime, end: datetime
) -> Iterator[datetime]:
    """The slots of ``schedule`` in [``start``, ``end``) that ``runs_on`` keeps, oldest first
    (none past a window's end)."""
    slot = schedule.next_after(start - timedelta(microseconds=1))
    while slot < end and slot != NEVER:
        if runs_on(slot):
            yield slot
        slot = schedule.next_after(slot)
