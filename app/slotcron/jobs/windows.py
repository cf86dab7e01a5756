"""A schedule's window: ``start_at``, ``end_at`` and ``max_runs`` on ``@cron``/``@every``/``@task``.

Outside the window no slot runs and none is recorded: the job's schedule is
:class:`slotcron.schedule.slots.Windowed`, whose first slot is the first at or after
``start_at`` and which has none at or after ``end_at`` (its next slot is then
:data:`slotcron.schedule.slots.NEVER`, and the planner drops the job). ``max_runs`` bounds its
completed runs across the cluster, exactly (:mod:`slotcron.store.counted`): once they are done,
its claims are refused and the planner drops it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from slotcron.errors import InvalidJobError
from slotcron.schedule.slots import NEVER


def check_moment(job: str, option: str, value: Any) -> datetime | None:
    """An aware ``datetime`` or an ISO-8601 text with its offset (``Z`` for UTC), as aware UTC.
    A time without a zone is refused: which zone was meant is not ours to guess."""
    if value is None:
        return None
    moment = value
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            raise InvalidJobError(job, option, f"{value!r} is not an ISO-8601 time"[:200]) from None
    if not isinstance(moment, datetime):
        raise InvalidJobError(job, option, f"must be a datetime, got {value!r}"[:200])
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise InvalidJobError(
            job, option, f"{moment.isoformat()} has no time zone: give one (e.g. +00:00, Z)"
        )
    moment = moment.astimezone(UTC)
    if moment >= NEVER:
        raise InvalidJobError(job, option, f"must be before {NEVER.date().isoformat()}")
    return moment


def stored_moment(value: Any) -> datetime | None:
    """A window bound as stored (ISO-8601 text, written by :func:`check_moment`'s caller), or
    None."""
    return datetime.fromisoformat(value) if isinstance(value, str) and value else None


MAX_RUNS = 2**62
"""The largest ``max_runs`` (a count every database stores exactly)."""


def check_max_runs(job: str, option: str, value: Any) -> int | None:
    """A whole number of completed runs, at least 1; None for no bound."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidJobError(job, option, f"must be a whole number, got {value!r}"[:200])
    if not 1 <= value <= MAX_RUNS:
        raise InvalidJobError(job, option, f"must be between 1 and {MAX_RUNS}, got {value}")
    return value


def check_window(job: str, start: datetime | None, end: datetime | None) -> None:
    if start is not None and end is not None and end <= start:
        raise InvalidJobError(
            job, "end_at", f"{end.isoformat()} is not after start_at ({start.isoformat()})"
        )
