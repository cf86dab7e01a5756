"""Six-field cron means what Spring's ``CronExpression`` (5.3+) means; five fields stay classic.

The expected slots below are written from Spring's documentation and behaviour (the calendar
facts are in the comments), not computed by the code under test. Slots are aware UTC; the
contract's DST rules hold for ``L``, ``W`` and ``#`` slots as for any other.
"""

from __future__ import annotations

import calendar
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from slotcron import InvalidJobError
from slotcron.jobs.registry import Registry, cron
from slotcron.schedule.slots import CronSchedule, day_rule, normalise_cron

BERLIN = "Europe/Berlin"
NEW_YORK = "America/New_York"
CAIRO = "Africa/Cairo"


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def following(schedule: CronSchedule, after: datetime, count: int) -> list[datetime]:
    slots, slot = [], after
    for _ in range(count):
        slot = schedule.next_after(slot)
        slots.append(slot)
    return slots


# --- The table: expression, zone, asked after, the next slots ------------------------------

TABLE = [
    # Both day fields restricted: both must match. The first Monday of each month, not the 1st
    # to 7th and every Monday. 2026-01-05, 02-02, 03-02 and 04-06 are Mondays.
    (
        "0 0 9 1-7 * MON",
        "UTC",
        "2026-01-01T00:00",
        ["2026-01-05T09:00", "2026-02-02T09:00", "2026-03-02T09:00", "2026-04-06T09:00"],
    ),
    # Friday the 13th: 2026 has three (February, March, November).
    (
        "0 0 12 13 * FRI",
        "UTC",
        "2026-01-01T00:00",
        ["2026-02-13T12:00", "2026-03-13T12:00", "2026-11-13T12:00"],
    ),
    # The last day of a month, when it is a Sunday: 2026-05-31, 2027-01-31, 2027-02-28.
    (
        "0 0 0 L * SUN",
        "UTC",
        "2026-01-01T00:00",
        ["2026-05-31T00:00", "2027-01-31T00:00", "2027-02-28T00:00"],
    ),
    # 29 February on a Monday: next in 2044, then 2072.
    ("0 0 0 29 2 MON", "UTC", "2026-01-01T00:00", ["2044-02-29T00:00", "2072-02-29T00:00"]),
    # L-3: the third-to-last day. 31-3, 28-3, 31-3, 30-3; in leap 2028, February's is the 26th.
    (
        "0 0 0 L-3 * *",
        "UTC",
        "2026-01-01T00:00",
        ["2026-01-28T00:00", "2026-02-25T00:00", "2026-03-28T00:00", "2026-04-27T00:00"],
    ),
    ("0 0 0 L-3 * *", "UTC", "2028-02-01T00:00", ["2028-02-26T00:00"]),
    ("0 0 0 L * *", "UTC", "2028-02-01T00:00", ["2028-02-29T00:00", "2028-03-31T00:00"]),
    # LW: the last weekday. Jan 31 and Feb 28 2026 are Saturdays (so Friday), May 31 a Sunday.
    (
        "0 0 0 LW * *",
        "UTC",
        "2026-01-01T00:00",
        [
            "2026-01-30T00:00",
            "2026-02-27T00:00",
            "2026-03-31T00:00",
            "2026-04-30T00:00",
            "2026-05-29T00:00",
        ],
    ),
    # THUL and 5L: the last Thursday, the last Friday.
    (
        "0 0 0 * * THUL",
        "UTC",
        "2026-01-01T00:00",
        ["2026-01-29T00:00", "2026-02-26T00:00", "2026-03-26T00:00", "2026-04-30T00:00"],
    ),
    (
        "0 0 0 * * 5L",
        "UTC",
        "2026-01-01T00:00",
        ["2026-01-30T00:00", "2026-02-27T00:00", "2026-03-27T00:00", "2026-04-24T00:00"],
    ),
    # 5#2 and MON#1: the second Friday, the first Monday.
    (
        "0 0 0 ? * 5#2",
        "UTC",
        "2026-01-01T00:00",
        ["2026-01-09T00:00", "2026-02-13T00:00", "2026-03-13T00:00", "2026-04-10T00:00"],
    ),
    (
        "0 0 0 ? * MON#1",
        "UTC",
        "2026-01-01T00:00",
        ["2026-01-05T00:00", "2026-02-02T00:00", "2026-03-02T00:00", "2026-04-06T00:00"],
    ),
    # FRI#5 only in months with five Fridays.
    (
        "0 0 0 ? * FRI#5",
        "UTC",
        "2026-01-01T00:00",
        ["2026-01-30T00:00", "2026-05-29T00:00", "2026-07-31T00:00", "2026-10-30T00:00"],
    ),
    # 1W: the first weekday. Feb 1 and Mar 1 2026 are Sundays (so Monday the 2nd); a Saturday
    # 1st moves forward to Monday the 3rd, never back into the month before (2022-01, 2026-08).
    (
        "0 0 0 1W * *",
        "UTC",
        "2026-01-01T00:00",
        ["2026-02-02T00:00", "2026-03-02T00:00", "2026-04-01T00:00", "2026-05-01T00:00"],
    ),
    ("0 0 0 1W * *", "UTC", "2021-12-15T00:00", ["2022-01-03T00:00"]),
    ("0 0 0 1W * *", "UTC", "2026-07-15T00:00", ["2026-08-03T00:00"]),
    # 15W: Feb 15 2026 is a Sunday (Monday 16th), Aug 15 2026 a Saturday (Friday 14th).
    ("0 0 0 15W * *", "UTC", "2026-02-01T00:00", ["2026-02-16T00:00", "2026-03-16T00:00"]),
    ("0 0 0 15W * *", "UTC", "2026-08-01T00:00", ["2026-08-14T00:00"]),
    # 31W: May 31 2026 is a Sunday and June has no 31st, so nothing until July 31 (a Friday).
    ("0 0 0 31W * *", "UTC", "2026-05-01T00:00", ["2026-07-31T00:00", "2026-08-31T00:00"]),
    # Lists mix plain days and L forms: the 1st and the last day.
    (
        "0 0 0 1,L * *",
        "UTC",
        "2026-01-15T00:00",
        ["2026-01-31T00:00", "2026-02-01T00:00", "2026-02-28T00:00"],
    ),
    # 0 and 7 are both Sunday; '?' is '*'; day-of-week steps count from 0 (Sun, Tue, Thu, Sat).
    ("0 0 0 * * 0", "UTC", "2026-01-01T00:00", ["2026-01-04T00:00", "2026-01-11T00:00"]),
    ("0 0 0 * * 7", "UTC", "2026-01-01T00:00", ["2026-01-04T00:00", "2026-01-11T00:00"]),
    ("0 0 0 ? * ?", "UTC", "2026-01-01T00:00", ["2026-01-02T00:00", "2026-01-03T00:00"]),
    (
        "0 0 0 * * 0/2",
        "UTC",
        "2026-01-01T00:00",
        ["2026-01-03T00:00", "2026-01-04T00:00", "2026-01-06T00:00", "2026-01-08T00:00"],
    ),
    # Names in any case, ranges and steps.
    (
        "0 30 9 * jan,MAR mon-fri",
        "UTC",
        "2026-01-30T12:00",
        ["2026-03-02T09:30", "2026-03-03T09:30"],
    ),
    ("0 0 0 5/10 * *", "UTC", "2026-01-01T00:00", ["2026-01-05T00:00", "2026-01-15T00:00"]),
    ("*/5 * * * * *", "UTC", "2026-01-01T00:00:58", ["2026-01-01T00:01", "2026-01-01T00:01:05"]),
    (
        "0 0 9 * * MON-FRI",
        "UTC",
        "2026-01-02T09:00",
        ["2026-01-05T09:00", "2026-01-06T09:00"],
    ),
    # The same expressions in zones with DST. First Monday at 09:00 New York: EST, then EDT.
    ("0 0 9 1-7 * MON", NEW_YORK, "2026-03-01T00:00", ["2026-03-02T14:00", "2026-04-06T13:00"]),
    # Berlin's spring-forward is on the last Sunday of March: 02:30 that day does not exist, so
    # the slot is the transition (01:00Z); in April 02:30 CEST is 00:30Z.
    ("0 30 2 ? * SUNL", BERLIN, "2026-03-01T00:00", ["2026-03-29T01:00", "2026-04-26T00:30"]),
    # The same gap reached through L-2 (March 31 - 2 = 29), and a whole minute of seconds in it.
    ("0 30 2 L-2 3 *", BERLIN, "2026-03-01T00:00", ["2026-03-29T01:00", "2027-03-29T00:30"]),
    ("*/20 30 2 L-2 3 *", BERLIN, "2026-03-01T00:00", ["2026-03-29T01:00", "2027-03-29T00:30"]),
    # Berlin's fall-back is on the last Sunday of October: 02:30 happens twice, runs once, first.
    ("0 30 2 ? * SUNL", BERLIN, "2026-10-01T00:00", ["2026-10-25T00:30", "2026-11-29T01:30"]),
    ("0 30 2 ? * SUNL", BERLIN, "2026-10-25T01:15", ["2026-11-29T01:30"]),
    # New York springs forward on the second Sunday of March, falls back on the first of November.
    ("0 30 2 ? * SUN#2", NEW_YORK, "2026-03-01T00:00", ["2026-03-08T07:00", "2026-04-12T06:30"]),
    ("0 30 1 ? * SUN#1", NEW_YORK, "2026-10-15T00:00", ["2026-11-01T05:30", "2026-12-06T06:30"]),
    ("0 30 1 ? * SUN#1", NEW_YORK, "2026-11-01T06:00", ["2026-12-06T06:30"]),
    # Cairo springs forward at 00:00 on the last Friday of April (2026-04-24, 22:00Z), a weekday,
    # so W and L slots can fall in its gap; it falls back at 24:00 on the last Thursday of
    # October, so 23:30 that Thursday happens twice (20:30Z and 21:30Z).
    ("0 30 0 24W 4 *", CAIRO, "2026-01-01T00:00", ["2026-04-23T22:00", "2027-04-22T22:30"]),
    ("0 30 0 ? 4 FRIL", CAIRO, "2026-01-01T00:00", ["2026-04-23T22:00", "2027-04-29T22:00"]),
    ("0 30 23 ? 10 THUL", CAIRO, "2026-10-01T00:00", ["2026-10-29T20:30", "2027-10-28T20:30"]),
    ("0 30 23 ? 10 THUL", CAIRO, "2026-10-29T21:00", ["2027-10-28T20:30"]),
]


