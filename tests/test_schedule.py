"""Slot computation: cron slots across DST transitions, seconds-first cron, epoch-aligned intervals.

Contract: a wall-clock slot that happens twice in a fall-back hour runs once (its first
occurrence); a slot that a spring-forward skips runs once, at the transition.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import pairwise
from zoneinfo import ZoneInfo

import pytest
import slotcron.schedule.slots
from slotcron.jobs.registry import Registry, cron
from slotcron.schedule.slots import CronSchedule, IntervalSchedule, normalise_cron, slots_between

NEW_YORK = "America/New_York"
BERLIN = "Europe/Berlin"


def utc(text: str) -> datetime:
    """An aware UTC datetime from ``YYYY-MM-DDTHH:MM[:SS]`` written in UTC."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def following(
    schedule: CronSchedule | IntervalSchedule, after: datetime, count: int
) -> list[datetime]:
    """The ``count`` slots after ``after``, each computed from the previous one."""
    slots = []
    slot = after
    for _ in range(count):
        slot = schedule.next_after(slot)
        slots.append(slot)
    return slots


# --- Fall-back: a wall time that happens twice runs once, at its first occurrence ---------


def test_fall_back_new_york_a_daily_slot_in_the_repeated_hour_runs_once_first() -> None:
    # 2026-11-01: 02:00 EDT becomes 01:00 EST at 06:00Z; 01:30 happens at 05:30Z and 06:30Z.
    schedule = CronSchedule("30 1 * * *", NEW_YORK)
    first = schedule.next_after(utc("2026-11-01T00:00"))
    assert first == utc("2026-11-01T05:30")
    assert schedule.next_after(first) == utc("2026-11-02T06:30"), "06:30Z is not a second run"


def test_fall_back_new_york_a_moment_in_the_second_pass_does_not_rerun_the_slot() -> None:
    schedule = CronSchedule("30 1 * * *", NEW_YORK)
    # 06:00Z and 06:29Z are 01:00 and 01:29 EST, in the second pass, before its 01:30.
    assert schedule.next_after(utc("2026-11-01T06:00")) == utc("2026-11-02T06:30")
    assert schedule.next_after(utc("2026-11-01T06:29")) == utc("2026-11-02T06:30")


def test_fall_back_new_york_half_hourly_slots_skip_the_second_pass_of_the_hour() -> None:
    schedule = CronSchedule("*/30 * * * *", NEW_YORK)
    assert following(schedule, utc("2026-11-01T04:45"), 4) == [
        utc("2026-11-01T05:00"),  # 01:00 EDT
        utc("2026-11-01T05:30"),  # 01:30 EDT
        utc("2026-11-01T07:00"),  # 02:00 EST: 01:00 and 01:30 EST do not run again
        utc("2026-11-01T07:30"),
    ]


def test_fall_back_new_york_inside_the_second_pass_the_next_slot_is_a_new_wall_time() -> None:
    schedule = CronSchedule("*/30 * * * *", NEW_YORK)
    assert schedule.next_after(utc("2026-11-01T06:15")) == utc("2026-11-01T07:00")


def test_fall_back_berlin_a_daily_slot_in_the_repeated_hour_runs_once_first() -> None:
    # 2026-10-25: 03:00 CEST becomes 02:00 CET at 01:00Z; 02:30 happens at 00:30Z and 01:30Z.
    schedule = CronSchedule("30 2 * * *", BERLIN)
    first = schedule.next_after(utc("2026-10-24T12:00"))
    assert first == utc("2026-10-25T00:30")
    assert schedule.next_after(first) == utc("2026-10-26T01:30"), "01:30Z is not a second run"
    assert schedule.next_after(utc("2026-10-25T01:15")) == utc("2026-10-26T01:30")


