"""A schedule's window (``start_at``, ``end_at``, ``max_runs``), without a database: its slots,
what ``check`` lists, and what is refused at declaration."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from slotcron.cli.main import _next_slots
from slotcron.errors import InvalidJobError
from slotcron.jobs.registry import Job, Registry, cron, every
from slotcron.schedule.fingerprint import fingerprint
from slotcron.schedule.slots import NEVER

START = datetime(2026, 12, 1, 9, tzinfo=UTC)
END = datetime(2026, 12, 15, 9, tzinfo=UTC)


def campaign(**options: object) -> Job:
    registry = Registry()

    @cron("0 9 * * *", name="campaign", registry=registry, **options)  # type: ignore[arg-type]
    async def job() -> None:
        pass

    [made] = list(registry)
    return made


def test_a_window_keeps_the_slots_from_its_start_and_before_its_end() -> None:
    schedule = campaign(start_at=START, end_at=END).schedule()
    slots, slot = [], datetime(2026, 11, 1, tzinfo=UTC)
    while (slot := schedule.next_after(slot)) < NEVER:
        slots.append(slot)
    assert slots[0] == START, "a slot at the start is in the window"
    assert slots[-1] == END - timedelta(days=1), "a slot at the end is not"
    assert len(slots) == 14
    assert schedule.next_after(END) == NEVER and schedule.next_after(NEVER) == NEVER
    assert schedule.describe() == "0 9 * * *", "stored as the schedule, the window apart"
    assert fingerprint(schedule, START) != fingerprint(campaign().schedule(), START)


def test_the_window_is_stored_with_the_options_and_read_back_from_text() -> None:
    job = campaign(start_at="2026-12-01T09:00:00Z", end_at="2026-12-15T10:00:00+01:00", max_runs=9)
    assert job.options()["max_runs"] == 9
    assert (job.start_at, job.end_at) == (START, END)
    assert job.options()["start_at"] == "2026-12-01T09:00:00+00:00"
    assert job.options()["end_at"] == "2026-12-15T09:00:00+00:00"


def test_check_lists_only_the_slots_in_the_window(capsys: pytest.CaptureFixture[str]) -> None:
    job = campaign(start_at=START, end_at=START + timedelta(days=3))
    slots = _next_slots(job, job.schedule(), datetime(2026, 11, 28, tzinfo=UTC), "UTC")
    assert slots == [START, START + timedelta(days=1), START + timedelta(days=2)]
    assert "its window ends after 3 more slots" in capsys.readouterr().out


def test_an_interval_job_takes_a_window_too() -> None:
    registry = Registry()

    @every(
        minutes=30,
        name="half-hourly",
        start_at=START,
        end_at=START + timedelta(hours=2),
        registry=registry,
    )
    async def job() -> None:
        pass

    [made] = list(registry)
    schedule = made.schedule()
    assert schedule.next_after(datetime(2026, 1, 1, tzinfo=UTC)) == START
    assert schedule.next_after(START + timedelta(minutes=90)) == NEVER


@pytest.mark.parametrize(
    ("options", "field", "said"),
    [
        ({"start_at": datetime(2026, 12, 1)}, "start_at", "has no time zone"),
        ({"end_at": "2026-12-01T09:00"}, "end_at", "has no time zone"),
        ({"start_at": "next week"}, "start_at", "is not an ISO-8601 time"),
        ({"start_at": 1764579600}, "start_at", "must be a datetime"),
        ({"start_at": END, "end_at": START}, "end_at", "is not after start_at"),
        ({"start_at": START, "end_at": START}, "end_at", "is not after start_at"),
        ({"max_runs": 0}, "max_runs", "must be between 1 and"),
        ({"max_runs": 1.5}, "max_runs", "must be a whole number"),
        ({"max_runs": True}, "max_runs", "must be a whole number"),
        ({"max_runs": "3"}, "max_runs", "must be a whole number"),
    ],
)
def test_a_bad_window_is_refused_at_declaration_naming_the_field(
    options: dict[str, object], field: str, said: str
) -> None:
    registry = Registry()
    with pytest.raises(InvalidJobError) as caught:
        cron("0 9 * * *", name="bad", registry=registry, **options)(_noop)  # type: ignore[arg-type]
    assert caught.value.field == field and said in caught.value.problem, caught.value
    assert len(registry) == 0


def test_an_offset_is_kept_as_the_instant_it_names() -> None:
    tokyo = timezone(timedelta(hours=9))
    job = campaign(start_at=datetime(2026, 12, 1, 18, tzinfo=tokyo))
    assert job.start_at == START


async def _noop() -> None:
    pass