@pytest.mark.parametrize(("expression", "zone", "after", "expected"), TABLE)
def test_six_field_slots_are_the_ones_spring_documents(
    expression: str, zone: str, after: str, expected: list[str]
) -> None:
    schedule = CronSchedule(expression, zone)
    assert following(schedule, utc(after), len(expected)) == [utc(slot) for slot in expected]


# --- Five fields keep classic cron: either day field matches -------------------------------


def test_five_fields_run_on_either_day_field_when_both_are_restricted() -> None:
    # "0 9 1-7 * MON": the 1st to 7th AND every Monday (classic cron), eleven runs in March 2026.
    schedule = CronSchedule("0 9 1-7 * MON", "UTC")
    march = [s for s in following(schedule, utc("2026-02-28T12:00"), 12) if s.month == 3]
    assert [s.day for s in march] == [1, 2, 3, 4, 5, 6, 7, 9, 16, 23, 30]


def test_the_same_days_in_six_fields_run_on_the_first_monday_only() -> None:
    schedule = CronSchedule("0 0 9 1-7 * MON", "UTC")
    assert following(schedule, utc("2026-02-28T12:00"), 1) == [utc("2026-03-02T09:00")]


# --- Refusals: InvalidJobError naming the job, the field and the reason ---------------------

REFUSALS = [
    ("0 0 0 L3 * *", "day-of-month", "must be negative"),
    ("0 0 0 L-0 * *", "day-of-month", "must be negative"),
    ("0 0 0 5L * *", "day-of-month", "'L' must come first"),
    ("0 0 0 W * *", "day-of-month", "no day-of-month before 'W'"),
    ("0 0 0 15W3 * *", "day-of-month", "characters after 'W'"),
    ("0 0 0 32W * *", "day-of-month", "32 is outside 1-31"),
    ("0 0 0 l * *", "day-of-month", "not a number"),  # only day-of-week reads names in any case
    ("0 0 0 0 * *", "day-of-month", "0 is outside 1-31"),
    ("0 0 0 * * L", "day-of-week", "no day-of-week before 'L'"),
    ("0 0 0 * * L5", "day-of-week", "characters after 'L'"),
    ("0 0 0 * * 8L", "day-of-week", "8 is outside 0-7"),
    ("0 0 0 * * 5#0", "day-of-week", "must be 1 or more"),
    ("0 0 0 * * 5#", "day-of-week", "no ordinal after '#'"),
    ("0 0 0 * * #2", "day-of-week", "no day-of-week before '#'"),
    ("0 0 0 * * 8", "day-of-week", "8 is outside 0-7"),
    ("0 0 0 * * MONDAY", "day-of-week", "not a number"),
    ("60 * * * * *", "second", "60 is outside 0-59"),
    ("? * * * * *", "second", "not a number"),
    ("* 5-3 * * * *", "minute", "runs backwards"),
    ("* * */0 * * *", "hour", "must be 1 or more"),
    ("* * 1,,2 * * *", "hour", "a number is missing"),
    ("0 0 0 * 13 *", "month", "13 is outside 1-12"),
    ("0 0 0 * L *", "month", "not a number"),
    ("0 0 0 ? JAN-FEBRUARY *", "month", "not a number"),
    # Spring accepts these and never fires (or fires on days no reading names): refused here.
    ("0 0 0 30 2 *", "expression", "never runs"),
    ("0 0 0 L-31 * *", "day-of-month", "no month has a day 31 before its last"),
    ("0 0 0 ? * MON#6", "day-of-week", "no month has a 6th"),
]


