"""A runtime schedule as callers ask for it: checked in this one place for the CLI, the HTTP API
and :class:`slotcron.Client`, and shown in one JSON shape (docs/how-to/runtime-schedules.md).

Every refusal is an :class:`InvalidJobError` naming the field (``task``, ``id``, ``cron``,
``every``, ``timezone``, ``params``, ``jitter``, ``paused``): the CLI exits 2 with it, the API
answers 400 with it, the client raises it. Nothing is written before these checks pass. An id
already taken is a conflict rather than bad input (:class:`IdTaken`: exit 1, HTTP 409; the
client raises it as :class:`InvalidJobError` naming ``id``).

A stored row is read back through the same checks (:mod:`slotcron.jobs.schedule_rows`): a row
that a writer outside slotcron changed and that no write would accept is *unreadable*: it is
quarantined, never fired, and listed with its error (:attr:`ScheduleRecord.error`), while every
other schedule goes on.

Whether a task exists is the one check that needs more than the request (:class:`TaskInfo`): a
task is known when the asking process registered it (``@task`` in a module it imported: the
CLI imports ``SCHEDULER_JOBS``, an instance its jobs, an application its own code) or when an
instance recorded it in ``scheduler_tasks`` at its start. A client in a web application that
never imports the task code therefore needs one instance of the new code started once first.
"""

from __future__ import annotations

import functools
import math
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from datetime import date, datetime, timedelta
from typing import Any, Literal

from slotcron.errors import Refused
from slotcron.jobs.calendars import check_calendar, check_exclude_dates, excluded
from slotcron.jobs.checks import MAX_NAME_LENGTH
from slotcron.jobs.schedule_fields import (
    check_flag,
    check_jitter,
    check_only,
    check_params,
    check_text,
    check_timing,
    check_zone,
    refuse,
)
from slotcron.jobs.windows import check_max_runs, check_moment, check_window, stored_moment
from slotcron.schedule.slots import NEVER, IntervalSchedule, Schedule, shared, windowed
from slotcron.text import iso

BOUNDS = ("calendar", "exclude_dates", "start_at", "end_at", "max_runs")
"""A schedule's own days and window (its task's when it gives none): stored with its task's
options in the row's ``options``, where the instances read them as a decorator's."""

FIELDS = ("task", "id", "cron", "every", "timezone", "params", "jitter", "paused", *BOUNDS)
"""What a new schedule may say (the POST body, the client's keywords)."""

CHANGEABLE = ("cron", "every", "timezone", "params", "jitter", "paused", *BOUNDS)
"""What an update may change (the PATCH body); the id and the task stay. A bound given as
null is taken off."""


class IdTaken(Refused):
    """A new schedule's id is already taken by a job or a schedule (ids compare byte for byte):
    a conflict with what is stored, not bad input (exit 1, HTTP 409). :class:`slotcron.Client`
    raises it as :class:`InvalidJobError` naming ``id``. The message never holds another row's
    data."""

    field = "id"

    def __init__(self, schedule_id: str, problem: str) -> None:
        self.id = schedule_id
        self.problem = problem
        super().__init__(f"job {schedule_id!r}: id: {problem}")


@dataclass(frozen=True)
class TaskInfo:
    """What a writer knows of a task: its stored options and default zone."""

    name: str
    options: dict[str, Any]
    timezone: str | None


@dataclass(frozen=True)
class ScheduleSpec:
    """A schedule checked and complete: what is stored."""

    id: str
    task: str
    kind: Literal["cron", "interval"]
    expression: str  # the cron expression as given, or the interval in seconds (as "%g")
    timezone: str
    params: dict[str, Any]
    jitter: float | None
    paused: bool
    bounds: Mapping[str, Any] = field(default_factory=dict)
    """Its :data:`BOUNDS` in force, as stored (JSON: ISO-8601 texts); empty on a spec read
    without them."""

    def schedule(self) -> Schedule:
        slots: Schedule
        if self.kind == "cron":
            slots = shared(self.expression, self.timezone)
        else:
            slots = IntervalSchedule(timedelta(seconds=float(self.expression)))
        start, end = self.bounds.get("start_at"), self.bounds.get("end_at")
        return windowed(slots, stored_moment(start), stored_moment(end))

    def timing(self) -> tuple[Any, ...]:
        """What decides the slots: a change of it moves the next slot, nothing else does."""
        return (
            self.kind, self.expression, self.timezone,
            self.bounds.get("start_at"), self.bounds.get("end_at"),
        )  # fmt: skip

    @property
    def calendar(self) -> str | None:
        return self.bounds.get("calendar")

    @property
    def exclude_dates(self) -> frozenset[date]:
        return frozenset(date.fromisoformat(d) for d in self.bounds.get("exclude_dates") or ())

    def runs_on(self, slot: datetime) -> bool:
        """Whether ``slot`` runs (its day is not excluded by its calendar or a date)."""
        return excluded(self, slot, self.timezone) is None


