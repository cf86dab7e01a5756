"""What a job's name and options may be: the checks every decorator and every stored row of a
runtime schedule go through, each refusal an :class:`InvalidJobError` naming the field."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from slotcron.errors import InvalidJobError
from slotcron.jobs.calendars import check_calendar, check_exclude_dates
from slotcron.jobs.windows import check_max_runs, check_moment

MAX_NAME_LENGTH = 200
MIN_INTERVAL = 1.0
"""Seconds: the shortest interval of an ``@every`` job or a runtime schedule (a paused schedule of
a millisecond wrote 330 SKIPPED rows a second)."""
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
"""Control characters (C0, DEL, C1): never in a name or an id, which reach log lines, terminals
and URLs."""
OVERLAP = ("forbid", "allow")
MISFIRE = ("skip", "once", "all")


def name_problem(name: object, longest: int = MAX_NAME_LENGTH) -> str | None:
    """Why ``name`` cannot name a job, a task or a schedule (None when it can): a non-blank
    string of valid Unicode, at most ``longest`` characters, without control characters."""
    if not isinstance(name, str) or not name.strip():
        return f"must be a non-empty string, got {shown(name)}"
    if len(name) > longest:
        return f"has at most {longest} characters, got {len(name)}"
    found = CONTROL.search(name)
    if found is not None:
        return f"holds a control character ({found.group()!r} at {found.start()})"
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid Unicode (a lone surrogate)"
    return None


MAX_JSON_DEPTH = 31
"""Levels of nesting (objects and arrays) in a stored JSON value: MariaDB's JSON check refuses
32 (error 4025), so every backend is held to what all of them store."""


def json_problem(value: Any) -> str | None:
    """What no backend stores as given in a JSON value (None when all do): nesting past
    :data:`MAX_JSON_DEPTH`, a NUL character (PostgreSQL), a lone surrogate (MariaDB)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > MAX_JSON_DEPTH:
                return f"is nested deeper than {MAX_JSON_DEPTH} levels"
            inner = list(item.values()) if isinstance(item, dict) else item
            texts = [k for k in item if isinstance(k, str)] if isinstance(item, dict) else []
            stack.extend((v, depth + 1) for v in inner)
            stack.extend((k, depth) for k in texts)
        elif isinstance(item, str):
            if "\x00" in item:
                return "contains a NUL character"
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return "contains a lone surrogate (not valid Unicode)"
    return None


def shown(value: object) -> str:
    """``value`` fit for a message: its repr (control characters escaped), cut short; an
    integer too long to write out (past Python's digit limit) is named, not written."""
    try:
        text = repr(value)
    except ValueError:
        return f"a {type(value).__name__} too long to show"
    return text if len(text) <= 60 else text[:57] + "..."


def _check_number(name: str, option: str, value: Any, *, minimum: float, strict: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        raise InvalidJobError(name, option, f"must be a number of seconds, got {shown(value)}")
    if value < minimum or (strict and value == minimum):
        relation = "greater than" if strict else "at least"
        raise InvalidJobError(name, option, f"must be {relation} {minimum:g}, got {value!r}")
    return float(value)


def _seconds(minimum: float, strict: bool, *, optional: bool = False) -> Callable[..., Any]:
    def check(name: str, option: str, value: Any) -> float | None:
        if optional and value is None:
            return None
        return _check_number(name, option, value, minimum=minimum, strict=strict)

    return check


def _one_of(allowed: tuple[str, ...]) -> Callable[..., Any]:
    def check(name: str, option: str, value: Any) -> str:
        if value not in allowed:
            raise InvalidJobError(name, option, f"must be one of {allowed}, got {shown(value)}")
        return str(value)

    return check


def _attempts(name: str, option: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidJobError(
            name, option, f"must be a whole number of at least 1, got {shown(value)}"
        )
    return value


def _flag(name: str, option: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidJobError(name, option, f"must be True or False, got {shown(value)}")
    return value


_OPTION_CHECKS: dict[str, Callable[[str, str, Any], Any]] = {
    "overlap": _one_of(OVERLAP),
    "misfire": _one_of(MISFIRE),
    "catchup_window": _seconds(0, strict=False),
    "lease": _seconds(0, strict=True, optional=True),
    "timeout": _seconds(0, strict=True, optional=True),
    "max_attempts": _attempts,
    "retry_backoff": _seconds(0, strict=False),
    "jitter": _seconds(0, strict=False),
    "restartable": _flag,
    "enabled": _flag,
    "alert": _flag,
    "calendar": check_calendar,
    "exclude_dates": check_exclude_dates,
    "start_at": check_moment,
    "end_at": check_moment,
    "max_runs": check_max_runs,
}
"""Each option of :meth:`Job.options` and its check."""


def check_options(job: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """The options among ``options`` that a job has (:meth:`Job.options`), checked: a decorator's,
    or those stored with a runtime schedule's row, which a writer outside this code may have
    changed. Other keys are left out. Raises :class:`InvalidJobError` naming the option."""
    return {
        option: check(job, option, options[option])
        for option, check in _OPTION_CHECKS.items()
        if option in options
    }