@pytest.mark.parametrize(("expression", "field", "reason"), REFUSALS)
def test_what_spring_refuses_is_refused_naming_the_job_the_field_and_the_reason(
    expression: str, field: str, reason: str
) -> None:
    registry = Registry()
    with pytest.raises(InvalidJobError) as caught:
        cron(expression, name="billing.close", registry=registry)(_job)
    message = str(caught.value)
    assert caught.value.job == "billing.close"
    assert caught.value.field == "schedule"
    assert f"{field} " in message, message
    assert reason in message, message
    assert len(registry) == 0


async def _job() -> None:
    pass


# --- The one line `slotcron check` prints about the day fields ------------------------------


@pytest.mark.parametrize(
    ("expression", "rule"),
    [
        ("0 0 9 1-7 * MON", "AND"),
        ("0 0 0 L * SUN", "AND"),
        ("0 9 1-7 * MON", "OR"),
        ("0 0 9 * * MON", None),
        ("0 0 0 ? * 5#2", None),
        ("0 0 0 L-3 * ?", None),
        ("0 9 * * MON", None),
        ("@monthly", None),
    ],
)
def test_the_day_rule_line_names_the_rule_only_when_both_day_fields_are_restricted(
    expression: str, rule: str | None
) -> None:
    line = day_rule(*normalise_cron(expression))
    if rule is None:
        assert line is None
    else:
        assert line is not None and rule in line
        assert ("Spring" if rule == "AND" else "classic cron") in line


