"""A runtime schedule as callers ask for it: checked in this one place for the CLI, the HTTP API
and :class:`slotcron.Client`, and shown in one JSON shape (CONTRACT.md, "Schedules at runtime").

Every refusal is an :class:`InvalidJobError` naming the field (``task``, ``id``, ``cron``,
``every``, ``timezone``, ``params``, ``jitter``, ``paused``): the CLI exits 2 with it, the API
answers 400 with it, the client raises it. Nothing is written before these checks pass. An id
already taken is a conflict rather than bad input (:class:`IdTaken`: exit 1, HTTP 409; the
client raises it as :class:`InvalidJobError` naming ``id``).

A stored row is read back through the same checks (:func:`read_row`): a row that a writer outside
slotcron changed (SQL, an older release, a client that lifted Python's digit limit) and that no
write would accept is *unreadable*. It is quarantined, never fired, and listed with its error
(:attr:`ScheduleRecord.error`), while every other schedule goes on.

Whether a task exists is the one check that needs more than the request (:class:`TaskInfo`): a
task is known when the asking process registered it (``@task`` in a module it imported: the
CLI imports ``SCHEDULER_JOBS``, an instance its jobs, an application its own code) or when an
instance recorded it in ``scheduler_tasks`` at its start. A client in a web application that
never imports the task code therefore needs one instance of the new code started once first.
"""

from __future__ import annotations

import functools
import json
import math
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Any, Literal

from slotcron.errors import InvalidJobError, Refused
from slotcron.jobs.registry import MAX_NAME_LENGTH, MIN_INTERVAL, check_options, name_problem, shown
from slotcron.records import iso
from slotcron.schedule.slots import IntervalSchedule, Schedule, normalise_cron, shared, zone_problem

FIELDS = ("task", "id", "cron", "every", "timezone", "params", "jitter", "paused")
"""What a new schedule may say (the POST body, the client's keywords)."""
CHANGEABLE = ("cron", "every", "timezone", "params", "jitter", "paused")
"""What an update may change (the PATCH body); the id and the task stay."""
MAX_PARAMS_BYTES = 64 * 1024
"""Params as JSON, at most."""
MAX_DIGITS = 64
"""Digits of one number in params, at most: a 5,000-digit integer costs every reader of the row
(Python refuses to read one past 4,300 digits by default)."""
MAX_JITTER = 86_400.0
MIN_EVERY = MIN_INTERVAL
MAX_EVERY = 366 * 86_400.0
MAX_CRON = 200  # as the jobs table's schedule column


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

    def schedule(self) -> Schedule:
        if self.kind == "cron":
            return shared(self.expression, self.timezone)
        return IntervalSchedule(timedelta(seconds=float(self.expression)))

    def timing(self) -> tuple[str, str, str]:
        """What decides the slots: a change of it moves the next slot, nothing else does."""
        return self.kind, self.expression, self.timezone


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


def _refuse(who: str, field: str, problem: str) -> InvalidJobError:
    return InvalidJobError(who, field, problem)


def check_text(who: str, field: str, value: Any, longest: int = MAX_NAME_LENGTH) -> str:
    """A name stored as text: a non-blank string of valid Unicode, no control character (C0,
    DEL, C1; NUL included), at most ``longest`` characters
    (:func:`slotcron.jobs.registry.name_problem`)."""
    problem = name_problem(value, longest)
    if problem is not None:
        raise _refuse(who, field, problem)
    assert isinstance(value, str)
    return value


def new_spec(
    fields: Mapping[str, Any], *, task: TaskInfo | None, default_timezone: str
) -> ScheduleSpec:
    """Check a new schedule's ``fields`` (:data:`FIELDS`; ``task`` required). ``task`` is what
    the writer knows of the named task, None when it knows nothing: refused, naming ``task``."""
    name = check_text("?", "task", fields.get("task"))
    _only(name, fields, FIELDS)
    if task is None:
        raise _refuse(
            name,
            "task",
            "unknown task: no @task of this name is registered here, and no instance has "
            "recorded it (start an instance whose SCHEDULER_JOBS registers it)",
        )
    given_id = fields.get("id")
    # Refusals name the id when one was given, else the task (a generated id means nothing yet).
    who = name if given_id is None else check_text(name, "id", given_id)
    kind, expression = _timing(who, fields.get("cron"), fields.get("every"))
    zone = fields.get("timezone")
    zone = _zone(who, zone if zone is not None else task.timezone or default_timezone)
    params = check_params(who, fields.get("params", {}))
    jitter = _jitter(who, fields.get("jitter"))
    paused = _flag(who, "paused", fields.get("paused", False))
    schedule_id = f"{name}/{uuid.uuid4().hex[:12]}" if given_id is None else who
    if len(schedule_id) > MAX_NAME_LENGTH:
        raise _refuse(
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
    )


