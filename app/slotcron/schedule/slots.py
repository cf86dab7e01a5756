"""Slot computation: the instants at which a job is due, as aware UTC datetimes.

Cron expressions are evaluated on naive *wall-clock* times of the job's time zone (six fields
by :mod:`slotcron.schedule.springcron`, with Spring's meaning; five by croniter, classic cron), and
each wall
time is then placed on the UTC line by us, not by croniter (croniter 7 returns a fall-back wall
time twice). The contract's DST rules follow from that, for every form (``L``, ``W``, ``#``):

- a wall time that occurs twice (fall-back) is one slot, at its first occurrence;
- a wall time that does not exist (spring-forward gap) is one slot, at the transition instant;
  several skipped wall times of one gap collapse into that one slot.

Interval schedules are aligned to the Unix epoch: slot ``k`` is ``epoch + k * interval``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from croniter import croniter

from slotcron.schedule.springcron import CronFieldError, SpringCron

ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MAX_ZONE_LENGTH = 64  # as the tables' timezone columns
MACHINE_ZONES = frozenset({"localtime", "posixrules"})
"""Files some systems keep beside the zones: their rules are the machine's, not a zone's (two
instances would place a schedule's slots differently)."""


class Schedule(Protocol):
    """What the scheduler needs of a schedule."""

    def next_after(self, moment: datetime) -> datetime:
        """The first slot strictly after ``moment`` (aware), as aware UTC."""
        ...

    def describe(self) -> str: ...


def zone_problem(name: object) -> str | None:
    """Why ``name`` is not an IANA time zone, or None when it is one (a key of the zone database
    that loads). A directory of the database ("America"), an empty name, a path or a file that
    is not a zone is not one; the answer never shows where the database is installed."""
    if not isinstance(name, str) or not name or len(name) > MAX_ZONE_LENGTH:
        shown = repr(name)[:MAX_ZONE_LENGTH]
        return f"must be an IANA time zone name of 1 to {MAX_ZONE_LENGTH} characters, got {shown}"
    if name not in _zone_names():
        return f"unknown IANA time zone {name!r}"
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        return f"IANA time zone {name!r} cannot be read here"
    return None


@functools.lru_cache(maxsize=1)
def _zone_names() -> frozenset[str]:
    """The zones of this process's zone database (the system's, else the ``tzdata`` package's),
    read once: 20 ms."""
    return frozenset(available_timezones()) - MACHINE_ZONES


@functools.lru_cache(maxsize=1024)
def normalise_cron(expression: str) -> tuple[str, bool]:
    """Return ``(expression, seconds_first)``; raise ``ValueError`` if it is not a valid cron.

    Five fields have minute precision; six fields put SECONDS FIRST (Spring/Quartz order).
    Remembered: 100,000 runtime schedules, or 5,000 code jobs, have few expressions, and
    checking one with croniter takes about 0.3 ms (1.7 s of a 5,000 jobs' start-up).
    """
    text = " ".join(expression.split())
    text = ALIASES.get(text.lower(), text)
    if text.startswith("@"):
        raise ValueError(f"unknown alias {expression!r} (known: {', '.join(ALIASES)})")
    fields = text.split(" ")
    if len(fields) not in (5, 6):
        raise ValueError(
            f"{expression!r} has {len(fields)} fields; expected 5 (minute hour day month weekday) "
            "or 6 (second minute hour day month weekday)"
        )
    seconds_first = len(fields) == 6
    if seconds_first:  # Spring's meaning, not croniter's: see slotcron.schedule.springcron
        try:
            SpringCron.parse(text)
        except CronFieldError as exc:
            raise ValueError(f"invalid cron expression {expression!r}: {exc}") from None
        return text, seconds_first
    try:
        croniter(text, datetime(2000, 1, 1), second_at_beginning=seconds_first)
        # Some impossible expressions (30 February) only fail when iterated.
        croniter(text, datetime(2000, 1, 1), second_at_beginning=seconds_first).get_next(datetime)
    except Exception as exc:  # croniter raises several unrelated types for bad input
        raise ValueError(f"invalid cron expression {expression!r}: {exc}") from None
    return text, seconds_first


@dataclass(frozen=True)
class CronSchedule:
    expression: str
    timezone: str

    def __post_init__(self) -> None:
        text, seconds_first = normalise_cron(self.expression)
        object.__setattr__(self, "_text", text)
        object.__setattr__(self, "_seconds_first", seconds_first)
        object.__setattr__(self, "_zone", ZoneInfo(self.timezone))
        # Parsing the expression is most of croniter's cost: parse once, reposition per call.
        object.__setattr__(self, "_walls", _wall_times(text, seconds_first))
        object.__setattr__(self, "_memo", {})

    def describe(self) -> str:
        return self.expression

    def next_after(self, moment: datetime) -> datetime:
        # Jobs sharing an expression share this object (:func:`shared`), and firing asks for
        # the same successor several times: remember the last few answers.
        memo: dict[datetime, datetime] = self._memo  # type: ignore[attr-defined]
        found = memo.get(moment)
        if found is None:
            if len(memo) >= _MEMO_SIZE:
                memo.clear()
            found = memo[moment] = next(self._slots_after(moment))
        return found

    def _slots_after(self, moment: datetime) -> Iterator[datetime]:
        zone: ZoneInfo = self._zone  # type: ignore[attr-defined]
        moment = moment.astimezone(UTC)
        # Starting at the wall time of ``moment`` misses nothing: an earlier wall time could only
        # map after ``moment`` as a second occurrence, which the fall-back rule excludes. In the
        # second pass of a fall-back hour, candidates map to the first pass and are filtered.
        wall = moment.astimezone(zone).replace(tzinfo=None, microsecond=0)
        for candidate in self._walls(wall):  # type: ignore[attr-defined]
            slot = wall_to_utc(candidate, zone)
            if slot > moment:
                yield slot


def _wall_times(text: str, seconds_first: bool) -> Callable[[datetime], Iterator[datetime]]:
    """The wall times strictly after a wall time: Spring's meaning for six fields, croniter's
    (classic cron: either day field matches) for five."""
    if seconds_first:
        return SpringCron.parse(text).walls_after
    cron = croniter(text, datetime(2000, 1, 1))

    def walls_after(wall: datetime) -> Iterator[datetime]:
        cron.set_current(wall, force=True)
        while True:
            yield cron.get_next(datetime)

    return walls_after


_MEMO_SIZE = 64


@functools.lru_cache(maxsize=4096)
def shared(expression: str, timezone: str) -> CronSchedule:
    """One schedule object per (expression, zone): ten thousand jobs on ``0 * * * *`` parse
    the expression once and compute each slot once."""
    return CronSchedule(expression, timezone)


def wall_to_utc(wall: datetime, zone: ZoneInfo) -> datetime:
    """Place a naive wall time of ``zone`` on the UTC line by the contract's DST rules."""
    first = wall.replace(tzinfo=zone, fold=0)
    utc_first = first.astimezone(UTC)
    if utc_first.astimezone(zone).replace(tzinfo=None) == wall:
        return utc_first  # exists (if it exists twice, fold=0 is the first occurrence)
    # The wall time falls in a gap: the slot is the transition, the first instant whose wall
    # time is at or after it. fold=1 maps before the gap, fold=0 after it; bisect between.
    low = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
    high = utc_first
    if low > high:
        low, high = high, low
    while high - low > timedelta(microseconds=1):
        middle = low + (high - low) / 2
        if middle.astimezone(zone).replace(tzinfo=None) >= wall:
            high = middle
        else:
            low = middle
    # Transitions fall on whole seconds in every real zone.
    return high.replace(microsecond=0) if high.microsecond else high


@dataclass(frozen=True)
class IntervalSchedule:
    interval: timedelta

    def describe(self) -> str:
        return f"every {self.interval.total_seconds():g}s"

    def next_after(self, moment: datetime) -> datetime:
        step = _micros(self.interval)
        elapsed = _micros(moment.astimezone(UTC) - EPOCH)
        return EPOCH + timedelta(microseconds=(elapsed // step + 1) * step)


NEVER = datetime(9999, 12, 31, tzinfo=UTC)
"""The next slot of a schedule whose window has ended: later than any slot; a planner drops a job
whose next slot it is (:class:`Windowed`)."""


@dataclass(frozen=True)
class Windowed:
    """``inner``'s slots from ``start`` (included) to ``end`` (excluded); after the last one,
    :data:`NEVER`. Described as ``inner`` is: the window is an option, not the schedule."""

    inner: Schedule
    start: datetime | None
    end: datetime | None

    def describe(self) -> str:
        return self.inner.describe()

    def next_after(self, moment: datetime) -> datetime:
        if self.end is not None and moment >= self.end:
            return NEVER
        if self.start is not None and moment < self.start:
            moment = self.start - timedelta(microseconds=1)
        slot = self.inner.next_after(moment)
        return NEVER if self.end is not None and slot >= self.end else slot


def windowed(slots: Schedule, start: datetime | None, end: datetime | None) -> Schedule:
    """``slots`` within [``start``, ``end``) (:class:`Windowed`), or ``slots`` itself when
    neither bound is given."""
    return slots if start is None and end is None else Windowed(slots, start, end)


def _micros(delta: timedelta) -> int:
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def slots_between(schedule: Schedule, after: datetime, until: datetime) -> Iterator[datetime]:
    """Every slot ``s`` with ``after < s <= until``, in order."""
    slot = schedule.next_after(after)
    while slot <= until:
        yield slot
        slot = schedule.next_after(slot)


def day_rule(text: str, seconds_first: bool) -> str | None:
    """For an expression (aliases resolved) that restricts both day fields, the one line saying
    how they combine; ``None`` when one of them matches every day."""
    if seconds_first:
        if not SpringCron.parse(text).restricts_both_days:
            return None
        return (
            "days: both day fields are restricted; six fields follow Spring: a day must match "
            "the day-of-month AND the day-of-week"
        )
    from croniter import croniter

    expanded = croniter(text).expanded
    if expanded[2][0] == "*" or expanded[4][0] == "*":
        return None
    return (
        "days: both day fields are restricted; five fields follow classic cron: a day matching "
        "the day-of-month OR the day-of-week runs"
    )