# --- Property: next_after is strictly after, and never skips a slot a scan finds -------------

MONTH_NAMES = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
DAY_NAMES = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")  # index = cron number, 0 Sunday
DayTest = Callable[[date], bool]


@dataclass(frozen=True)
class Reference:
    """An expression and, independently of the code under test, what each of its fields means."""

    text: str
    seconds: frozenset[int]
    minutes: frozenset[int]
    hours: frozenset[int]
    months: frozenset[int]
    month_day: DayTest
    week_day: DayTest

    def day_matches(self, day: date) -> bool:
        return day.month in self.months and self.month_day(day) and self.week_day(day)


def _last(day: date) -> int:
    return calendar.monthrange(day.year, day.month)[1]


def _cron_weekday(day: date) -> int:
    return (day.weekday() + 1) % 7  # 0 Sunday ... 6 Saturday


def _nearest_weekday(day: date, n: int) -> bool:
    if n > _last(day):
        return False
    target = day.replace(day=n)
    if target.weekday() == 5:  # Saturday: Friday before, or Monday the 3rd for the 1st
        target += timedelta(days=2 if n == 1 else -1)
    elif target.weekday() == 6:  # Sunday: Monday after, if the month has it
        target += timedelta(days=1)
    return target == day


def _last_weekday_matches(day: date) -> bool:
    last = day.replace(day=_last(day))
    while last.weekday() >= 5:
        last -= timedelta(days=1)
    return last == day