def test_fall_back_berlin_quarter_hourly_slots_skip_the_second_pass_of_the_hour() -> None:
    schedule = CronSchedule("*/15 * * * *", BERLIN)
    assert following(schedule, utc("2026-10-25T00:00"), 5) == [
        utc("2026-10-25T00:15"),  # 02:15 CEST
        utc("2026-10-25T00:30"),
        utc("2026-10-25T00:45"),
        utc("2026-10-25T02:00"),  # 03:00 CET: 02:00..02:45 CET do not run again
        utc("2026-10-25T02:15"),
    ]


# --- Spring-forward: a skipped wall time runs once, at the transition ----------------------


def test_spring_forward_new_york_a_skipped_daily_slot_runs_once_at_the_transition() -> None:
    # 2026-03-08: 02:00 EST jumps to 03:00 EDT at 07:00Z; 02:30 does not exist that day.
    schedule = CronSchedule("30 2 * * *", NEW_YORK)
    assert following(schedule, utc("2026-03-07T12:00"), 3) == [
        utc("2026-03-08T07:00"),
        utc("2026-03-09T06:30"),  # 02:30 EDT: back to the wall time the next day
        utc("2026-03-10T06:30"),
    ]


def test_spring_forward_berlin_all_skipped_slots_of_the_gap_run_once_at_the_transition() -> None:
    # 2026-03-29: 02:00 CET jumps to 03:00 CEST at 01:00Z; 02:00, 02:15, 02:30, 02:45 are skipped.
    schedule = CronSchedule("*/15 2 * * *", BERLIN)
    that_day = list(slots_between(schedule, utc("2026-03-28T23:00"), utc("2026-03-29T22:00")))
    assert that_day == [utc("2026-03-29T01:00")]
    assert following(schedule, utc("2026-03-29T01:00"), 4) == [
        utc("2026-03-30T00:00"),  # 02:00 CEST the next day, and every quarter of that hour
        utc("2026-03-30T00:15"),
        utc("2026-03-30T00:30"),
        utc("2026-03-30T00:45"),
    ]


def test_spring_forward_a_moment_just_before_the_gap_gets_the_transition() -> None:
    schedule = CronSchedule("*/15 2 * * *", BERLIN)
    assert schedule.next_after(utc("2026-03-29T00:59:59")) == utc("2026-03-29T01:00")


# --- Expressions and time zones ------------------------------------------------------------


def test_six_fields_put_seconds_first() -> None:
    # Seconds-first reads "30 0 9 * * *" as 09:00:30; seconds-last would read it otherwise.
    schedule = CronSchedule("30 0 9 * * *", "UTC")
    assert schedule.next_after(utc("2026-01-01T00:00")) == utc("2026-01-01T09:00:30")


def test_every_five_seconds_fires_on_the_multiples_of_five() -> None:
    schedule = CronSchedule("*/5 * * * * *", "UTC")
    assert following(schedule, utc("2026-01-01T00:00:58"), 4) == [
        utc("2026-01-01T00:01:00"),
        utc("2026-01-01T00:01:05"),
        utc("2026-01-01T00:01:10"),
        utc("2026-01-01T00:01:15"),
    ]


def test_five_fields_have_minute_precision() -> None:
    schedule = CronSchedule("* * * * *", "UTC")
    assert schedule.next_after(utc("2026-01-01T00:00:01")) == utc("2026-01-01T00:01")


@pytest.mark.parametrize(
    ("alias", "after", "expected"),
    [
        ("@hourly", "2026-01-01T00:00:01", "2026-01-01T01:00"),
        ("@daily", "2026-01-01T00:00:01", "2026-01-02T00:00"),
        ("@weekly", "2026-01-01T00:00", "2026-01-04T00:00"),  # 2026-01-04 is a Sunday
        ("@monthly", "2026-01-01T00:00", "2026-02-01T00:00"),
        ("@yearly", "2026-01-01T00:00", "2027-01-01T00:00"),
    ],
)
def test_aliases_mean_their_cron_expression(alias: str, after: str, expected: str) -> None:
    assert CronSchedule(alias, "UTC").next_after(utc(after)) == utc(expected)


