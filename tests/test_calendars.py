"""Holiday calendars and excluded dates, without a database: which day a slot falls on (in the
job's zone, across a DST change), what ``check`` lists, and what is refused at declaration."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pytest
from slotcron.cli.main import _next_slots
from slotcron.errors import InvalidJobError
from slotcron.jobs.calendars import excluded
from slotcron.jobs.registry import Job, Registry, cron, every

NEW_YORK = "America/New_York"


def weekday_job(**options: object) -> Job:
    registry = Registry()

    @cron("0 9 * * MON-FRI", name="weekdays", timezone=NEW_YORK, registry=registry, **options)  # type: ignore[arg-type]
    async def job() -> None:
        pass

    [made] = list(registry)
    return made


def test_a_slot_is_judged_by_its_day_in_the_jobs_zone() -> None:
    job = weekday_job(calendar="holidays:US")
    late_thanksgiving = datetime(2026, 11, 27, 4, 30, tzinfo=UTC)  # 23:30 on the 26th in New York
    assert excluded(job, late_thanksgiving, NEW_YORK) == "holiday: Thanksgiving Day"
    assert excluded(job, late_thanksgiving + timedelta(hours=1), NEW_YORK) is None
    assert excluded(job, late_thanksgiving, "UTC") is None, "the 27th in UTC"


def test_excluded_dates_and_a_subdivisions_holidays() -> None:
    job = weekday_job(calendar="holidays:US-NY", exclude_dates=["2026-12-24", date(2026, 12, 31)])
    assert excluded(job, datetime(2026, 12, 24, 14, tzinfo=UTC), NEW_YORK) == (
        "excluded date: 2026-12-24"
    )
    assert excluded(job, datetime(2026, 12, 31, 14, tzinfo=UTC), NEW_YORK) == (
        "excluded date: 2026-12-31"
    )
    assert excluded(job, datetime(2026, 2, 12, 14, tzinfo=UTC), NEW_YORK) == (
        "holiday: Lincoln's Birthday"
    ), "a New York holiday, not a federal one"
    assert excluded(weekday_job(), datetime(2026, 12, 25, 14, tzinfo=UTC), NEW_YORK) is None


def test_check_lists_the_slots_that_run_across_a_dst_change_and_a_holiday() -> None:
    job = weekday_job(calendar="holidays:US")
    schedule = job.schedule()
    # 09:00 in New York is 13:00 UTC until 1 November 2026, 14:00 after; Veterans Day is the 11th.
    slots = _next_slots(job, schedule, datetime(2026, 10, 29, tzinfo=UTC), NEW_YORK)
    assert slots == [
        datetime(2026, 10, 29, 13, tzinfo=UTC),
        datetime(2026, 10, 30, 13, tzinfo=UTC),
        datetime(2026, 11, 2, 14, tzinfo=UTC),
        datetime(2026, 11, 3, 14, tzinfo=UTC),
        datetime(2026, 11, 4, 14, tzinfo=UTC),
    ]
    around = _next_slots(job, schedule, datetime(2026, 11, 9, tzinfo=UTC), NEW_YORK)
    assert datetime(2026, 11, 11, 14, tzinfo=UTC) not in around
    assert around[:2] == [
        datetime(2026, 11, 9, 14, tzinfo=UTC),
        datetime(2026, 11, 10, 14, tzinfo=UTC),
    ]
    thanksgiving = _next_slots(job, schedule, datetime(2026, 11, 25, tzinfo=UTC), NEW_YORK)
    assert thanksgiving[:2] == [
        datetime(2026, 11, 25, 14, tzinfo=UTC),
        datetime(2026, 11, 27, 14, tzinfo=UTC),
    ]


def test_check_says_when_the_calendar_leaves_fewer_slots_than_it_lists(
    capsys: pytest.CaptureFixture[str],
) -> None:
    registry = Registry()

    @cron(
        "0 9 25 12 *",
        name="christmas",
        timezone=NEW_YORK,
        calendar="holidays:US",
        registry=registry,
    )
    async def job() -> None:
        pass

    [made] = list(registry)
    assert _next_slots(made, made.schedule(), datetime(2026, 11, 28, tzinfo=UTC), NEW_YORK) == []
    assert "its calendar leaves 0 of its next slots to run" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("options", "field", "said"),
    [
        ({"calendar": "US"}, "calendar", "must be 'holidays:<country>'"),
        ({"calendar": "holidays:XX"}, "calendar", "'XX' is not a country"),
        ({"calendar": "holidays:US-ZZ"}, "calendar", "'ZZ' is not a subdivision of US"),
        ({"calendar": 7}, "calendar", "must be 'holidays:<country>'"),
        ({"exclude_dates": "2026-12-24"}, "exclude_dates", "must be a list of dates"),
        ({"exclude_dates": ["2026-13-01"]}, "exclude_dates", "'2026-13-01' is not a date"),
        (
            {"exclude_dates": [datetime(2026, 12, 24, tzinfo=UTC)]},
            "exclude_dates",
            "takes dates, not times",
        ),
    ],
)
def test_a_bad_calendar_or_date_is_refused_at_declaration_naming_the_field(
    options: dict[str, object], field: str, said: str
) -> None:
    registry = Registry()
    with pytest.raises(InvalidJobError) as caught:
        every(seconds=60, name="bad", registry=registry, **options)(_noop)  # type: ignore[arg-type]
    assert caught.value.field == field and said in caught.value.problem, caught.value
    assert len(registry) == 0


def test_the_calendar_is_stored_with_the_jobs_options() -> None:
    job = weekday_job(calendar="holidays:US", exclude_dates=["2026-12-31", "2026-12-24"])
    assert job.options()["calendar"] == "holidays:US"
    assert job.options()["exclude_dates"] == ["2026-12-24", "2026-12-31"]


async def _noop() -> None:
    pass
