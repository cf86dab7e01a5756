"""The checks of a runtime schedule's fields, one by one: each refusal an
:class:`InvalidJobError` naming the field (docs/how-to/runtime-schedules.md), and JSON decoded
within its limits (a number's digits, a text's length)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any, Literal

from slotcron.errors import InvalidJobError
from slotcron.jobs.checks import MAX_NAME_LENGTH, MIN_INTERVAL, json_problem, name_problem, shown
from slotcron.schedule.slots import normalise_cron, zone_problem

MAX_PARAMS_BYTES = 64 * 1024
"""Params as JSON, at most."""

MAX_DIGITS = 64
"""Digits of one number in params, at most: a 5,000-digit integer costs every reader of the row
(Python refuses to read one past 4,300 digits by default)."""

MAX_JITTER = 86_400.0

MIN_EVERY = MIN_INTERVAL

MAX_EVERY = 366 * 86_400.0

MAX_CRON = 200  # as the jobs table's schedule column


def refuse(who: str, field: str, problem: str) -> InvalidJobError:
    return InvalidJobError(who, field, problem)


def check_text(who: str, field: str, value: Any, longest: int = MAX_NAME_LENGTH) -> str:
    """A name stored as text: a non-blank string of valid Unicode, no control character (C0,
    DEL, C1; NUL included), at most ``longest`` characters
    (:func:`slotcron.jobs.checks.name_problem`)."""
    problem = name_problem(value, longest)
    if problem is not None:
        raise refuse(who, field, problem)
    assert isinstance(value, str)
    return value


def check_only(who: str, fields: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
    for key in fields:
        if key not in allowed:
            raise refuse(who, str(key)[:100], f"unknown field (accepted: {', '.join(allowed)})")


def check_timing(who: str, cron: Any, every: Any) -> tuple[Literal["cron", "interval"], str]:
    if cron is not None and every is not None:
        raise refuse(who, "cron", "give cron or every, not both")
    if cron is not None:
        if not isinstance(cron, str):
            raise refuse(who, "cron", f"must be a cron expression string, got {shown(cron)}")
        if len(cron) > MAX_CRON:
            raise refuse(who, "cron", f"has at most {MAX_CRON} characters, got {len(cron)}")
        try:
            normalise_cron(cron)
        except ValueError as exc:
            raise refuse(who, "cron", str(exc)) from None
        return "cron", cron
    if every is not None:
        if not finite_number(every):
            raise refuse(who, "every", f"must be a number of seconds, got {shown(every)}")
        if every <= 0:
            raise refuse(who, "every", f"must be positive, got {every:g} seconds")
        if not MIN_EVERY <= every <= MAX_EVERY:
            raise refuse(
                who, "every", f"must be between {MIN_EVERY:g} s and 366 days, got {every:g} s"
            )
        return "interval", f"{float(every):g}"
    raise refuse(who, "cron", "give cron (an expression) or every (seconds)")


def check_zone(who: str, zone: Any) -> str:
    problem = zone_problem(zone)
    if problem is not None:
        raise refuse(who, "timezone", problem)
    assert isinstance(zone, str)
    return zone


def check_params(who: str, params: Any) -> dict[str, Any]:
    """``params`` checked as a schedule's (a JSON object of at most :data:`MAX_PARAMS_BYTES`,
    each number at most :data:`MAX_DIGITS` digits, no NUL), or :class:`InvalidJobError` naming
    ``params``: for whatever else stores params a worker will read (a manual trigger's)."""
    if not isinstance(params, dict):
        raise refuse(who, "params", f"must be a JSON object, got {type(params).__name__}")
    try:
        text = json.dumps(params, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise refuse(who, "params", f"must be JSON: {reason(exc)}") from None
    problem = json_problem(params)
    if problem is not None:
        raise refuse(who, "params", problem)
    load_json(who, "params", text, MAX_PARAMS_BYTES)  # its size, and each number's digits
    return dict(params)


def reason(exc: BaseException) -> str:
    """An error's own words, cut short (a message never echoes a long value back)."""
    text = str(exc) if not isinstance(exc, RecursionError) else "nested too deep"
    return text if len(text) <= 200 else text[:197] + "..."


def check_jitter(who: str, jitter: Any) -> float | None:
    if jitter is None:
        return None
    if not finite_number(jitter):
        raise refuse(who, "jitter", f"must be a number of seconds, got {shown(jitter)}")
    if not 0 <= jitter <= MAX_JITTER:
        raise refuse(who, "jitter", f"must be between 0 and {MAX_JITTER:g} seconds, got {jitter:g}")
    return float(jitter)


def finite_number(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer past a float's range
        return False


def check_flag(who: str, field: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise refuse(who, field, f"must be true or false, got {shown(value)}")
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


def load_json(who: str, field: str, text: str, limit: int) -> Any:
    """JSON ``text`` of ``field`` decoded, within the limits: at most ``limit`` characters, and
    each number at most :data:`MAX_DIGITS` digits and finite."""
    if len(text) > limit:
        raise refuse(who, field, f"is {len(text)} bytes as JSON; at most {limit}")
    try:
        return (_EXACT if _SUSPECT.search(text) else _PLAIN).decode(text)
    except (ValueError, RecursionError) as exc:
        raise refuse(who, field, f"is not JSON within the limits: {reason(exc)}") from None
