"""The limits of a schedule and a job, checked in one place each (issue 26, item 5), and a stored
row read back through the same checks (item 8): what a write refuses, a read quarantines.

A refusal names the field; none shows where the zone database is installed or echoes a long
value back.
"""

from __future__ import annotations

import json
import sys
import zoneinfo
from collections.abc import Iterator
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest
from slotcron import InvalidJobError
from slotcron.jobs.registry import Registry, cron, every, task
from slotcron.jobs.schedule_fields import MAX_DIGITS, MAX_PARAMS_BYTES
from slotcron.jobs.schedule_rows import read_row
from slotcron.jobs.schedules import (
    ScheduleRecord,
    ScheduleSpec,
    TaskInfo,
    UnreadableSpec,
    changed_spec,
    new_spec,
    schedule_json,
)
from slotcron.schedule.slots import zone_problem

TASK = TaskInfo("reports.send", {}, None)
CONTROL = ["a\nb", "a\rb", "a\tb", "a\x1b[31mb", "a\x00b", "a\x7fb", "a\x85b", "a\x9bb"]
NOT_ZONES = ["America", "Etc", "", "America/", "../zoneinfo/UTC", "/etc/localtime", "localtime"]


def spec(**fields: Any) -> ScheduleSpec:
    return new_spec({"task": TASK.name, **fields}, task=TASK, default_timezone="UTC")


def refused(field: str, **fields: Any) -> InvalidJobError:
    with pytest.raises(InvalidJobError) as caught:
        spec(**fields)
    assert caught.value.field == field, caught.value
    return caught.value


@pytest.fixture
def unlimited_digits() -> Iterator[None]:
    """A process that lifted Python's digit limit, as the client that stored a 5,000-digit
    integer had."""
    before = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    yield
    sys.set_int_max_str_digits(before)


# --- every: at least one second ------------------------------------------------------------


@pytest.mark.parametrize("seconds", [0.001, 0.5, 0.999])
def test_a_schedule_every_less_than_a_second_is_refused_naming_every(seconds: float) -> None:
    error = refused("every", every=seconds)
    assert "1 s" in str(error)


def test_a_schedule_every_second_is_accepted() -> None:
    assert spec(every=1).expression == "1"
    assert spec(every=1.5).expression == "1.5"


@pytest.mark.parametrize("seconds", [0.001, 0.5])
def test_an_every_job_of_less_than_a_second_is_refused_at_decoration(seconds: float) -> None:
    registry = Registry()
    with pytest.raises(InvalidJobError) as caught:
        every(seconds=seconds, name="fast", registry=registry)(_job)
    assert (caught.value.job, caught.value.field) == ("fast", "interval")
    assert len(registry) == 0


def test_an_every_job_of_one_second_is_accepted() -> None:
    registry = Registry()
    every(seconds=1, name="beat", registry=registry)(_job)
    assert [j.expression for j in registry] == ["1"]


async def _job() -> None:
    pass


# --- ids and names: no control characters, at most 200 characters --------------------------


@pytest.mark.parametrize("text", CONTROL)
def test_an_id_or_a_task_with_a_control_character_is_refused_naming_it(text: str) -> None:
    error = refused("id", every=60, id=text)
    assert text not in str(error), "the message escapes what it refuses"
    with pytest.raises(InvalidJobError) as caught:
        new_spec({"task": text, "every": 60}, task=TASK, default_timezone="UTC")
    assert caught.value.field == "task"


@pytest.mark.parametrize("text", CONTROL)
def test_a_job_or_task_name_with_a_control_character_is_refused_at_decoration(text: str) -> None:
    registry = Registry()
    for decorator in (
        cron("* * * * *", name=text, registry=registry),
        every(seconds=5, name=text, registry=registry),
        task(name=text, registry=registry),
    ):
        with pytest.raises(InvalidJobError) as caught:
            decorator(_job)
        assert caught.value.field == "name"
        assert text not in str(caught.value)
    assert len(registry) == 0 and registry.tasks() == []


def test_an_id_of_200_characters_is_accepted_and_of_201_refused() -> None:
    assert spec(every=60, id="i" * 200).id == "i" * 200
    refused("id", every=60, id="i" * 201)


def test_ids_differing_in_case_accents_or_trailing_spaces_are_different_ids() -> None:
    ids = ["Tenant/Alpha", "tenant/alpha", "Ténant/Alpha", "Tenant/Alpha "]
    assert [spec(every=60, id=i).id for i in ids] == ids


# --- time zones: a zone, not a directory, an empty name or a path ---------------------------


@pytest.mark.parametrize("zone", NOT_ZONES)
def test_a_timezone_that_is_not_a_zone_is_refused_naming_timezone(zone: str) -> None:
    error = refused("timezone", cron="0 9 * * *", timezone=zone)
    assert "site-packages" not in str(error) and "/usr/share" not in str(error)
    with pytest.raises(InvalidJobError) as caught:
        changed_spec(spec(every=60, id="s"), {"timezone": zone})
    assert caught.value.field == "timezone"
    registry = Registry()
    with pytest.raises(InvalidJobError) as caught:
        cron("0 9 * * *", name="nightly", timezone=zone, registry=registry)(_job)
    assert caught.value.field == "timezone"


def test_no_refused_zone_shows_where_the_zone_database_is() -> None:
    places = [*zoneinfo.TZPATH, "site-packages", "tzdata"]
    for zone in [*NOT_ZONES, "Mars/Olympus", "zone.tab", "x" * 65]:
        problem = zone_problem(zone)
        assert problem is not None
        assert not any(place in problem for place in places), problem


