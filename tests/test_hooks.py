"""Hooks without a database: ``SCHEDULER_HOOKS`` loading, the per-hook queue (a raising hook
is logged once and keeps receiving, overflow is counted and logged once, shutdown drains for a
bounded time), ``wrap_run``'s guarantees, and that a method left as the base's costs nothing."""

from __future__ import annotations

import asyncio
import logging
import sys
import time
import types
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import pytest
from slotcron import Hook, JobContext, RunEvent, SlotsEvent
from slotcron.errors import ConfigError
from slotcron.observe import delivery
from slotcron.observe.events import Events, Observer, load_hooks
from slotcron.observe.wrapping import around
from slotcron.store.claims import Claim

from tests.conftest import wait_for

SLOT = datetime(2026, 1, 1, tzinfo=UTC)


class Heard(Hook):
    def __init__(self) -> None:
        self.runs: list[RunEvent] = []
        self.slots: list[SlotsEvent] = []

    async def run_finished(self, run: RunEvent) -> None:
        self.runs.append(run)

    async def slots_passed(self, event: SlotsEvent) -> None:
        self.slots.append(event)


@pytest.fixture
def hooks_module() -> Iterator[types.ModuleType]:
    module = types.ModuleType("user_hooks")
    module.Heard = Heard  # type: ignore[attr-defined]
    module.instance = Heard()  # type: ignore[attr-defined]
    module.not_a_hook = 42  # type: ignore[attr-defined]
    sys.modules["user_hooks"] = module
    yield module
    del sys.modules["user_hooks"]


def test_scheduler_hooks_names_instances_or_classes(hooks_module: types.ModuleType) -> None:
    loaded = load_hooks(["user_hooks:instance", " user_hooks:Heard ", ""])
    assert loaded[0] is hooks_module.instance
    assert isinstance(loaded[1], Heard) and loaded[1] is not hooks_module.instance


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ("user_hooks", "not module:attribute"),
        ("no_such_module_here:x", "importing 'no_such_module_here' failed"),
        ("user_hooks:missing", "has no attribute 'missing'"),
        ("user_hooks:not_a_hook", "not a slotcron.Hook"),
    ],
)
def test_a_bad_hook_spec_is_a_configuration_error_naming_the_variable(
    hooks_module: types.ModuleType, spec: str, said: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load_hooks([spec])
    assert caught.value.variable == "SCHEDULER_HOOKS"
    assert said in str(caught.value)


def finished(job: str = "j", execution_id: int = 1) -> RunEvent:
    return RunEvent(job, SLOT, execution_id, 1, "cron", "me", "COMPLETED")


async def test_a_raising_hook_is_logged_once_and_keeps_receiving(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[int] = []

    class Raising(Hook):
        async def run_finished(self, run: RunEvent) -> None:
            calls.append(run.execution_id)
            raise RuntimeError("always")

    queue = delivery.HookQueue("raising")
    hook = Raising()
    for i in range(5):
        queue.put(hook.run_finished, finished(execution_id=i))
    await wait_for(lambda: len(calls) == 5, what="every event delivered")
    await queue.stop(time.monotonic() + 1)
    logged = [r for r in caplog.records if "raised in run_finished" in r.getMessage()]
    assert len(logged) == 1 and logged[0].exc_info is not None
    assert queue.failed == 5


async def test_overflow_is_counted_and_logged_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(delivery, "QUEUE_LIMIT", 3)
    counted: list[str] = []
    release = asyncio.Event()

    async def stuck(event: Any) -> None:
        await release.wait()

    queue = delivery.HookQueue("stuck", counted.append)
    for i in range(10):
        queue.put(stuck, finished(execution_id=i))
    # One taken by the task (once it runs), three waiting: six dropped at least.
    assert queue.dropped >= 6 and counted == ["stuck"] * queue.dropped
    assert len([r for r in caplog.records if "further events are dropped" in r.getMessage()]) == 1
    began = time.monotonic()
    await queue.stop(time.monotonic() + 0.3)
    assert time.monotonic() - began < 2, "the drain is bounded"


async def test_events_do_not_queue_what_no_hook_listens_to() -> None:
    heard = Heard()
    events = Events([], [Hook(), heard])
    assert not events.hooked("run_started") and events.hooked("run_finished")
    assert events.wrappers == ()
    claim = Claim(9, "j", SLOT, "cron", "MISSED", 1, None, None, reason="misfire")
    events.claimed(claim)
    await wait_for(lambda: heard.slots, what="the slots event")
    assert heard.slots == [SlotsEvent("j", "MISSED", "misfire", SLOT, SLOT, 1)]
    await events.stop()


async def test_observers_are_called_inline_with_the_same_event() -> None:
    seen: list[tuple[str, Any]] = []

    class Watching(Observer):
        def slots_passed(self, event: SlotsEvent, record: Claim, together: int | None) -> None:
            seen.append(("passed", event))

    heard = Heard()
    events = Events([Watching()], [heard])
    events.claimed(Claim(9, "j", SLOT, "cron", "SKIPPED", 1, None, None, reason="paused"))
    assert len(seen) == 1, "an observer hears it before the call returns"
    await wait_for(lambda: heard.slots, what="the hook's copy")
    assert heard.slots[0] is seen[0][1]
    await events.stop()


def context() -> JobContext:
    return JobContext("j", SLOT, 1, 1, "cron", "me", logging.getLogger("test"))


async def test_a_wrapper_sees_the_body_and_its_error_but_cannot_change_the_outcome(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[str] = []

    @asynccontextmanager
    async def swallowing(ctx: JobContext) -> AsyncIterator[None]:
        seen.append("in")
        try:
            yield
        except ValueError:
            seen.append("saw the error")  # and swallows it: the run must fail all the same

    def failing(ctx: JobContext) -> Any:
        raise RuntimeError("wrapper broken on entry")

    async def body() -> None:
        seen.append("body")
        raise ValueError("the body's")

    with pytest.raises(ValueError, match="the body's"):
        await around([failing, swallowing], context(), body)
    assert seen == ["in", "body", "saw the error"]
    assert any("failed on entry" in r.getMessage() for r in caplog.records)
