"""Schedule fingerprints: computed from the UTC instants of slots, never from strings."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from slotcron.schedule.fingerprint import anchor_of, fingerprint, same_schedule
from slotcron.schedule.slots import IntervalSchedule, shared

ANCHOR = datetime(2026, 3, 1, 12, 0, 0, 250_000, tzinfo=UTC)


def test_a_fingerprint_names_its_anchor_so_another_instance_can_compare_at_it() -> None:
    printed = fingerprint(shared("0 9 * * *", "Europe/Paris"), ANCHOR)
    assert anchor_of(printed) == ANCHOR
    assert anchor_of("not a fingerprint") is None


def test_schedules_written_differently_that_place_slots_alike_are_the_same() -> None:
    in_force = fingerprint(IntervalSchedule(timedelta(seconds=60)), ANCHOR)
    assert same_schedule(shared("* * * * *", "UTC"), in_force)
    assert same_schedule(shared("0 * * * * *", "Asia/Seoul"), in_force)


def test_the_same_text_in_a_zone_that_places_it_elsewhere_is_another_schedule() -> None:
    in_force = fingerprint(shared("0 9 * * *", "Europe/Paris"), ANCHOR)
    assert same_schedule(shared("0 9 * * *", "Europe/Berlin"), in_force)  # same rules
    assert not same_schedule(shared("0 9 * * *", "Europe/London"), in_force)


def test_a_difference_beyond_the_next_twenty_slots_but_within_a_day_counts() -> None:
    """Every second vs every second but at 13:00:00: the first 20 slots agree."""
    in_force = fingerprint(shared("* * * * * *", "UTC"), ANCHOR)
    assert not same_schedule(shared("* * 0-12,14-23 * * *", "UTC"), in_force)


def test_no_schedule_in_force_is_nothing_to_differ_from() -> None:
    assert same_schedule(shared("0 9 * * *", "UTC"), None)
