"""Registration: ``@cron`` and ``@every`` turn coroutines into jobs, ``@task`` into tasks whose
schedules are data (docs/how-to/runtime-schedules.md); all checked when declared."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Any, Literal, TypedDict, TypeVar, Unpack

from slotcron.errors import InvalidJobError
from slotcron.jobs.checks import MIN_INTERVAL, check_options, name_problem
from slotcron.jobs.windows import check_window
from slotcron.schedule.slots import (
    IntervalSchedule,
    Schedule,
    normalise_cron,
    shared,
    windowed,
    zone_problem,
)

JobFunc = Callable[..., Awaitable[None]]
F = TypeVar("F", bound=JobFunc)


@dataclass(frozen=True)
class Job:
    """A registered job. ``timezone`` and ``lease`` of ``None`` take the service's defaults."""

    name: str
    func: JobFunc
    kind: Literal["cron", "interval", "task"]
    expression: str  # the cron expression as written, the interval in seconds; "" for a task
    timezone: str | None = None
    overlap: str = "forbid"
    misfire: str = "skip"
    catchup_window: float = 3600.0
    lease: float | None = None
    timeout: float | None = None
    max_attempts: int = 1
    retry_backoff: float = 10.0
    jitter: float = 0.0
    restartable: bool = True
    enabled: bool = True
    alert: bool = True
    """Whether this job's outcomes worth attention go to the alert webhook
    (app/slotcron/observe/alerts.py)."""
    calendar: str | None = None
    """``holidays:CC[-SUB]``: its holidays' slots are recorded SKIPPED (jobs/calendars.py)."""
    exclude_dates: frozenset[date] = frozenset()
    """Days whose slots are recorded SKIPPED, in the job's time zone."""
    start_at: datetime | None = None
    """No slot before it (jobs/windows.py)."""
    end_at: datetime | None = None
    """No slot at or after it."""
    max_runs: int | None = None
    """No slot once this many of its runs completed, across the cluster (store/counted.py)."""
    takes_context: bool = field(default=False, compare=False)

    @property
    def trigger(self) -> str:
        """The trigger recorded for this job's scheduled slots."""
        return "cron" if self.kind == "cron" else "interval"

    def schedule(self, default_timezone: str = "UTC") -> Schedule:
        slots: Schedule
        if self.kind == "cron":
            slots = shared(self.expression, self.timezone or default_timezone)
        else:
            slots = IntervalSchedule(timedelta(seconds=float(self.expression)))
        return windowed(slots, self.start_at, self.end_at)

    def lease_seconds(self, default: float) -> float:
        return self.lease if self.lease is not None else default

    def lease_ms(self, default: float) -> int:
        """The lease as stored with a run (whole milliseconds)."""
        return round(self.lease_seconds(default) * 1000)

    def options(self) -> dict[str, Any]:
        """The options stored with the job's row, as JSON-friendly values."""
        return {
            "overlap": self.overlap,
            "misfire": self.misfire,
            "catchup_window": self.catchup_window,
            "lease": self.lease,
            "timeout": self.timeout,
            "max_attempts": self.max_attempts,
            "retry_backoff": self.retry_backoff,
            "jitter": self.jitter,
            "restartable": self.restartable,
            "enabled": self.enabled,
            "alert": self.alert,
            "calendar": self.calendar,
            "exclude_dates": sorted(d.isoformat() for d in self.exclude_dates),
            "start_at": None if self.start_at is None else self.start_at.isoformat(),
            "end_at": None if self.end_at is None else self.end_at.isoformat(),
            "max_runs": self.max_runs,
        }


class Registry:
    """The jobs and tasks one process knows, by name (one namespace for both). Iterating gives
    the scheduled jobs only; tasks are fired through their schedules (:meth:`tasks`)."""

    def __init__(self) -> None:
        self._jobs: dict[str, Job] = {}
        self._tasks: dict[str, Job] = {}

    def add(self, job: Job) -> None:
        if job.name in self._jobs or job.name in self._tasks:
            raise InvalidJobError(job.name, "name", "a job is already registered under this name")
        (self._tasks if job.kind == "task" else self._jobs)[job.name] = job

    def get(self, name: str) -> Job | None:
        return self._jobs.get(name)

    def task(self, name: str) -> Job | None:
        """The task registered under ``name`` by ``@task``, if any."""
        return self._tasks.get(name)

    def tasks(self) -> list[Job]:
        return list(self._tasks.values())

    def __iter__(self) -> Iterator[Job]:
        return iter(self._jobs.values())

    def __len__(self) -> int:
        return len(self._jobs)


REGISTRY = Registry()
"""The process-wide registry that ``@cron`` and ``@every`` add to."""


def _check_function(name: str, func: Any) -> bool:
    """Refuse what is not ``async def f()`` or ``async def f(ctx)``; return whether it takes ctx."""
    if not inspect.iscoroutinefunction(func):
        kind = "an async generator" if inspect.isasyncgenfunction(func) else type(func).__name__
        if callable(func) and not inspect.isasyncgenfunction(func):
            kind = "a plain function"
        raise InvalidJobError(name, "function", f"must be an 'async def' coroutine, got {kind}")
    params = list(inspect.signature(func).parameters.values())
    if len(params) > 1:
        raise InvalidJobError(
            name,
            "signature",
            f"takes {len(params)} parameters; a job takes none or one JobContext",
        )
    if params and params[0].kind not in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    ):
        raise InvalidJobError(
            name,
            "signature",
            f"parameter {params[0].name!r} must be positional; a job takes none or one JobContext",
        )
    return bool(params)