def _time_field(high: int) -> st.SearchStrategy[tuple[str, frozenset[int]]]:
    values = st.integers(0, high)
    return st.one_of(
        st.just(("*", frozenset(range(high + 1)))),
        st.integers(1, high).map(lambda k: (f"*/{k}", frozenset(range(0, high + 1, k)))),
        st.lists(values, min_size=1, max_size=4).map(
            lambda vs: (",".join(map(str, vs)), frozenset(vs))
        ),
        st.tuples(values, values)
        .map(sorted)
        .map(lambda ab: (f"{ab[0]}-{ab[1]}", frozenset(range(ab[0], ab[1] + 1)))),
        st.tuples(values, st.integers(1, high)).map(
            lambda vk: (f"{vk[0]}/{vk[1]}", frozenset(range(vk[0], high + 1, vk[1])))
        ),
    )


def _month_day_element() -> st.SearchStrategy[tuple[str, DayTest]]:
    days = st.integers(1, 31)
    return st.one_of(
        days.map(lambda n: (str(n), lambda d, n=n: d.day == n)),
        st.tuples(days, days)
        .map(sorted)
        .map(lambda ab: (f"{ab[0]}-{ab[1]}", lambda d, a=ab[0], b=ab[1]: a <= d.day <= b)),
        st.just(("L", lambda d: d.day == _last(d))),
        st.integers(1, 30).map(lambda n: (f"L-{n}", lambda d, n=n: d.day == _last(d) - n)),
        st.just(("LW", _last_weekday_matches)),
        days.map(lambda n: (f"{n}W", lambda d, n=n: _nearest_weekday(d, n))),
    )


def _week_day_element() -> st.SearchStrategy[tuple[str, DayTest]]:
    numbers = st.integers(0, 7)

    def name(n: int, lower: bool) -> str:
        text = DAY_NAMES[n % 7]
        return text.lower() if lower else text

    return st.one_of(
        st.tuples(numbers, st.booleans(), st.booleans()).map(
            lambda t: (
                name(t[0], t[2]) if t[1] else str(t[0]),
                lambda d, n=t[0] % 7: _cron_weekday(d) == n,
            )
        ),
        st.tuples(st.integers(0, 6), numbers)
        .filter(lambda ab: ab[0] <= ab[1])
        .map(
            lambda ab: (
                f"{ab[0]}-{ab[1]}",
                lambda d, a=ab[0], b=ab[1]: _cron_weekday(d) in {n % 7 for n in range(a, b + 1)},
            )
        ),
        numbers.map(
            lambda n: (
                f"{n}L",
                lambda d, n=n % 7: _cron_weekday(d) == n and d.day + 7 > _last(d),
            )
        ),
        st.tuples(numbers, st.integers(1, 5)).map(
            lambda t: (
                f"{t[0]}#{t[1]}",
                lambda d, n=t[0] % 7, k=t[1]: _cron_weekday(d) == n and (d.day - 1) // 7 + 1 == k,
            )
        ),
    )