@dataclass(frozen=True)
class UnreadableSpec(ScheduleSpec):
    """A stored schedule that cannot be read: what of it could be read, as stored (a field that
    could not be read holds a neutral value), and why not, by field (:attr:`problems`)."""

    problems: Mapping[str, str] = field(default_factory=dict)

    @property
    def error(self) -> str:
        return "; ".join(f"{name}: {problem}" for name, problem in self.problems.items())

    def schedule(self) -> Schedule:
        return Quarantined(self.error)


@dataclass(frozen=True)
class Quarantined:
    """The schedule of an unreadable row: it has no slot, and says why."""

    error: str

    def describe(self) -> str:
        return f"unreadable ({self.error})"

    def next_after(self, moment: datetime) -> datetime:
        raise ValueError(f"an unreadable schedule has no slot: {self.error}")


@dataclass(frozen=True)
class ScheduleRecord:
    """A stored schedule."""

    spec: ScheduleSpec
    created_at: datetime
    updated_at: datetime
    next_slot: datetime | None

    @property
    def error(self) -> str | None:
        """Why the stored row cannot be read (it is quarantined: never fired until a write
        mends it or it is removed); None when it can."""
        return self.spec.error if isinstance(self.spec, UnreadableSpec) else None


def new_spec(
    fields: Mapping[str, Any], *, task: TaskInfo | None, default_timezone: str
) -> ScheduleSpec:
    """Check a new schedule's ``fields`` (:data:`FIELDS`; ``task`` required). ``task`` is what
    the writer knows of the named task, None when it knows nothing: refused, naming ``task``."""
    name = check_text("?", "task", fields.get("task"))
    check_only(name, fields, FIELDS)
    if task is None:
        raise refuse(
            name,
            "task",
            "unknown task: no @task of this name is registered here, and no instance has "
            "recorded it (start an instance whose SCHEDULER_JOBS registers it)",
        )
    given_id = fields.get("id")
    # Refusals name the id when one was given, else the task (a generated id means nothing yet).
    who = name if given_id is None else check_text(name, "id", given_id)
    kind, expression = check_timing(who, fields.get("cron"), fields.get("every"))
    zone = fields.get("timezone")
    zone = check_zone(who, zone if zone is not None else task.timezone or default_timezone)
    params = check_params(who, fields.get("params", {}))
    jitter = check_jitter(who, fields.get("jitter"))
    paused = check_flag(who, "paused", fields.get("paused", False))
    given_bounds = any(key in fields for key in BOUNDS)
    bounds = check_bounds(who, fields, task.options) if given_bounds else task_bounds(task.options)
    schedule_id = f"{name}/{uuid.uuid4().hex[:12]}" if given_id is None else who
    if len(schedule_id) > MAX_NAME_LENGTH:
        raise refuse(
            name, "id", f"the generated id has {len(schedule_id)} characters; give a shorter id"
        )
    return ScheduleSpec(
        id=schedule_id,
        task=name,
        kind=kind,
        expression=expression,
        timezone=zone,
        params=params,
        jitter=jitter,
        paused=paused,
        bounds=bounds,
    )


def check_bounds(who: str, given: Mapping[str, Any], base: Mapping[str, Any]) -> dict[str, Any]:
    """A schedule's :data:`BOUNDS`: each one ``given`` checked as a decorator's option (None
    takes it off), the others as in ``base`` (its task's options, or the schedule's bounds
    before an update), in their stored form."""
    merged = {key: given[key] if key in given else base.get(key) for key in BOUNDS}
    start = check_moment(who, "start_at", merged["start_at"])
    end = check_moment(who, "end_at", merged["end_at"])
    check_window(who, start, end)
    days = check_exclude_dates(who, "exclude_dates", merged["exclude_dates"] or ())
    return {
        "calendar": check_calendar(who, "calendar", merged["calendar"]),
        "exclude_dates": sorted(day.isoformat() for day in days),
        "start_at": None if start is None else start.isoformat(),
        "end_at": None if end is None else end.isoformat(),
        "max_runs": check_max_runs(who, "max_runs", merged["max_runs"]),
    }


_TASK_BOUNDS: dict[int, tuple[Mapping[str, Any], dict[str, Any]]] = {}


