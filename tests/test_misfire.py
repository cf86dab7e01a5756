"""The pure misfire rules for slots older than catchup_window: the passed-over range."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from slotcron.jobs import misfire
from slotcron.jobs.registry import Registry, cron, every
from slotcron.schedule.slots import IntervalSchedule, shared

NOW = datetime(2026, 11, 22, 12, 0, 0, 500_000, tzinfo=UTC)


def test_the_passed_over_range_runs_from_the_first_slot_to_the_last_before_the_window() -> None:
    registry = Registry()

    @every(seconds=1, name="tick", catchup_window=5, registry=registry)
    async def tick() -> None: ...

    job = registry.get("tick")
    assert job is not None
    schedule = IntervalSchedule(timedelta(seconds=1))
    first = NOW - timedelta(seconds=20.5)
    passed = misfire.passed_over(job, schedule, first, NOW)
    assert passed is not None
    # The window reaches back to 11:59:55.5: 11:59:40 .. 11:59:55 are older.
    assert (passed.first, passed.last) == (
        datetime(2026, 11, 22, 11, 59, 40, tzinfo=UTC),
        datetime(2026, 11, 22, 11, 59, 55, tzinfo=UTC),
    )
    assert passed.reason == (
        "16 slots from 2026-11-22T11:59:40Z to 2026-11-22T11:59:55Z passed over: "
        "older than catchup_window 5s (misfire='skip')"
    )
    late, _ = misfire.late_slots(job, schedule, first, NOW)
    # The range ends where the slots the policy decides begin: no slot in both, none in neither.
    assert schedule.next_after(passed.last) == late[0]
    assert misfire.passed_over(job, schedule, late[0], NOW) is None
    assert misfire.passed_over(job, schedule, first, NOW, before=passed.first) is None


def test_a_cron_range_over_a_daylight_saving_change_is_counted_by_its_slots() -> None:
    registry = Registry()

    @cron("30 2 * * *", name="night", timezone="Europe/Paris", misfire="once", registry=registry)
    async def night() -> None: ...

    job = registry.get("night")
    assert job is not None
    schedule = shared("30 2 * * *", "Europe/Paris")
    now = datetime(2026, 4, 10, tzinfo=UTC)
    passed = misfire.passed_over(job, schedule, datetime(2026, 3, 20, tzinfo=UTC), now)
    assert passed is not None
    # 20 March .. 9 April (the window reaches back to 23:00 on the 9th): 21 nights, the one of
    # 29 March among them (02:30 skipped: it runs at the transition, 03:00 CEST).
    assert passed.reason.startswith("21 slots from 2026-03-20T01:30:00Z to 2026-04-09T00:30:00Z")
    assert passed.reason.endswith("older than catchup_window 1h (misfire='once')")


def test_counting_a_huge_cron_range_stops_at_the_cap() -> None:
    schedule = shared("* * * * * *", "UTC")
    first = datetime(2026, 1, 1, tzinfo=UTC)
    assert misfire.count_slots(schedule, first, first + timedelta(days=2)) is None
    assert misfire.count_slots(schedule, first, first + timedelta(seconds=99)) == 100
