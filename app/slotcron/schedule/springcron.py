"""Six-field cron with the meaning of Spring's ``CronExpression`` (Spring 5.3 and later).

Fields, SECONDS FIRST: ``second minute hour day-of-month month day-of-week``. This module
accepts what Spring accepts, refuses what Spring refuses, and finds the same slots, on naive
wall-clock times (``slotcron.schedule.slots`` places them on the UTC line by the contract's DST
rules).

- Ranges: second and minute 0-59, hour 0-23, day-of-month 1-31, month 1-12 or ``JAN``-``DEC``,
  day-of-week 0-7 or ``MON``-``SUN`` (0 and 7 are both Sunday; a range starting at 7 starts at
  Sunday 0). Names are read in any case in the month and day-of-week fields.
- Each field is ``*``, ``n``, ``a-b`` (``a <= b``), any of those followed by ``/step`` (``n/step``
  runs from n to the field's maximum), or a comma list of them. ``?`` is ``*`` in either day
  field.
- Day-of-month also takes ``L`` (last day), ``L-n`` (n days before the last), ``LW`` (last
  weekday) and ``nW`` (the weekday nearest day n, within the month: a Saturday n moves to Friday,
  but ``1W`` on a Saturday to Monday the 3rd; a Sunday n moves to Monday, none if the month ends
  that Sunday). Day-of-week also takes ``dL`` / ``DDDL`` (the last d of the month) and ``d#n`` /
  ``DDD#n`` (the n-th d of the month). All of these mix with plain values in a list.
- A day matches when its month, its day-of-month **and** its day-of-week all match. (Five-field
  expressions keep classic cron's OR; they are not evaluated here.)

Deliberate differences from Spring, each where Spring's result is an accident, not a meaning:

- An expression that matches no day at all (``30 2``, ``L-31``, ``MON#6``) is refused: Spring
  accepts it and then never fires, or, for ``L-n`` and ``#n`` reaching outside the month, fires
  on days no reading of the expression names.
- An ``L-n`` that reaches before the first of a short month names no day of that month; Spring
  can fire on a day of the month before instead.
- Fields are split on any whitespace, where Spring splits on spaces only.

Invariant: :meth:`SpringCron.next_wall` returns the least matching wall time strictly after its
argument, in whole seconds; it never skips a match (the property tests scan for one).
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta

_SECOND = timedelta(seconds=1)
# The Gregorian calendar repeats, weekdays included, every 400 years: an expression that matches
# no day in 4,800 consecutive months matches none ever.
_MONTHS_IN_CYCLE = 400 * 12
# Java's Integer.parseInt reads an optional sign and digits, within 32 bits.
_INTEGER = re.compile(r"[+-]?\d+")
_INT_MIN, _INT_MAX = -(2**31), 2**31 - 1
_MONTH_NAMES = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
_DAY_NAMES = ("MON", "TUE", "WED", "THU", "FRI", "SAT", "SUN")
_ALL_DAYS_OF_MONTH = sum(1 << day for day in range(1, 32))
_ALL_DAYS_OF_WEEK = sum(1 << day for day in range(1, 8))  # 1 Monday ... 7 Sunday
# A week's pattern of days (bits 1-7) repeated over the five weeks a month can touch.
_WEEKS = sum(1 << (7 * week) for week in range(5))


class CronFieldError(ValueError):
    """A six-field expression Spring would refuse; the message names the field and the reason."""

    def __init__(self, field: str, value: str, reason: str) -> None:
        self.field = field
        self.value = value
        self.reason = reason
        super().__init__(f"{field} {value!r}: {reason}")


@dataclass(frozen=True)
class _Field:
    """One field's name, the range ``*`` stands for, and the values it accepts."""

    name: str
    low: int
    high: int
    accepts_zero: bool = False  # day-of-week: 0 is Sunday, besides 1-7

    def check(self, value: int, text: str) -> int:
        if self.low <= value <= self.high or (self.accepts_zero and value == 0):
            return value
        low = 0 if self.accepts_zero else self.low
        raise CronFieldError(self.name, text, f"{value} is outside {low}-{self.high}")