@pytest.mark.parametrize("zone", ["UTC", "Europe/Paris", "America/Argentina/Buenos_Aires"])
def test_a_real_zone_is_accepted(zone: str) -> None:
    assert spec(cron="0 9 * * *", timezone=zone).timezone == zone


# --- params: at most 64 KB, numbers at most 64 digits ---------------------------------------


def test_params_of_64_kb_are_accepted_and_past_it_refused() -> None:
    fill = "x" * (MAX_PARAMS_BYTES - len('{"p": ""}'))
    assert len(json.dumps({"p": fill})) == MAX_PARAMS_BYTES
    assert spec(every=60, params={"p": fill}).params == {"p": fill}
    error = refused("params", every=60, params={"p": fill + "x"})
    assert fill not in str(error)


def test_a_number_of_64_digits_is_accepted_and_of_65_refused() -> None:
    assert spec(every=60, params={"n": 10**63}).params == {"n": 10**63}
    assert spec(every=60, params={"n": -(10**63), "f": 1.5e300}).params["n"] == -(10**63)
    error = refused("params", every=60, params={"n": 10**MAX_DIGITS})
    assert "65 digits" in str(error)


def test_a_digit_string_longer_than_64_is_a_string_not_a_number() -> None:
    assert spec(every=60, params={"s": "9" * 500}).params == {"s": "9" * 500}


def test_a_5000_digit_integer_is_refused_even_where_the_digit_limit_was_lifted(
    unlimited_digits: None,
) -> None:
    error = refused("params", every=60, params={"tenant": 10**4999})
    assert "5000 digits" in str(error)


def test_params_nested_too_deep_are_refused_naming_params() -> None:
    nested: Any = []
    for _ in range(100_000):
        nested = [nested]
    refused("params", every=60, params={"deep": nested})


# --- a stored row read back: unreadable rows are quarantined, with why ---------------------


def row(**changes: Any) -> SimpleNamespace:
    stored = {
        "name": "tenant-1",
        "task": TASK.name,
        "kind": "interval",
        "schedule": "60",
        "timezone": "UTC",
        "params": '{"tenant": 1}',
        "options": '{"max_attempts": 3, "alert": false}',
        "jitter": None,
        "paused": False,
    }
    return SimpleNamespace(**{**stored, **changes})


def test_a_good_row_reads_as_its_spec() -> None:
    read = read_row(row())
    assert not isinstance(read, UnreadableSpec)
    assert (read.id, read.kind, read.expression) == ("tenant-1", "interval", "60")
    assert read.params == {"tenant": 1}


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        pytest.param({"params": '{"tenant": ' + "7" * 5000 + "}"}, "params", id="5000-digits"),
        pytest.param({"params": '{"tenant": 1'}, "params", id="invalid-json"),
        pytest.param({"params": "[1, 2]"}, "params", id="params-not-an-object"),
        pytest.param({"params": '{"x": NaN}'}, "params", id="nan"),
        pytest.param({"params": '{"x": 1e999}'}, "params", id="infinite"),
        pytest.param({"kind": "cron", "schedule": "every tuesday"}, "cron", id="unknown-cron"),
        pytest.param({"kind": "sometimes"}, "cron", id="unknown-kind"),
        pytest.param({"schedule": "0.001"}, "every", id="every-millisecond"),
        pytest.param({"schedule": "soon"}, "every", id="every-not-a-number"),
        pytest.param({"timezone": "Mars/Olympus"}, "timezone", id="unknown-zone"),
        pytest.param({"timezone": "America"}, "timezone", id="zone-directory"),
        pytest.param({"jitter": float("nan")}, "jitter", id="nan-jitter"),
        pytest.param({"options": '{"max_attempts": null}'}, "options", id="null-option"),
        pytest.param({"options": "{"}, "options", id="invalid-options"),
    ],
)
def test_a_row_no_write_would_accept_reads_as_unreadable_naming_the_field(
    changes: dict[str, Any], field: str
) -> None:
    read = read_row(row(**changes))
    assert isinstance(read, UnreadableSpec)
    assert list(read.problems) == [field], read.problems
    assert read.error.startswith(f"{field}: ")
    assert "7777777777" not in read.error, "the error does not echo the stored value"
    assert read.schedule().describe().startswith("unreadable")
    with pytest.raises(ValueError, match="unreadable"):
        read.schedule().next_after(datetime.now(UTC))


def test_an_unreadable_row_is_shown_as_stored_with_its_error() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    broken = read_row(row(params="{oops", schedule="soon"))
    shown = schedule_json(ScheduleRecord(broken, now, now, now))
    assert shown["params"] is None and shown["every"] == "soon"
    assert shown["error"].startswith("every: ") and "params: " in shown["error"]
    good = schedule_json(ScheduleRecord(read_row(row()), now, now, now))
    assert "error" not in good and good["params"] == {"tenant": 1}


def test_an_update_mends_an_unreadable_field_given_anew_and_refuses_to_keep_one() -> None:
    broken = read_row(row(params='{"n": ' + "1" * 100 + "}"))
    with pytest.raises(InvalidJobError) as caught:
        changed_spec(broken, {"every": 120})
    assert caught.value.field == "params" and "give a new one" in str(caught.value)
    mended = changed_spec(broken, {"params": {"n": 1}})
    assert type(mended) is ScheduleSpec and mended.params == {"n": 1}
    bad_options = read_row(row(options='{"alert": "sometimes"}'))
    with pytest.raises(InvalidJobError, match="remove the schedule and add it again"):
        changed_spec(bad_options, {"params": {}})