def changed_spec(current: ScheduleSpec, changes: Mapping[str, Any]) -> ScheduleSpec:
    """``current`` with ``changes`` (:data:`CHANGEABLE`) applied and checked. Giving ``cron``
    or ``every`` replaces the timing (one of them, as for a new schedule)."""
    who = current.id
    _only(who, changes, CHANGEABLE)
    spec = ScheduleSpec(*(getattr(current, f.name) for f in fields(ScheduleSpec)))
    # What of an unreadable row is not given anew stays unreadable: refused, naming it.
    unread = dict(current.problems) if isinstance(current, UnreadableSpec) else {}
    if changes.get("cron") is not None or changes.get("every") is not None:
        kind, expression = _timing(who, changes.get("cron"), changes.get("every"))
        spec = replace(spec, kind=kind, expression=expression)
        unread.pop("cron", None)
        unread.pop("every", None)
    if changes.get("timezone") is not None:
        spec = replace(spec, timezone=_zone(who, changes["timezone"]))
        unread.pop("timezone", None)
    if "params" in changes:
        spec = replace(spec, params=check_params(who, changes["params"]))
        unread.pop("params", None)
    if "jitter" in changes:
        spec = replace(spec, jitter=_jitter(who, changes["jitter"]))
        unread.pop("jitter", None)
    if changes.get("paused") is not None:
        spec = replace(spec, paused=_flag(who, "paused", changes["paused"]))
    for name, problem in unread.items():
        mend = "give a new one" if name in CHANGEABLE else "remove the schedule and add it again"
        raise _refuse(who, name, f"the stored value cannot be read ({problem}): {mend}")
    return spec


