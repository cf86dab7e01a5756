"""Registration: ``@cron`` and ``@every`` refuse a wrong job at decoration time, naming it.

Every test passes ``registry=Registry()`` so nothing leaks into the process-wide REGISTRY.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

import pytest
import slotcron
from slotcron import InvalidJobError, JobContext
from slotcron.jobs.registry import Registry, cron, every


async def nightly_report() -> None:
    """A module-level job, for the default name."""


async def no_arguments() -> None:
    pass


async def with_context(ctx: JobContext) -> None:
    pass


def plain_function() -> None:
    pass


async def async_generator() -> AsyncIterator[int]:
    yield 1


async def two_parameters(ctx: JobContext, extra: int) -> None:
    pass


async def keyword_only(*, ctx: JobContext) -> None:
    pass


Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def refusal(registry: Registry, decorator: Decorator, func: Callable[..., Any]) -> InvalidJobError:
    """Decorate ``func`` expecting a refusal; check nothing was registered; return the error."""
    with pytest.raises(InvalidJobError) as caught:
        decorator(func)
    assert len(registry) == 0, "a refused job must not be registered"
    return caught.value


def assert_names(error: InvalidJobError, job: str, field: str) -> None:
    message = str(error)
    assert isinstance(error, ValueError)
    assert error.job == job
    assert error.field == field
    assert job in message, f"message does not name the job: {message}"
    assert field in message, f"message does not name the field: {message}"


@pytest.fixture
def registry() -> Registry:
    return Registry()


# --- The error type ------------------------------------------------------------------------


def test_invalid_job_error_is_exported_from_the_package_and_is_a_value_error() -> None:
    assert slotcron.InvalidJobError is InvalidJobError
    assert issubclass(InvalidJobError, ValueError)


# --- @cron refuses a bad schedule ----------------------------------------------------------


@pytest.mark.parametrize(
    "expression",
    [
        pytest.param("61 * * * *", id="minute-out-of-range"),
        pytest.param("0 24 * * *", id="hour-out-of-range"),
        pytest.param("0 0 * 13 *", id="month-out-of-range"),
        pytest.param("60 * * * * *", id="six-field-second-out-of-range"),
        pytest.param("* * * *", id="four-fields"),
        pytest.param("* * * * * * *", id="seven-fields"),
        pytest.param("", id="empty"),
        pytest.param("@reboot", id="unknown-alias-reboot"),
        pytest.param("@fortnightly", id="unknown-alias"),
        pytest.param("0 0 30 2 *", id="impossible-date-30-february"),
        pytest.param("0 0 31 4 *", id="impossible-date-31-april"),
        pytest.param("every minute", id="not-cron-at-all"),
    ],
)
def test_cron_refuses_a_bad_expression_naming_the_job_and_the_schedule(
    registry: Registry, expression: str
) -> None:
    error = refusal(registry, cron(expression, name="nightly", registry=registry), no_arguments)
    assert_names(error, "nightly", "schedule")


def test_cron_refuses_an_unknown_timezone_naming_the_job_and_the_timezone(
    registry: Registry,
) -> None:
    decorator = cron("0 3 * * *", name="nightly", timezone="Mars/Base", registry=registry)
    error = refusal(registry, decorator, no_arguments)
    assert_names(error, "nightly", "timezone")
    assert "Mars/Base" in str(error)


# --- @every refuses a non-positive interval ------------------------------------------------


@pytest.mark.parametrize(
    "interval",
    [
        pytest.param({"seconds": 0}, id="zero-seconds"),
        pytest.param({}, id="no-interval-given"),
        pytest.param({"seconds": -5}, id="negative-seconds"),
        pytest.param({"minutes": -1}, id="negative-minutes"),
        pytest.param({"hours": 0, "days": 0}, id="zero-hours-and-days"),
    ],
)
def test_every_refuses_a_non_positive_interval_naming_the_job_and_the_interval(
    registry: Registry, interval: dict[str, Any]
) -> None:
    error = refusal(registry, every(**interval, name="beat", registry=registry), no_arguments)
    assert_names(error, "beat", "interval")


# --- Both decorators refuse bad options ----------------------------------------------------

DECORATORS: dict[str, Callable[..., Callable[[Any], Any]]] = {
    "cron": lambda **options: cron("*/5 * * * *", **options),
    "every": lambda **options: every(seconds=10, **options),
}


@pytest.mark.parametrize("kind", DECORATORS)
@pytest.mark.parametrize(
    ("option", "value"),
    [
        pytest.param("overlap", "queue", id="unknown-overlap"),
        pytest.param("misfire", "later", id="unknown-misfire"),
        pytest.param("catchup_window", -1, id="negative-catchup-window"),
        pytest.param("timeout", -1, id="negative-timeout"),
        pytest.param("jitter", -1, id="negative-jitter"),
        pytest.param("lease", -1, id="negative-lease"),
        pytest.param("max_attempts", 0, id="zero-max-attempts"),
    ],
)
def test_a_bad_option_is_refused_naming_the_job_and_the_option(
    registry: Registry, kind: str, option: str, value: Any
) -> None:
    decorator = DECORATORS[kind](name="tidy", registry=registry, **{option: value})
    error = refusal(registry, decorator, no_arguments)
    assert_names(error, "tidy", option)
    assert str(value) in str(error), "the message shows the refused value"


# --- Both decorators refuse what is not `async def f()` / `async def f(ctx)` ---------------


@pytest.mark.parametrize("kind", DECORATORS)
@pytest.mark.parametrize(
    ("func", "field"),
    [
        pytest.param(plain_function, "function", id="plain-def"),
        pytest.param(async_generator, "function", id="async-generator"),
        pytest.param(two_parameters, "signature", id="two-parameters"),
        pytest.param(keyword_only, "signature", id="keyword-only-parameter"),
    ],
)
def test_a_function_that_is_not_a_job_is_refused_naming_the_job_and_what_is_wrong(
    registry: Registry, kind: str, func: Callable[..., Any], field: str
) -> None:
    error = refusal(registry, DECORATORS[kind](name="odd", registry=registry), func)
    assert_names(error, "odd", field)


def test_a_refused_function_is_named_by_its_default_name_when_none_is_given(
    registry: Registry,
) -> None:
    error = refusal(registry, cron("* * * * *", registry=registry), plain_function)
    assert_names(error, f"{__name__}.plain_function", "function")


# --- Names ---------------------------------------------------------------------------------


@pytest.mark.parametrize("second", DECORATORS)
def test_a_second_job_under_a_taken_name_is_refused_and_the_first_one_stays(
    registry: Registry, second: str
) -> None:
    cron("0 * * * *", name="report", registry=registry)(no_arguments)
    with pytest.raises(InvalidJobError) as caught:
        DECORATORS[second](name="report", registry=registry)(with_context)
    assert_names(caught.value, "report", "name")
    assert len(registry) == 1
    kept = registry.get("report")
    assert kept is not None and kept.func is no_arguments


def test_a_second_registration_of_the_same_function_under_its_default_name_is_refused(
    registry: Registry,
) -> None:
    cron("0 * * * *", registry=registry)(nightly_report)
    with pytest.raises(InvalidJobError) as caught:
        every(seconds=5, registry=registry)(nightly_report)
    assert_names(caught.value, f"{__name__}.nightly_report", "name")


def test_a_name_longer_than_200_characters_is_refused_naming_the_job_and_the_name(
    registry: Registry,
) -> None:
    long_name = "n" * 40 + "x" * 161
    assert len(long_name) == 201
    error = refusal(registry, cron("* * * * *", name=long_name, registry=registry), no_arguments)
    assert error.field == "name"
    # The message names the job by its beginning rather than repeating 201 characters.
    assert long_name[:40] in str(error)
    assert "name" in str(error)
    assert "201" in str(error)


def test_a_name_of_exactly_200_characters_is_accepted(registry: Registry) -> None:
    name = "n" * 200
    cron("* * * * *", name=name, registry=registry)(no_arguments)
    assert registry.get(name) is not None


def test_the_default_name_is_module_dot_qualname(registry: Registry) -> None:
    cron("@daily", registry=registry)(nightly_report)
    assert [job.name for job in registry] == [f"{__name__}.nightly_report"]


def test_the_default_name_of_a_nested_function_uses_its_qualname(registry: Registry) -> None:
    async def inner() -> None:
        pass

    every(seconds=30, registry=registry)(inner)
    expected = f"{__name__}.{inner.__qualname__}"
    assert "<locals>" in expected
    assert registry.get(expected) is not None


def test_a_given_name_replaces_the_default_one(registry: Registry) -> None:
    cron("@daily", name="nightly", registry=registry)(nightly_report)
    assert [job.name for job in registry] == ["nightly"]


# --- Accepted schedules ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "expression",
    [
        "0 */10 * * *",
        "*/5 * * * * *",
        "0 30 9 * * 1-5",
        "@yearly",
        "@monthly",
        "@weekly",
        "@daily",
        "@hourly",
        "@DAILY",
    ],
)
def test_five_field_six_field_and_alias_expressions_are_accepted(
    registry: Registry, expression: str
) -> None:
    cron(expression, name="ok", registry=registry)(no_arguments)
    job = registry.get("ok")
    assert job is not None
    assert job.kind == "cron"
    assert job.expression == expression


def test_a_six_field_expression_puts_seconds_first_and_fires_every_five_seconds(
    registry: Registry,
) -> None:
    cron("*/5 * * * * *", name="sync", timezone="Asia/Seoul", registry=registry)(with_context)
    job = registry.get("sync")
    assert job is not None
    schedule = job.schedule()
    slot = datetime(2026, 1, 1, 0, 0, 0, tzinfo=UTC)
    slots = []
    for _ in range(4):
        slot = schedule.next_after(slot)
        slots.append(slot)
    assert [s.second for s in slots] == [5, 10, 15, 20]
    assert {s.minute for s in slots} == {0}


def test_a_job_without_its_own_timezone_takes_the_service_default(registry: Registry) -> None:
    cron("0 9 * * *", name="morning", registry=registry)(no_arguments)
    job = registry.get("morning")
    assert job is not None and job.timezone is None
    start = datetime(2026, 1, 1, tzinfo=UTC)
    assert job.schedule("Asia/Seoul").next_after(start) == datetime(2026, 1, 2, 0, 0, tzinfo=UTC)
    assert job.schedule("UTC").next_after(start) == datetime(2026, 1, 1, 9, 0, tzinfo=UTC)


# --- Accepted functions ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", DECORATORS)
@pytest.mark.parametrize(
    ("func", "takes_context"),
    [
        pytest.param(no_arguments, False, id="zero-parameters"),
        pytest.param(with_context, True, id="one-context-parameter"),
    ],
)
def test_a_job_takes_no_argument_or_one_context_and_registration_records_which(
    registry: Registry, kind: str, func: Callable[..., Any], takes_context: bool
) -> None:
    returned = DECORATORS[kind](name="job", registry=registry)(func)
    assert returned is func, "the decorator hands back the function unchanged"
    job = registry.get("job")
    assert job is not None
    assert job.takes_context is takes_context


def test_options_are_recorded_with_the_contract_defaults(registry: Registry) -> None:
    cron("0 * * * *", name="defaults", registry=registry)(no_arguments)
    job = registry.get("defaults")
    assert job is not None
    assert job.options() == {
        "overlap": "forbid",
        "misfire": "skip",
        "catchup_window": 3600,
        "lease": None,
        "timeout": None,
        "max_attempts": 1,
        "retry_backoff": 10,
        "jitter": 0,
        "restartable": True,
        "enabled": True,
        "alert": True,
        "calendar": None,
        "exclude_dates": [],
        "start_at": None,
        "end_at": None,
        "max_runs": None,
    }
    assert job.timezone is None


def test_every_records_a_fixed_rate_interval_job(registry: Registry) -> None:
    every(minutes=1, seconds=30, name="beat", registry=registry)(no_arguments)
    job = registry.get("beat")
    assert job is not None
    assert job.kind == "interval"
    assert job.trigger == "interval"
    assert float(job.expression) == 90


def test_registering_into_a_fresh_registry_leaves_the_global_one_untouched(
    registry: Registry,
) -> None:
    from slotcron.jobs.registry import REGISTRY

    before = len(REGISTRY)
    cron("0 * * * *", name="isolated-job", registry=registry)(no_arguments)
    assert len(REGISTRY) == before
    assert REGISTRY.get("isolated-job") is None