def _day_field(
    element: st.SearchStrategy[tuple[str, DayTest]],
) -> st.SearchStrategy[tuple[str, DayTest]]:
    def joined(parts: list[tuple[str, DayTest]]) -> tuple[str, DayTest]:
        tests = [test for _, test in parts]
        return ",".join(text for text, _ in parts), lambda d: any(t(d) for t in tests)

    return st.one_of(
        st.sampled_from([("*", lambda d: True), ("?", lambda d: True)]),
        st.lists(element, min_size=1, max_size=3).map(joined),
    )


@st.composite
def references(draw: st.DrawFn) -> Reference:
    second, seconds = draw(_time_field(59))
    minute, minutes = draw(_time_field(59))
    hour, hours = draw(_time_field(23))
    month_day, month_day_test = draw(_day_field(_month_day_element()))
    week_day, week_day_test = draw(_day_field(_week_day_element()))
    month_set = draw(st.one_of(st.none(), st.sets(st.integers(1, 12), min_size=1, max_size=4)))
    if month_set is None:
        month, months = "*", frozenset(range(1, 13))
    else:
        named = draw(st.booleans())
        month = ",".join(MONTH_NAMES[m - 1] if named else str(m) for m in sorted(month_set))
        months = frozenset(month_set)
    text = f"{second} {minute} {hour} {month_day} {month} {week_day}"
    return Reference(text, seconds, minutes, hours, months, month_day_test, week_day_test)


def scan(reference: Reference, after: datetime, until: datetime, limit: int) -> list[datetime]:
    """Matching wall times in (after, until], at most ``limit``: a scan second by second through
    matching minutes, minute by minute through matching hours, day by day otherwise."""
    found: list[datetime] = []
    moment = after.replace(microsecond=0) + timedelta(seconds=1)
    while moment <= until and len(found) < limit:
        if not reference.day_matches(moment.date()):
            moment = datetime.combine(moment.date() + timedelta(days=1), datetime.min.time())
        elif moment.hour not in reference.hours:
            moment = moment.replace(minute=0, second=0) + timedelta(hours=1)
        elif moment.minute not in reference.minutes:
            moment = moment.replace(second=0) + timedelta(minutes=1)
        else:
            if moment.second in reference.seconds:
                found.append(moment)
            moment += timedelta(seconds=1)
    return found


STARTS = st.datetimes(min_value=datetime(2024, 1, 1), max_value=datetime(2030, 12, 31))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reference=references(), start=STARTS)
def test_iterating_next_after_finds_every_slot_a_scan_finds_and_nothing_else(
    reference: Reference, start: datetime
) -> None:
    try:
        schedule = CronSchedule(reference.text, "UTC")
    except ValueError:
        assume(False)  # matches no day at all (30 February): the refusals are tested above
    until = start + timedelta(days=2 * 366)
    expected = scan(reference, start, until, limit=25)
    slot = start.replace(tzinfo=UTC)
    for wall in expected:
        slot = schedule.next_after(slot)
        assert slot == wall.replace(tzinfo=UTC), f"{reference.text!r} after {start}"
    if len(expected) < 25:
        assert schedule.next_after(slot) > until.replace(tzinfo=UTC), reference.text


@settings(max_examples=150, deadline=None)
@given(
    reference=references(),
    start=STARTS,
    zone=st.sampled_from(["UTC", BERLIN, NEW_YORK, CAIRO, "Australia/Lord_Howe"]),
)
def test_the_next_slot_is_strictly_after_its_input_in_every_zone(
    reference: Reference, start: datetime, zone: str
) -> None:
    try:
        schedule = CronSchedule(reference.text, zone)
    except ValueError:
        assume(False)
    moment = start.replace(tzinfo=UTC)
    for _ in range(5):
        slot = schedule.next_after(moment)
        assert slot > moment, f"{reference.text!r} in {zone} after {moment}"
        assert slot.utcoffset() == timedelta(0)
        moment = slot