def _only(who: str, fields: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
    for key in fields:
        if key not in allowed:
            raise _refuse(who, str(key)[:100], f"unknown field (accepted: {', '.join(allowed)})")


def _timing(who: str, cron: Any, every: Any) -> tuple[Literal["cron", "interval"], str]:
    if cron is not None and every is not None:
        raise _refuse(who, "cron", "give cron or every, not both")
    if cron is not None:
        if not isinstance(cron, str):
            raise _refuse(who, "cron", f"must be a cron expression string, got {shown(cron)}")
        if len(cron) > MAX_CRON:
            raise _refuse(who, "cron", f"has at most {MAX_CRON} characters, got {len(cron)}")
        try:
            _known_cron(cron)
        except ValueError as exc:
            raise _refuse(who, "cron", str(exc)) from None
        return "cron", cron
    if every is not None:
        if not _finite_number(every):
            raise _refuse(who, "every", f"must be a number of seconds, got {shown(every)}")
        if every <= 0:
            raise _refuse(who, "every", f"must be positive, got {every:g} seconds")
        if not MIN_EVERY <= every <= MAX_EVERY:
            raise _refuse(
                who, "every", f"must be between {MIN_EVERY:g} s and 366 days, got {every:g} s"
            )
        return "interval", f"{float(every):g}"
    raise _refuse(who, "cron", "give cron (an expression) or every (seconds)")


@functools.lru_cache(maxsize=1024)
def _known_cron(expression: str) -> tuple[str, bool]:
    """:func:`normalise_cron`, remembered: a batch of 100,000 schedules has few expressions."""
    return normalise_cron(expression)


def _zone(who: str, zone: Any) -> str:
    problem = zone_problem(zone)
    if problem is not None:
        raise _refuse(who, "timezone", problem)
    assert isinstance(zone, str)
    return zone


def check_params(who: str, params: Any) -> dict[str, Any]:
    """``params`` checked as a schedule's (a JSON object of at most :data:`MAX_PARAMS_BYTES`,
    each number at most :data:`MAX_DIGITS` digits, no NUL), or :class:`InvalidJobError` naming
    ``params``: for whatever else stores params a worker will read (a manual trigger's)."""
    if not isinstance(params, dict):
        raise _refuse(who, "params", f"must be a JSON object, got {type(params).__name__}")
    try:
        text = json.dumps(params, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise _refuse(who, "params", f"must be JSON: {_reason(exc)}") from None
    if "\\u0000" in text:
        raise _refuse(who, "params", "contains a NUL character")
    _load(who, "params", text, MAX_PARAMS_BYTES)  # its size, and each number's digits
    return dict(params)


def _reason(exc: BaseException) -> str:
    """An error's own words, cut short (a message never echoes a long value back)."""
    text = str(exc) if not isinstance(exc, RecursionError) else "nested too deep"
    return text if len(text) <= 200 else text[:197] + "..."


def _jitter(who: str, jitter: Any) -> float | None:
    if jitter is None:
        return None
    if not _finite_number(jitter):
        raise _refuse(who, "jitter", f"must be a number of seconds, got {shown(jitter)}")
    if not 0 <= jitter <= MAX_JITTER:
        raise _refuse(
            who, "jitter", f"must be between 0 and {MAX_JITTER:g} seconds, got {jitter:g}"
        )
    return float(jitter)


def _finite_number(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer past a float's range
        return False


def _flag(who: str, field: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _refuse(who, field, f"must be true or false, got {shown(value)}")
    return value


# JSON as stored: each number at most MAX_DIGITS digits and finite, no NaN or Infinity.


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_DIGITS:
        raise ValueError(f"a number has {len(text.lstrip('-'))} digits; at most {MAX_DIGITS}")
    return int(text)


def _bounded_float(text: str) -> float:
    digits = sum(c.isdigit() for c in text)
    if digits > MAX_DIGITS:
        raise ValueError(f"a number has {digits} digits; at most {MAX_DIGITS}")
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"a number is too large for a float ({len(text)} characters)")
    return value


def _no_constant(text: str) -> Any:
    raise ValueError(f"{text} is not a JSON number")


_PLAIN = json.JSONDecoder(parse_constant=_no_constant)
_EXACT = json.JSONDecoder(
    parse_int=_bounded_int, parse_float=_bounded_float, parse_constant=_no_constant
)
_SUSPECT = re.compile(rf"\d(?:\d{{{MAX_DIGITS}}}|[eE])")
"""A run of more digits than a number may have, or an exponent: only then is each number looked
at (1.4 us a row instead of the 2 us that hooks on every number cost)."""


def _load(who: str, field: str, text: str, limit: int) -> Any:
    """JSON ``text`` of ``field`` decoded, within the limits: at most ``limit`` characters, and
    each number at most :data:`MAX_DIGITS` digits and finite."""
    if len(text) > limit:
        raise _refuse(who, field, f"is {len(text)} bytes as JSON; at most {limit}")
    try:
        return (_EXACT if _SUSPECT.search(text) else _PLAIN).decode(text)
    except (ValueError, RecursionError) as exc:
        raise _refuse(who, field, f"is not JSON within the limits: {_reason(exc)}") from None


def next_slots(record: ScheduleRecord, count: int) -> list[datetime]:
    """The schedule's next ``count`` slots from its stored next slot (none when unreadable)."""
    if record.next_slot is None or record.error is not None:
        return []
    schedule = record.spec.schedule()
    slots = [record.next_slot]
    while len(slots) < count:
        slots.append(schedule.next_after(slots[-1]))
    return slots


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
        "created_at": _iso(record.created_at),
        "updated_at": _iso(record.updated_at),
        "next_slot": _iso(record.next_slot),
    }
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


# Reading a stored row back


def read_row(row: Any) -> ScheduleSpec:
    """The spec of a schedule's stored row (``name``, ``task``, ``kind``, ``schedule``,
    ``timezone``, ``jitter``, ``paused``, and ``params`` and ``options`` as their stored JSON
    text), every field through the checks of a write: an :class:`UnreadableSpec` saying why
    when one fails them (the row is quarantined)."""
    who = str(row.name)
    kind, expression, timezone = row.kind, row.schedule, row.timezone
    # Checked once per timing: the schedules of a burst share a few (each row's own cost is
    # its params, read in 3 us).
    problems = dict(_timing_problems(kind, expression, timezone))
    params: dict[str, Any] = {}
    jitter: float | None = row.jitter
    try:
        params = _stored_params(who, row.params)
    except InvalidJobError as exc:
        problems["params"] = exc.problem
    if jitter is not None:
        try:
            jitter = _jitter(who, jitter)
        except InvalidJobError as exc:
            problems["jitter"] = exc.problem
            jitter = None
    try:
        stored_options(who, row.options)
    except InvalidJobError as exc:
        problems["options"] = exc.problem
    shape: Literal["cron", "interval"] = "interval" if kind == "interval" else "cron"
    values = (
        who,
        str(row.task),
        shape,
        expression if isinstance(expression, str) else "",
        timezone if isinstance(timezone, str) else "",
        params,
        jitter,
        bool(getattr(row, "paused", False)),  # not read by the firing: its claims do
    )
    if problems:
        return UnreadableSpec(*values, problems=problems)
    return ScheduleSpec(*values)


@functools.lru_cache(maxsize=4096)
def _timing_problems(kind: Any, expression: Any, timezone: Any) -> tuple[tuple[str, str], ...]:
    """What is wrong with a stored timing, by field (nothing: empty)."""
    problems: list[tuple[str, str]] = []
    try:
        if kind == "cron":
            _timing("?", expression, None)
        elif kind == "interval":
            _timing("?", None, _stored_every("?", expression))
        else:
            raise _refuse("?", "cron", f"unknown kind {shown(kind)} (cron or interval)")
    except InvalidJobError as exc:
        problems.append((exc.field, exc.problem))
    problem = zone_problem(timezone)
    if problem is not None:
        problems.append(("timezone", problem))
    return tuple(problems)


def _stored_every(who: str, expression: Any) -> float:
    try:
        return float(expression)
    except (TypeError, ValueError):
        raise _refuse(who, "every", f"{shown(expression)} is not a number of seconds") from None


def _stored_params(who: str, stored: Any) -> dict[str, Any]:
    params = _decoded(who, "params", stored, MAX_PARAMS_BYTES)
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise _refuse(who, "params", f"must be a JSON object, got {type(params).__name__}")
    return params


MAX_OPTIONS_BYTES = 64 * 1024


def stored_options(who: str, stored: Any) -> Mapping[str, Any]:
    """The task's options stored with a schedule's row (its JSON text), checked as a decorator
    checks them (:func:`slotcron.jobs.registry.check_options`). Read once per distinct text: a
    task's
    schedules share it. The mapping returned is shared: read it, never change it."""
    try:
        if isinstance(stored, str):
            return _options_of(stored)
        return _checked_options(_decoded(who, "options", stored, MAX_OPTIONS_BYTES))
    except InvalidJobError as exc:
        field = "" if exc.field == "options" else f"{exc.field}: "
        raise _refuse(who, "options", field + exc.problem) from None


@functools.lru_cache(maxsize=256)
def _options_of(text: str) -> Mapping[str, Any]:
    return MappingProxyType(dict(_checked_options(_load("?", "options", text, MAX_OPTIONS_BYTES))))


def _checked_options(options: Any) -> Mapping[str, Any]:
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise _refuse("?", "options", f"must be a JSON object, got {type(options).__name__}")
    return check_options("?", options)


def _decoded(who: str, field: str, stored: Any, limit: int) -> Any:
    """A JSON column's value as stored: its text decoded within the limits (a driver that
    decoded it already gives the value)."""
    if isinstance(stored, bytes | bytearray):
        try:
            stored = bytes(stored).decode("utf-8")
        except UnicodeDecodeError:
            raise _refuse(who, field, "is not UTF-8 text") from None
    return _load(who, field, stored, limit) if isinstance(stored, str) else stored