SECOND = _Field("second", 0, 59)
MINUTE = _Field("minute", 0, 59)
HOUR = _Field("hour", 0, 23)
DAY_OF_MONTH = _Field("day-of-month", 1, 31)
MONTH = _Field("month", 1, 12)
DAY_OF_WEEK = _Field("day-of-week", 1, 7, accepts_zero=True)


# Day rules beyond plain values: ("L", n) n days before the last (0: the last day), ("LW",),
# ("W", n) weekday nearest n; ("last", d) last weekday d of the month, ("nth", d, n) n-th d.
# Weekdays d are 1 (Monday) to 7 (Sunday).
_Rule = tuple[str, int, int]


class SpringCron:
    """A parsed six-field expression. Build with :meth:`parse`; ask :meth:`next_wall`."""

    def __init__(
        self,
        expression: str,
        bits: tuple[int, int, int, int, int, int],
        month_day_rules: tuple[_Rule, ...],
        week_day_rules: tuple[_Rule, ...],
    ) -> None:
        self.expression = expression
        (self._seconds, self._minutes, self._hours, self._month_days, self._months) = bits[:5]
        self._week_days = bits[5]
        self._month_day_rules = month_day_rules
        self._week_day_rules = week_day_rules
        self._first_second = _lowest(self._seconds)
        self._first_minute = _lowest(self._minutes)
        self._first_hour = _lowest(self._hours)
        self._masks: dict[int, int] = {}

    @classmethod
    def parse(cls, expression: str) -> SpringCron:
        """Parse six whitespace-separated fields; raise :class:`CronFieldError` as Spring would
        refuse, and also for an expression that matches no day at all."""
        fields = expression.split()
        if len(fields) != 6:
            raise CronFieldError("expression", expression, f"has {len(fields)} fields, not 6")
        second, minute, hour, month_day, month, week_day = fields
        # In field order, so that the first field at fault is the one named.
        seconds = _parse_bits(second, SECOND)
        minutes = _parse_bits(minute, MINUTE)
        hours = _parse_bits(hour, HOUR)
        month_days, month_day_rules = _parse_days_of_month(month_day)
        months = _parse_bits(_replace_names(month, _MONTH_NAMES), MONTH, month)
        week_days, week_day_rules = _parse_days_of_week(week_day)
        bits = (seconds, minutes, hours, month_days, months, week_days)
        cron = cls(" ".join(fields), bits, month_day_rules, week_day_rules)
        if cron.next_wall(datetime(2000, 1, 1)) is None:
            raise CronFieldError(
                "expression", cron.expression, "matches no day of any year, so it never runs"
            )
        return cron

    @property
    def restricts_both_days(self) -> bool:
        """Whether neither day field matches every day, so that requiring both matters."""
        month_days = self._month_days != _ALL_DAYS_OF_MONTH or bool(self._month_day_rules)
        week_days = self._week_days != _ALL_DAYS_OF_WEEK or bool(self._week_day_rules)
        return month_days and week_days

    def next_wall(self, wall: datetime) -> datetime | None:
        """The least matching wall time strictly after ``wall`` (naive), in whole seconds;
        ``None`` if there is none before the year 10000."""
        start = wall.replace(microsecond=0) + _SECOND
        year, month, day = start.year, start.month, start.day
        days = self._days(year, month)
        if days >> day & 1:
            time = self._time_at_or_after(start.hour, start.minute, start.second)
            if time is not None:
                return datetime(year, month, day, *time)
        later = days >> (day + 1)
        for _ in range(_MONTHS_IN_CYCLE + 1):
            if later:
                day += 1 + _lowest(later)
                hms = (self._first_hour, self._first_minute, self._first_second)
                return datetime(year, month, day, *hms)
            month += 1
            if month > 12:
                month, year = 1, year + 1
                if year > 9999:
                    return None
            day = 0
            later = self._days(year, month) >> 1
        return None

    def walls_after(self, wall: datetime) -> Iterator[datetime]:
        """Every matching wall time strictly after ``wall``, in order."""
        found = self.next_wall(wall)
        while found is not None:
            yield found
            found = self.next_wall(found)

    def _time_at_or_after(self, hour: int, minute: int, second: int) -> tuple[int, int, int] | None:
        if self._hours >> hour & 1:
            if self._minutes >> minute & 1:
                seconds = self._seconds >> second
                if seconds:
                    return hour, minute, second + _lowest(seconds)
            minutes = self._minutes >> (minute + 1)
            if minutes:
                return hour, minute + 1 + _lowest(minutes), self._first_second
        hours = self._hours >> (hour + 1)
        if hours:
            return hour + 1 + _lowest(hours), self._first_minute, self._first_second
        return None

    def _days(self, year: int, month: int) -> int:
        """The matching days of one month, as bits 1-31."""
        if not self._months >> month & 1:
            return 0
        first, length = calendar.monthrange(year, month)  # weekday of the 1st: 0 is Monday
        # Which days match depends only on the month's length and the weekday it starts on:
        # 28 kinds of month, each computed once.
        key = first * 32 + length
        days = self._masks.get(key)
        if days is None:
            days = self._masks[key] = self._compute_days(first, length)
        return days

    def _compute_days(self, first: int, length: int) -> int:
        every_day = (1 << (length + 1)) - 2

        def weekday(day: int) -> int:  # 1 Monday ... 7 Sunday
            return (first + day - 1) % 7 + 1

        def first_of(week_day: int) -> int:  # the first day of the month that is week_day
            return 1 + (week_day - 1 - first) % 7

        month_days = self._month_days & every_day
        for kind, n, _ in self._month_day_rules:
            day = 0
            if kind == "L":
                day = length - n
            elif kind == "LW":
                day = length - max(0, weekday(length) - 5)
            elif n <= length:  # "W": the weekday nearest n, never leaving the month
                day = {6: n - 1 if n > 1 else 3, 7: n + 1}.get(weekday(n), n)
            if 1 <= day <= length:
                month_days |= 1 << day

        week_days = 0
        if self._week_days == _ALL_DAYS_OF_WEEK:
            week_days = every_day
        elif self._week_days:
            week = 0
            for week_day in range(1, 8):
                if self._week_days >> week_day & 1:
                    week |= 1 << first_of(week_day)
            week_days = (week * _WEEKS) & every_day
        for kind, week_day, n in self._week_day_rules:
            if kind == "last":
                day = first_of(week_day) + 7 * ((length - first_of(week_day)) // 7)
            else:
                day = first_of(week_day) + 7 * (n - 1)
            if day <= length:
                week_days |= 1 << day
        return month_days & week_days


def _lowest(bits: int) -> int:
    """The index of the lowest set bit (``bits`` > 0)."""
    return (bits & -bits).bit_length() - 1


def _integer(text: str, field: _Field, value: str) -> int:
    if not _INTEGER.fullmatch(text):
        reason = f"{text!r} is not a number" if text else "a number is missing"
        raise CronFieldError(field.name, value, reason)
    number = int(text)
    if not _INT_MIN <= number <= _INT_MAX:
        raise CronFieldError(field.name, value, f"{text} is out of range")
    return number


def _replace_names(value: str, names: tuple[str, ...]) -> str:
    """Names to their numbers, anywhere in the field and in any case (as Spring does)."""
    value = value.upper()
    for number, name in enumerate(names, start=1):
        value = value.replace(name, str(number))
    return value


def _parse_bits(value: str, field: _Field, written: str | None = None) -> int:
    """A plain field (values, ranges, steps, lists) as a bit set of its values."""
    written = written or value
    bits = 0
    for element in value.split(","):
        range_text, slash, step_text = element.partition("/")
        low, high = _parse_range(range_text, field, written)
        step = 1
        if slash:
            if "-" not in range_text:
                high = field.high  # "n/step" runs from n to the field's maximum
            step = _integer(step_text, field, written)
            if step <= 0:
                raise CronFieldError(field.name, written, f"the step {step} must be 1 or more")
        for number in range(low, high + 1, step):
            bits |= 1 << number
    return bits


def _parse_range(text: str, field: _Field, written: str) -> tuple[int, int]:
    if text == "*":
        return field.low, field.high
    low_text, hyphen, high_text = text.partition("-")
    low = field.check(_integer(low_text, field, written), written)
    if not hyphen:
        return low, low
    high = field.check(_integer(high_text, field, written), written)
    if field is DAY_OF_WEEK and low == 7:
        low = 0  # a range starting at Sunday starts at 0
    if low > high:
        raise CronFieldError(field.name, written, f"the range {text} runs backwards")
    return low, high


def _parse_days_of_month(value: str) -> tuple[int, tuple[_Rule, ...]]:
    if "L" not in value and "W" not in value:
        return _parse_bits("*" if value == "?" else value, DAY_OF_MONTH, value), ()
    bits, rules = 0, []
    for element in value.split(","):
        if "L" not in element and "W" not in element:
            bits |= _parse_bits("*" if element == "?" else element, DAY_OF_MONTH, value)
        else:
            rules.append(_month_day_rule(element, value))
    return bits, tuple(rules)


def _month_day_rule(element: str, value: str) -> _Rule:
    field = DAY_OF_MONTH.name
    last = element.rfind("L")
    if last != -1:
        if last != 0:
            raise CronFieldError(field, value, "'L' must come first ('L', 'L-n' or 'LW')")
        if element in ("L", "LW"):
            return (element, 0, 0)
        offset = _integer(element[1:], DAY_OF_MONTH, value)
        if offset >= 0:
            raise CronFieldError(field, value, f"the offset in {element!r} must be negative: 'L-n'")
        if offset < -30:
            raise CronFieldError(field, value, f"no month has a day {-offset} before its last")
        return ("L", -offset, 0)
    weekday = element.rfind("W")
    if weekday == 0:
        raise CronFieldError(field, value, "no day-of-month before 'W'")
    if weekday != len(element) - 1:
        raise CronFieldError(field, value, "characters after 'W'")
    day = DAY_OF_MONTH.check(_integer(element[:weekday], DAY_OF_MONTH, value), value)
    return ("W", day, 0)


def _parse_days_of_week(written: str) -> tuple[int, tuple[_Rule, ...]]:
    value = _replace_names(written, _DAY_NAMES)
    if "L" not in value and "#" not in value:
        return _week_day_bits("*" if value == "?" else value, written), ()
    bits, rules = 0, []
    for element in value.split(","):
        if "L" not in element and "#" not in element:
            bits |= _week_day_bits("*" if element == "?" else element, written)
        else:
            rules.append(_week_day_rule(element, written))
    return bits, tuple(rules)


def _week_day_bits(value: str, written: str) -> int:
    bits = _parse_bits(value, DAY_OF_WEEK, written)
    if bits & 1:
        bits = (bits | 1 << 7) & ~1  # 0 is Sunday, kept as 7
    return bits


def _week_day_rule(element: str, written: str) -> _Rule:
    field = DAY_OF_WEEK.name
    last = element.rfind("L")
    if last != -1:
        if last != len(element) - 1:
            raise CronFieldError(field, written, "characters after 'L' ('dL' is the last d)")
        if last == 0:
            raise CronFieldError(field, written, "no day-of-week before 'L' ('dL' is the last d)")
        return ("last", _week_day(element[:last], written), 0)
    hash_at = element.rfind("#")
    if hash_at == 0:
        raise CronFieldError(field, written, "no day-of-week before '#' ('d#n' is the n-th d)")
    if hash_at == len(element) - 1:
        raise CronFieldError(field, written, "no ordinal after '#' ('d#n' is the n-th d)")
    week_day = _week_day(element[:hash_at], written)
    ordinal = _integer(element[hash_at + 1 :], DAY_OF_WEEK, written)
    if ordinal <= 0:
        raise CronFieldError(field, written, f"the ordinal {ordinal} must be 1 or more")
    if ordinal > 5:
        raise CronFieldError(field, written, f"no month has a {ordinal}th of any day of the week")
    return ("nth", week_day, ordinal)


def _week_day(text: str, written: str) -> int:
    number = _integer(text, DAY_OF_WEEK, written)
    if not 0 <= number <= 7:
        raise CronFieldError(DAY_OF_WEEK.name, written, f"{number} is outside 0-7")
    return number or 7
