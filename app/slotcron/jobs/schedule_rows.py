"""A schedule's stored row read back through the checks of a write (:func:`read_row`): a row
that a writer outside slotcron changed (SQL, an older release, a client that lifted Python's
digit limit) and that no write would accept is *unreadable*: quarantined, never fired, and listed
with its error, while every other schedule goes on."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Literal

from slotcron.errors import InvalidJobError
from slotcron.jobs.checks import check_options, shown
from slotcron.jobs.schedule_fields import (
    MAX_PARAMS_BYTES,
    check_jitter,
    check_timing,
    load_json,
    refuse,
)
from slotcron.jobs.schedules import ScheduleSpec, UnreadableSpec
from slotcron.schedule.slots import zone_problem


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
            jitter = check_jitter(who, jitter)
        except InvalidJobError as exc:
            problems["jitter"] = exc.problem
            jitter = None
    bounds: dict[str, Any] = {}
    try:
        bounds = _bounds(stored_options(who, row.options))
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
        return UnreadableSpec(*values, bounds=bounds, problems=problems)
    return ScheduleSpec(*values, bounds=bounds)


def _bounds(options: Mapping[str, Any]) -> dict[str, Any]:
    """A schedule's :data:`slotcron.jobs.schedules.BOUNDS` in their stored form, from its
    options as checked (dates and times typed)."""
    return _stored_bounds(
        options.get("calendar"),
        tuple(sorted(options.get("exclude_dates") or ())),
        options.get("start_at"),
        options.get("end_at"),
        options.get("max_runs"),
    )


@functools.lru_cache(maxsize=1024)
def _stored_bounds(
    calendar: Any, days: tuple[Any, ...], start: Any, end: Any, max_runs: Any
) -> dict[str, Any]:
    """Shared by the schedules that have the same (a task's): read it, never change it."""
    return {
        "calendar": calendar,
        "exclude_dates": [day.isoformat() for day in days],
        "start_at": None if start is None else start.isoformat(),
        "end_at": None if end is None else end.isoformat(),
        "max_runs": max_runs,
    }


@functools.lru_cache(maxsize=4096)
def _timing_problems(kind: Any, expression: Any, timezone: Any) -> tuple[tuple[str, str], ...]:
    """What is wrong with a stored timing, by field (nothing: empty)."""
    problems: list[tuple[str, str]] = []
    try:
        if kind == "cron":
            check_timing("?", expression, None)
        elif kind == "interval":
            check_timing("?", None, _stored_every("?", expression))
        else:
            raise refuse("?", "cron", f"unknown kind {shown(kind)} (cron or interval)")
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
        raise refuse(who, "every", f"{shown(expression)} is not a number of seconds") from None


def _stored_params(who: str, stored: Any) -> dict[str, Any]:
    params = _decoded(who, "params", stored, MAX_PARAMS_BYTES)
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise refuse(who, "params", f"must be a JSON object, got {type(params).__name__}")
    return params


MAX_OPTIONS_BYTES = 64 * 1024


def stored_options(who: str, stored: Any) -> Mapping[str, Any]:
    """The task's options stored with a schedule's row (its JSON text), checked as a decorator
    checks them (:func:`slotcron.jobs.checks.check_options`). Read once per distinct text: a
    task's
    schedules share it. The mapping returned is shared: read it, never change it."""
    try:
        if isinstance(stored, str):
            return _options_of(stored)
        return _checked_options(_decoded(who, "options", stored, MAX_OPTIONS_BYTES))
    except InvalidJobError as exc:
        field = "" if exc.field == "options" else f"{exc.field}: "
        raise refuse(who, "options", field + exc.problem) from None


@functools.lru_cache(maxsize=256)
def _options_of(text: str) -> Mapping[str, Any]:
    return MappingProxyType(
        dict(_checked_options(load_json("?", "options", text, MAX_OPTIONS_BYTES)))
    )


def _checked_options(options: Any) -> Mapping[str, Any]:
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise refuse("?", "options", f"must be a JSON object, got {type(options).__name__}")
    return check_options("?", options)


def _decoded(who: str, field: str, stored: Any, limit: int) -> Any:
    """A JSON column's value as stored: its text decoded within the limits (a driver that
    decoded it already gives the value)."""
    if isinstance(stored, bytes | bytearray):
        try:
            stored = bytes(stored).decode("utf-8")
        except UnicodeDecodeError:
            raise refuse(who, field, "is not UTF-8 text") from None
    return load_json(who, field, stored, limit) if isinstance(stored, str) else stored
