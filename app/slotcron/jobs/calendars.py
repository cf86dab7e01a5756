"""Days a job does not run: ``calendar="holidays:US"`` (a country's public holidays, optionally a
subdivision's: ``holidays:US-NY``, from the ``holidays`` library) and ``exclude_dates=[...]``.

A slot is excluded when its day, in the job's time zone, is one of them: the claim records it
``SKIPPED`` with the reason (``holiday: Thanksgiving Day``, ``excluded date: 2026-12-24``),
whichever instance claims it (:func:`slotcron.store.claims.judge`). The slots themselves do not
change: an excluded slot is decided and recorded, never silently dropped (guarantee 2).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from datetime import date, datetime
from typing import Any, Protocol
from zoneinfo import ZoneInfo

from slotcron.errors import InvalidJobError

PREFIX = "holidays:"
MAX_EXCLUDED = 10_000
"""Dates one job may exclude (each is checked at every claim's day lookup: a set)."""


class Excluding(Protocol):
    """What :func:`excluded` reads of a job."""

    @property
    def calendar(self) -> str | None: ...

    @property
    def exclude_dates(self) -> frozenset[date]: ...


def excluded(job: Excluding, slot: datetime, zone: str) -> str | None:
    """Why ``slot`` of ``job`` is not run (its day in ``zone`` is excluded), or None."""
    if job.calendar is None and not job.exclude_dates:
        return None
    day = slot.astimezone(ZoneInfo(zone)).date()
    if day in job.exclude_dates:
        return f"excluded date: {day.isoformat()}"
    if job.calendar is not None:
        name = _holidays(job.calendar).get(day)
        if name:
            return f"holiday: {name}"
    return None


def check_calendar(job: str, option: str, value: Any) -> str | None:
    """``holidays:CC`` or ``holidays:CC-SUBDIVISION``, both known to the ``holidays`` library."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.startswith(PREFIX) or len(value) > 64:
        raise InvalidJobError(
            job,
            option,
            f"must be 'holidays:<country>' or 'holidays:<country>-<subdivision>', got {value!r}"[
                :200
            ],
        )
    import holidays

    country, subdivision = _parts(value)
    supported = holidays.list_supported_countries()
    if country not in supported:
        raise InvalidJobError(
            job,
            option,
            f"{country!r} is not a country the holidays library knows (ISO 3166 "
            "alpha-2 codes, e.g. US, GB, DE)",
        )
    if subdivision and subdivision not in supported[country]:
        raise InvalidJobError(
            job,
            option,
            f"{subdivision!r} is not a subdivision of {country} the holidays "
            f"library knows ({', '.join(supported[country][:12])}, ...)",
        )
    return value


NO_DATES: frozenset[date] = frozenset()
"""Shared by every job that excludes no date: an empty frozenset is 216 bytes, not a singleton
(2 MB over 10,000 jobs)."""


def check_exclude_dates(job: str, option: str, value: Any) -> frozenset[date]:
    """Dates (``datetime.date`` or ``YYYY-MM-DD``), at most :data:`MAX_EXCLUDED`."""
    if value is None:
        return NO_DATES
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise InvalidJobError(job, option, f"must be a list of dates, got {value!r}"[:200])
    days: set[date] = set()
    for item in value:
        if isinstance(item, datetime):
            raise InvalidJobError(job, option, f"takes dates, not times: got {item.isoformat()}")
        try:
            days.add(item if isinstance(item, date) else date.fromisoformat(item))
        except (TypeError, ValueError):
            raise InvalidJobError(
                job, option, f"{item!r} is not a date (YYYY-MM-DD)"[:200]
            ) from None
        if len(days) > MAX_EXCLUDED:
            raise InvalidJobError(job, option, f"holds more than {MAX_EXCLUDED} dates")
    return frozenset(days) if days else NO_DATES


@functools.lru_cache(maxsize=64)
def _holidays(calendar: str) -> Any:
    import holidays

    country, subdivision = _parts(calendar)
    return holidays.country_holidays(country, subdiv=subdivision or None)


def _parts(calendar: str) -> tuple[str, str]:
    """``holidays:US-NY`` as ``("US", "NY")`` (``""``: no subdivision)."""
    country, _, subdivision = calendar.removeprefix(PREFIX).partition("-")
    return country, subdivision
