"""A runtime schedule as callers ask for it: checked in this one place for the CLI, the HTTP API
and :class:`app.Client`, and shown in one JSON shape (CONTRACT.md, "Schedules at runtime").

Every refusal is an :class:`InvalidJobError` naming the field (``task``, ``id``, ``cron``,
``every``, ``timezone``, ``params``, ``jitter``, ``paused``): the CLI exits 2 with it, the API
answers 400 with it, the client raises it. Nothing is written before these checks pass.

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
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from app.errors import InvalidJobError
from app.records import iso
from app.registry import MAX_NAME_LENGTH
from app.slots import IntervalSchedule, Schedule, normalise_cron, shared

FIELDS = ("task", "id", "cron", "every", "timezone", "params", "jitter", "paused")
"""What a new schedule may say (the POST body, the client's keywords)."""
CHANGEABLE = ("cron", "every", "timezone", "params", "jitter", "paused")
"""What an update may change (the PATCH body); the id and the task stay."""
MAX_PARAMS_BYTES = 64 * 1024
MAX_JITTER = 86_400.0
MIN_EVERY = 0.001
MAX_EVERY = 366 * 86_400.0
MAX_CRON = 200  # as the jobs table's schedule column


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
class ScheduleRecord:
    """A stored schedule."""

    spec: ScheduleSpec
    created_at: datetime
    updated_at: datetime
    next_slot: datetime | None


def _refuse(who: str, field: str, problem: str) -> InvalidJobError:
    return InvalidJobError(who, field, problem)


def check_text(who: str, field: str, value: Any, longest: int = MAX_NAME_LENGTH) -> str:
    """A name stored as text: a non-empty string of valid Unicode, no NUL, at most ``longest``."""
    if not isinstance(value, str) or not value.strip():
        raise _refuse(who, field, f"must be a non-empty string, got {value!r}")
    if "\x00" in value:
        raise _refuse(who, field, "contains a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _refuse(who, field, "is not valid Unicode (a lone surrogate)") from None
    if len(value) > longest:
        raise _refuse(who, field, f"has at most {longest} characters, got {len(value)}")
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
    params = _params(who, fields.get("params", {}))
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
    spec = current
    if changes.get("cron") is not None or changes.get("every") is not None:
        kind, expression = _timing(who, changes.get("cron"), changes.get("every"))
        spec = replace(spec, kind=kind, expression=expression)
    if changes.get("timezone") is not None:
        spec = replace(spec, timezone=_zone(who, changes["timezone"]))
    if "params" in changes:
        spec = replace(spec, params=_params(who, changes["params"]))
    if "jitter" in changes:
        spec = replace(spec, jitter=_jitter(who, changes["jitter"]))
    if changes.get("paused") is not None:
        spec = replace(spec, paused=_flag(who, "paused", changes["paused"]))
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
            raise _refuse(who, "cron", f"must be a cron expression string, got {cron!r}")
        if len(cron) > MAX_CRON:
            raise _refuse(who, "cron", f"has at most {MAX_CRON} characters, got {len(cron)}")
        try:
            _known_cron(cron)
        except ValueError as exc:
            raise _refuse(who, "cron", str(exc)) from None
        return "cron", cron
    if every is not None:
        if not _finite_number(every):
            raise _refuse(who, "every", f"must be a number of seconds, got {every!r}")
        if every <= 0:
            raise _refuse(who, "every", f"must be positive, got {every:g} seconds")
        if not MIN_EVERY <= every <= MAX_EVERY:
            raise _refuse(who, "every", f"must be between 1 ms and 366 days, got {every:g} s")
        return "interval", f"{float(every):g}"
    raise _refuse(who, "cron", "give cron (an expression) or every (seconds)")


@functools.lru_cache(maxsize=1024)
def _known_cron(expression: str) -> tuple[str, bool]:
    """:func:`normalise_cron`, remembered: a batch of 100,000 schedules has few expressions."""
    return normalise_cron(expression)


def _zone(who: str, zone: Any) -> str:
    if not isinstance(zone, str) or len(zone) > 64:
        raise _refuse(who, "timezone", f"must be an IANA time zone name, got {zone!r}")
    try:
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise _refuse(who, "timezone", f"unknown IANA time zone {zone!r}") from None
    return zone


def _params(who: str, params: Any) -> dict[str, Any]:
    if not isinstance(params, dict):
        raise _refuse(who, "params", f"must be a JSON object, got {type(params).__name__}")
    try:
        text = json.dumps(params, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise _refuse(who, "params", f"must be JSON: {exc}") from None
    if "\\u0000" in text:
        raise _refuse(who, "params", "contains a NUL character")
    if len(text) > MAX_PARAMS_BYTES:
        raise _refuse(who, "params", f"is {len(text)} bytes as JSON; at most {MAX_PARAMS_BYTES}")
    return dict(params)


def _jitter(who: str, jitter: Any) -> float | None:
    if jitter is None:
        return None
    if not _finite_number(jitter):
        raise _refuse(who, "jitter", f"must be a number of seconds, got {jitter!r}")
    if not 0 <= jitter <= MAX_JITTER:
        raise _refuse(
            who, "jitter", f"must be between 0 and {MAX_JITTER:g} seconds, got {jitter:g}"
        )
    return float(jitter)


def _finite_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


def _flag(who: str, field: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _refuse(who, field, f"must be true or false, got {value!r}")
    return value


def next_slots(record: ScheduleRecord, count: int) -> list[datetime]:
    """The schedule's next ``count`` slots from its stored next slot."""
    if record.next_slot is None:
        return []
    schedule = record.spec.schedule()
    slots = [record.next_slot]
    while len(slots) < count:
        slots.append(schedule.next_after(slots[-1]))
    return slots


_iso = functools.lru_cache(maxsize=1024)(iso)
"""A batch's schedules share their timestamps: each is written out once."""


def schedule_json(record: ScheduleRecord) -> dict[str, Any]:
    """The one JSON shape of a schedule (``--json``, the API, the client's dicts)."""
    spec = record.spec
    every = float(spec.expression) if spec.kind == "interval" else None
    return {
        "id": spec.id,
        "task": spec.task,
        "cron": spec.expression if spec.kind == "cron" else None,
        "every": int(every) if every is not None and every.is_integer() else every,
        "timezone": spec.timezone,
        "params": spec.params,
        "jitter": spec.jitter,
        "paused": spec.paused,
        "created_at": _iso(record.created_at),
        "updated_at": _iso(record.updated_at),
        "next_slot": _iso(record.next_slot),
    }
