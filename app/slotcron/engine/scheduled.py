"""Runtime schedules as the firing path sees jobs.

- :class:`ScheduledJob`: a schedule as a job: named by the schedule's id, running its task's
  function with the schedule's params under ``ctx.params`` (a manual trigger's merged over
  them), with the task's options as stored in the row (:func:`scheduled_job`).
- :class:`JobSchedules`: every job's schedule by name for the firing path, code jobs' in a
  plain dict (their lookups stay a dict's), runtime schedules' while anything holds them.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from slotcron.jobs.context import JobContext
from slotcron.jobs.registry import Job, JobFunc
from slotcron.jobs.schedule_rows import read_row, stored_options
from slotcron.jobs.schedules import ScheduleSpec, UnreadableSpec
from slotcron.schedule.slots import Schedule

_FIELDS = tuple(f.name for f in fields(Job))


@dataclass(frozen=True, eq=False)
class ScheduledJob(Job):
    """A runtime schedule as a job: ``name`` is its id. ``version`` is the row's ``updated_at``
    (a new one replaces what is held); ``plan`` its slots; ``mark`` the version its claims
    present (:func:`slotcron.store.schedules.version_mark`; "" for a row written before marks, which
    is refused once a write gives it one)."""

    plan: Schedule | None = None
    version: datetime | None = None
    task: str = ""
    mark: str = ""


def _with_params(task: Job, params: dict[str, Any]) -> JobFunc:
    """The task's function, seeing the schedule's ``params`` under a manual trigger's."""
    if not params and task.takes_context:
        return task.func  # nothing to merge: one coroutine less per run

    async def run(ctx: JobContext) -> None:
        ctx.params = {**params, **ctx.params}
        await (task.func(ctx) if task.takes_context else task.func())

    return run


_TEMPLATES: dict[int, tuple[Job, dict[str, Any]]] = {}
"""Per task (by identity), the field values its schedules' jobs start from."""


def _template(task: Job) -> dict[str, Any]:
    held = _TEMPLATES.get(id(task))
    if held is None or held[0] is not task:
        values = {name: getattr(task, name) for name in _FIELDS}
        values.update(plan=None, version=None, task="", mark="")
        # Every field a job is read by, since the job is filled in place (scheduled_job).
        assert values.keys() == {f.name for f in fields(ScheduledJob)}
        held = _TEMPLATES[id(task)] = (task, values)
    return held[1]


def scheduled_job(row: Any, task: Job, spec: ScheduleSpec | None = None) -> ScheduledJob:
    """The job of a schedule's row (:func:`slotcron.store.due.by_ids`), read as ``spec`` (default:
    :func:`slotcron.jobs.schedules.read_row`; ValueError if the row cannot be read), whose task is
    ``task``: the task's options as stored with the row (every instance runs it alike;
    ``alert`` among them), its own jitter when it has one."""
    if spec is None:
        spec = read_row(row)
    if isinstance(spec, UnreadableSpec):
        raise ValueError(f"schedule {spec.id!r} cannot be read: {spec.error}")
    values = dict(_template(task))
    values.update(stored_options(spec.id, row.options))
    if spec.jitter is not None:
        values["jitter"] = spec.jitter
    values.update(
        name=spec.id,
        func=_with_params(task, spec.params),
        kind=spec.kind,
        expression=spec.expression,
        timezone=spec.timezone,
        takes_context=True,
    )
    values.update(version=row.updated_at, task=spec.task, mark=row.fingerprint or "")
    # Filled in place, not through the frozen dataclass's __init__ (a guarded setattr per
    # field): every field is in ``values``, from a registered task and a row read through the
    # checks of a write; building the jobs was a third of loading 100,000 schedules.
    job = object.__new__(ScheduledJob)
    job.__dict__.update(values)
    # Its plan set on the new object, not by ``replace``: building a job twice was most of
    # loading 100,000 schedules. (Cron plans are shared by expression:
    # slotcron.schedule.slots.shared.)
    job.__dict__["plan"] = job.schedule()
    return job


class JobSchedules(dict[str, Schedule]):
    """Every job's schedule by name: code jobs' as dict entries (looked up at a dict's speed),
    runtime schedules' found on a miss, while anything (the heap, a claim, a run) holds their
    :class:`ScheduledJob`: nothing here keeps a schedule in memory."""

    def __init__(self, code: dict[str, Schedule]) -> None:
        super().__init__(code)
        self._held: weakref.WeakValueDictionary[str, ScheduledJob] = weakref.WeakValueDictionary()

    def hold(self, job: ScheduledJob) -> None:
        self._held[job.name] = job

    def held(self, name: str) -> ScheduledJob | None:
        return self._held.get(name)

    def __missing__(self, name: str) -> Schedule:
        job = self._held.get(name)
        if job is None or job.plan is None:
            raise KeyError(name)
        return job.plan