def test_a_wall_time_is_read_in_the_job_timezone() -> None:
    schedule = CronSchedule("0 9 * * *", "Asia/Seoul")
    assert schedule.next_after(utc("2025-12-31T12:00")) == utc("2026-01-01T00:00")
    assert schedule.next_after(utc("2026-01-01T00:00")) == utc("2026-01-02T00:00")


def test_slots_are_aware_utc_whatever_the_timezone_of_the_moment_given() -> None:
    schedule = CronSchedule("0 9 * * *", "Asia/Seoul")
    moment = datetime(2026, 1, 1, 8, 0, tzinfo=ZoneInfo("Asia/Seoul"))  # 2025-12-31T23:00Z
    slot = schedule.next_after(moment)
    assert slot == utc("2026-01-01T00:00")
    assert slot.utcoffset() == timedelta(0)


def test_next_after_is_strictly_after_a_moment_that_is_itself_a_slot() -> None:
    schedule = CronSchedule("0 * * * *", "UTC")
    assert schedule.next_after(utc("2026-01-01T05:00")) == utc("2026-01-01T06:00")


# --- Interval schedules are aligned to the Unix epoch -------------------------------------


def test_interval_slots_are_aligned_to_the_unix_epoch() -> None:
    moment = utc("2026-01-01T00:00")
    epoch_seconds = int(moment.timestamp())
    assert epoch_seconds == 1_767_225_600
    assert epoch_seconds % 7 == 0  # so 00:00:00Z is itself a slot, and the next one is 7 s on
    schedule = IntervalSchedule(timedelta(seconds=7))
    assert schedule.next_after(moment) == utc("2026-01-01T00:00:07")


def test_interval_slots_off_a_round_minute_follow_the_epoch_not_the_moment() -> None:
    # 1767225601 % 7 == 1, so the next multiple of 7 s after 00:00:01Z is 00:00:07Z.
    schedule = IntervalSchedule(timedelta(seconds=7))
    assert schedule.next_after(utc("2026-01-01T00:00:01")) == utc("2026-01-01T00:00:07")
    # 1767225660 (00:01:00Z) % 7 == 4: the slots around it are 00:00:56Z and 00:01:03Z.
    assert schedule.next_after(utc("2026-01-01T00:00:56")) == utc("2026-01-01T00:01:03")
    assert schedule.next_after(utc("2026-01-01T00:01:00")) == utc("2026-01-01T00:01:03")


def test_interval_slots_are_the_same_for_every_instance_whenever_it_asks() -> None:
    schedule = IntervalSchedule(timedelta(seconds=10))
    asked_at = [
        utc("2026-01-01T00:00:00.5"),
        utc("2026-01-01T00:00:03"),
        utc("2026-01-01T00:00:09"),
    ]
    assert {schedule.next_after(moment) for moment in asked_at} == {utc("2026-01-01T00:00:10")}


def test_sub_second_intervals_keep_microsecond_alignment() -> None:
    schedule = IntervalSchedule(timedelta(milliseconds=250))
    assert following(schedule, utc("2026-01-01T00:00:00.1"), 3) == [
        utc("2026-01-01T00:00:00.25"),
        utc("2026-01-01T00:00:00.5"),
        utc("2026-01-01T00:00:00.75"),
    ]


# --- slots_between ------------------------------------------------------------------------


def test_slots_between_excludes_the_start_and_includes_the_end() -> None:
    schedule = CronSchedule("0 * * * *", "UTC")
    slots = list(slots_between(schedule, utc("2026-01-01T01:00"), utc("2026-01-01T04:00")))
    assert slots == [utc("2026-01-01T02:00"), utc("2026-01-01T03:00"), utc("2026-01-01T04:00")]


def test_slots_between_is_empty_when_no_slot_falls_in_the_window() -> None:
    schedule = CronSchedule("0 * * * *", "UTC")
    assert list(slots_between(schedule, utc("2026-01-01T01:00"), utc("2026-01-01T01:59"))) == []