def task_bounds(task_options: Mapping[str, Any]) -> dict[str, Any]:
    """The bounds of a schedule that gives none: its task's, checked once per options object (a
    batch of 100,000 schedules shares one). Shared: read it, never change it."""
    seen = _TASK_BOUNDS.get(id(task_options))
    if seen is None or seen[0] is not task_options:
        if len(_TASK_BOUNDS) > 256:
            _TASK_BOUNDS.clear()
        seen = (task_options, check_bounds("?", {}, task_options))
        _TASK_BOUNDS[id(task_options)] = seen
    return seen[1]


def changed_spec(current: ScheduleSpec, changes: Mapping[str, Any]) -> ScheduleSpec:
    """``current`` with ``changes`` (:data:`CHANGEABLE`) applied and checked. Giving ``cron``
    or ``every`` replaces the timing (one of them, as for a new schedule)."""
    who = current.id
    check_only(who, changes, CHANGEABLE)
    spec = ScheduleSpec(*(getattr(current, f.name) for f in fields(ScheduleSpec)))
    # What of an unreadable row is not given anew stays unreadable: refused, naming it.
    unread = dict(current.problems) if isinstance(current, UnreadableSpec) else {}
    if changes.get("cron") is not None or changes.get("every") is not None:
        kind, expression = check_timing(who, changes.get("cron"), changes.get("every"))
        spec = replace(spec, kind=kind, expression=expression)
        unread.pop("cron", None)
        unread.pop("every", None)
    if changes.get("timezone") is not None:
        spec = replace(spec, timezone=check_zone(who, changes["timezone"]))
        unread.pop("timezone", None)
    if "params" in changes:
        spec = replace(spec, params=check_params(who, changes["params"]))
        unread.pop("params", None)
    if "jitter" in changes:
        spec = replace(spec, jitter=check_jitter(who, changes["jitter"]))
        unread.pop("jitter", None)
    if changes.get("paused") is not None:
        spec = replace(spec, paused=check_flag(who, "paused", changes["paused"]))
    if any(key in changes for key in BOUNDS):
        spec = replace(spec, bounds=check_bounds(who, changes, spec.bounds))
    for name, problem in unread.items():
        mend = "give a new one" if name in CHANGEABLE else "remove the schedule and add it again"
        raise refuse(who, name, f"the stored value cannot be read ({problem}): {mend}")
    return spec


def next_slots(record: ScheduleRecord, count: int) -> list[datetime]:
    """The schedule's next ``count`` slots that run, from its stored next slot (its excluded
    days left out; none when unreadable, or past its window's end)."""
    if record.next_slot is None or record.error is not None:
        return []
    spec = record.spec
    schedule = spec.schedule()
    slots: list[datetime] = []
    slot, looked = record.next_slot, 0
    while len(slots) < count and slot != NEVER and looked < MAX_LOOKED:
        if spec.runs_on(slot):
            slots.append(slot)
        slot, looked = schedule.next_after(slot), looked + 1
    return slots


MAX_LOOKED = 1000
"""Slots :func:`next_slots` looks at, at most: a calendar excludes some days, never all."""


_iso = functools.lru_cache(maxsize=1024)(iso)
"""A batch's schedules share their timestamps: each is written out once."""


def schedule_json(record: ScheduleRecord) -> dict[str, Any]:
    """The one JSON shape of a schedule (``--json``, the API, the client's dicts). An unreadable
    one adds ``error`` (why, by field) and shows its fields as stored (params null when they
    cannot be read)."""
    spec = record.spec
    shape = {
        "id": spec.id,
        "task": spec.task,
        "cron": spec.expression if spec.kind == "cron" else None,
        "every": _every(spec.expression) if spec.kind == "interval" else None,
        "timezone": spec.timezone,
        "params": spec.params,
        "jitter": spec.jitter,
        "paused": spec.paused,
        **{key: spec.bounds.get(key) for key in BOUNDS},
        "created_at": _iso(record.created_at),
        "updated_at": _iso(record.updated_at),
        "next_slot": _iso(record.next_slot) if record.next_slot != NEVER else None,
    }
    if not shape["exclude_dates"]:
        shape["exclude_dates"] = []
    if isinstance(spec, UnreadableSpec):
        shape["error"] = spec.error
        if "params" in spec.problems:
            shape["params"] = None
    return shape


def _every(expression: str) -> float | int | str:
    try:
        every = float(expression)
    except ValueError:
        every = math.nan
    if not math.isfinite(every):  # an unreadable row's, shown as stored
        return expression
    return int(every) if every.is_integer() else every