class JobOptions(TypedDict, total=False):
    """The keyword options every kind of job takes (docs/reference/jobs.md)."""

    name: str | None
    timezone: str | None
    overlap: str
    misfire: str
    catchup_window: float
    lease: float | None
    timeout: float | None
    max_attempts: int
    retry_backoff: float
    jitter: float
    restartable: bool
    enabled: bool
    alert: bool
    calendar: str | None
    exclude_dates: Iterable[date | str]
    start_at: datetime | str | None
    end_at: datetime | str | None
    max_runs: int | None
    registry: Registry | None


DEFAULTS: JobOptions = {
    "name": None,
    "timezone": None,
    "overlap": "forbid",
    "misfire": "skip",
    "catchup_window": 3600,
    "lease": None,
    "timeout": None,
    "max_attempts": 1,
    "retry_backoff": 10,
    "jitter": 0,
    "restartable": True,
    "enabled": True,
    "alert": True,
    "calendar": None,
    "exclude_dates": (),
    "start_at": None,
    "end_at": None,
    "max_runs": None,
    "registry": None,
}


def _options(decorator: str, given: JobOptions, *, allowed: frozenset[str]) -> JobOptions:
    """``given`` over the defaults; an option the decorator does not take is a TypeError, as
    for any unexpected keyword argument."""
    for option in given:
        if option not in allowed:
            raise TypeError(f"{decorator}() got an unexpected keyword argument {option!r}")
    return {**DEFAULTS, **given}


def _build(
    func: Any,
    *,
    kind: Literal["cron", "interval", "task"],
    expression: str,
    name: str | None,
    timezone: str | None,
    registry: Registry | None,
    **options: Any,
) -> Job:
    default_name = f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', repr(func))}"
    job_name = default_name if name is None else name
    problem = name_problem(job_name)
    if problem is not None:
        # Named by its beginning: a message need not repeat 201 characters.
        who = job_name if isinstance(job_name, str) else repr(job_name)
        raise InvalidJobError(who if len(who) <= 40 else who[:40] + "...", "name", problem)
    takes_context = _check_function(job_name, func)
    if kind == "cron":
        try:
            normalise_cron(expression)
        except ValueError as exc:
            raise InvalidJobError(job_name, "schedule", str(exc)) from None
    if timezone is not None and (problem := zone_problem(timezone)) is not None:
        raise InvalidJobError(job_name, "timezone", problem)
    checked = check_options(job_name, options)
    check_window(job_name, checked.get("start_at"), checked.get("end_at"))
    job = Job(
        name=job_name,
        func=func,
        kind=kind,
        expression=expression,
        timezone=timezone,
        takes_context=takes_context,
        **checked,
    )
    (REGISTRY if registry is None else registry).add(job)
    return job


def cron(expression: str, **options: Unpack[JobOptions]) -> Callable[[F], F]:
    """Register an ``async def`` as a cron job.

    Five fields have minute precision; six fields put SECONDS FIRST (Spring/Quartz order).
    ``@yearly @monthly @weekly @daily @hourly`` work. Raises :class:`InvalidJobError` at
    decoration time for anything wrong, naming the job and the field. The options are
    :class:`JobOptions`.
    """
    chosen = _options("cron", options, allowed=_CRON_OPTIONS)
    if not isinstance(expression, str):
        raise InvalidJobError(
            str(chosen["name"] or "?"),
            "schedule",
            f"must be a cron expression string, got {expression!r}",
        )

    def decorate(func: F) -> F:
        _build(func, kind="cron", expression=expression, **chosen)
        return func

    return decorate


def every(
    *,
    seconds: float = 0,
    minutes: float = 0,
    hours: float = 0,
    days: float = 0,
    **options: Unpack[JobOptions],
) -> Callable[[F], F]:
    """Register an ``async def`` to run at a fixed rate; slots are aligned to the Unix epoch.
    The options are :class:`JobOptions`, but for ``timezone`` (an interval has none)."""
    chosen = _options("every", options, allowed=_EVERY_OPTIONS)

    def decorate(func: F) -> F:
        name = chosen["name"]
        label = name or f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', '?')}"
        parts = {"seconds": seconds, "minutes": minutes, "hours": hours, "days": days}
        for unit, value in parts.items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise InvalidJobError(label, unit, f"must be a number, got {value!r}")
        try:
            total = timedelta(**parts).total_seconds()
        except (OverflowError, ValueError):
            raise InvalidJobError(label, "interval", "must be a finite number of seconds") from None
        if total <= 0:
            raise InvalidJobError(label, "interval", f"must be positive, got {total:g} seconds")
        if total < MIN_INTERVAL:
            raise InvalidJobError(
                label, "interval", f"must be at least {MIN_INTERVAL:g} second, got {total:g} s"
            )
        _build(func, kind="interval", expression=f"{total:g}", **chosen)
        return func

    return decorate


def task(**options: Unpack[JobOptions]) -> Callable[[F], F]:
    """Register an ``async def`` as a task: the options of ``@cron`` (:class:`JobOptions`), no
    schedule. Its schedules are rows, added at runtime (``slotcron schedules add``, the HTTP
    API, :class:`slotcron.Client`); each runs like a job named by the schedule's id, with
    ``ctx.params`` from the schedule. ``timezone`` is the zone of its schedules that give none.
    """
    chosen = _options("task", options, allowed=_CRON_OPTIONS)

    def decorate(func: F) -> F:
        _build(func, kind="task", expression="", **chosen)
        return func

    return decorate


_CRON_OPTIONS = frozenset(JobOptions.__annotations__)
_EVERY_OPTIONS = _CRON_OPTIONS - {"timezone"}