def test_slots_between_works_for_intervals() -> None:
    schedule = IntervalSchedule(timedelta(seconds=7))
    slots = list(slots_between(schedule, utc("2026-01-01T00:00"), utc("2026-01-01T00:00:30")))
    assert slots == [utc(f"2026-01-01T00:00:{second:02d}") for second in (7, 14, 21, 28)]


def test_slots_between_across_a_fall_back_gives_every_wall_time_once() -> None:
    schedule = CronSchedule("0 * * * *", NEW_YORK)
    slots = list(slots_between(schedule, utc("2026-11-01T03:30"), utc("2026-11-01T08:30")))
    # 00:00 EDT, 01:00 EDT, (01:00 EST is the same wall time: not again), 02:00 EST, 03:00 EST
    assert slots == [
        utc("2026-11-01T04:00"),
        utc("2026-11-01T05:00"),
        utc("2026-11-01T07:00"),
        utc("2026-11-01T08:00"),
    ]


# --- Property: consecutive slots strictly increase, through DST and all -------------------


@pytest.mark.parametrize(
    ("expression", "timezone", "start"),
    [
        ("*/15 * * * *", NEW_YORK, "2026-03-07T12:00"),  # through spring-forward
        ("*/15 * * * *", NEW_YORK, "2026-10-31T20:00"),  # through fall-back
        ("*/10 * * * *", "Australia/Lord_Howe", "2026-04-04T12:00"),  # 30-minute fall-back
        ("*/10 * * * *", "Australia/Lord_Howe", "2026-10-03T12:00"),  # 30-minute spring-forward
        ("30 2 * * *", BERLIN, "2026-03-01T00:00"),  # daily, through both transitions
        ("*/15 2 * * *", BERLIN, "2026-03-20T00:00"),  # whole-gap hour
        ("*/20 * 1-3 * * *", BERLIN, "2026-10-25T00:30"),  # seconds-first, through fall-back
        ("@hourly", "Asia/Kolkata", "2026-01-01T00:00"),  # half-hour offset, no DST
    ],
)
def test_two_hundred_consecutive_slots_strictly_increase_and_never_repeat(
    expression: str, timezone: str, start: str
) -> None:
    schedule = CronSchedule(expression, timezone)
    slots = following(schedule, utc(start), 200)
    assert all(later > earlier for earlier, later in pairwise(slots))
    assert len(set(slots)) == len(slots)
    assert all(slot.utcoffset() == timedelta(0) for slot in slots)


@pytest.mark.parametrize("interval", [timedelta(seconds=7), timedelta(minutes=90)])
def test_two_hundred_consecutive_interval_slots_are_one_interval_apart(
    interval: timedelta,
) -> None:
    slots = following(IntervalSchedule(interval), utc("2026-11-01T04:00:03"), 200)
    assert all(later - earlier == interval for earlier, later in pairwise(slots))


def test_an_expression_is_checked_by_croniter_once_however_many_jobs_share_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Checking an expression with croniter takes about 0.3 ms: 5,000 jobs sharing one spent
    1.7 s of their start-up on it. Once per expression; a bad one is refused every time."""
    normalise_cron.cache_clear()
    checks: list[str] = []
    real = getattr(slotcron.schedule.slots, "croniter")  # noqa: B009 (not exported)

    def counted(text: str, *args: object, **kwargs: object) -> object:
        checks.append(text)
        return real(text, *args, **kwargs)

    monkeypatch.setattr(slotcron.schedule.slots, "croniter", counted)
    registry = Registry()
    for i in range(50):
        cron("*/5  * * * *", name=f"shared-{i}", registry=registry)(_noop)
    assert checks == ["*/5 * * * *"] * 2  # parsed, then iterated once: for 50 jobs
    for _ in range(2):
        with pytest.raises(ValueError, match="invalid cron expression"):
            normalise_cron("61 * * * *")
    normalise_cron.cache_clear()


async def _noop() -> None:
    pass
