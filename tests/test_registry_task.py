"""``@task``: a coroutine with the options of ``@cron`` and no schedule (issue 15)."""

from __future__ import annotations

import pytest
from slotcron import InvalidJobError, JobContext, task
from slotcron.jobs.registry import Registry, cron


def test_a_task_is_registered_with_its_options_and_is_not_a_scheduled_job() -> None:
    registry = Registry()

    @task(name="reports.send", max_attempts=3, timezone="Asia/Seoul", registry=registry)
    async def send(ctx: JobContext) -> None:
        pass

    registered = registry.task("reports.send")
    assert registered is not None and registered.func is send and registered.takes_context
    assert registered.options()["max_attempts"] == 3 and registered.timezone == "Asia/Seoul"
    assert list(registry) == []  # nothing for the planner to fire by itself
    assert registry.get("reports.send") is None


def test_a_task_and_a_job_share_one_namespace() -> None:
    registry = Registry()

    @cron("* * * * *", name="shared", registry=registry)
    async def job() -> None:
        pass

    with pytest.raises(InvalidJobError, match="'shared': name"):

        @task(name="shared", registry=registry)
        async def same() -> None:
            pass


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"max_attempts": 0}, "max_attempts"),
        ({"timezone": "Nowhere/X"}, "timezone"),
        ({"overlap": "sometimes"}, "overlap"),
        ({"jitter": -1}, "jitter"),
    ],
)
def test_a_task_with_a_bad_option_is_refused_naming_it(
    options: dict[str, object], field: str
) -> None:
    with pytest.raises(InvalidJobError) as refused:

        @task(name="bad", registry=Registry(), **options)  # type: ignore[arg-type]
        async def bad() -> None:
            pass

    assert refused.value.field == field


def test_a_task_must_be_a_coroutine_and_takes_no_schedule() -> None:
    with pytest.raises(InvalidJobError, match="function"):
        task(name="plain", registry=Registry())(lambda: None)  # type: ignore[type-var]
    with pytest.raises(TypeError, match="unexpected keyword argument 'seconds'"):
        task(seconds=5)  # type: ignore[call-arg]
