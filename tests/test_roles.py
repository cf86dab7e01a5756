"""Background roles are supervised: a loop that raises is logged, restarted and reported."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import UTC, datetime
from pathlib import Path

import pytest
from slotcron.clock import ManualClock
from slotcron.lifeline import roles
from slotcron.lifeline.outage import DB_ERRORS
from slotcron.lifeline.roles import Collaborators, Role
from slotcron.store.database import Database
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from tests.conftest import wait_for


class Flaky(Role):
    """Raises on its first two runs, then loops counting its steps."""

    name = "flaky"

    def __init__(self, shared: Collaborators) -> None:
        super().__init__(shared)
        self.runs = 0
        self.steps = 0

    async def run(self) -> None:
        self.runs += 1
        if self.runs <= 2:
            raise RuntimeError(f"bug number {self.runs}")
        while True:
            self.steps += 1
            await asyncio.sleep(0.001)


@pytest.fixture
def shared(tmp_path: Path) -> Collaborators:
    # These roles never touch their database: a handle to an unused SQLite file is enough.
    url = make_url(f"sqlite+aiosqlite:///{tmp_path / 'unused.db'}")
    return Collaborators(
        db=Database.connect(url, 1),
        clock=ManualClock(datetime(2030, 1, 1, tzinfo=UTC)),
        instance_id="test",
    )


async def test_a_loop_that_raises_is_restarted_logged_once_with_its_traceback_and_reported(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, shared: Collaborators
) -> None:
    monkeypatch.setattr(roles, "RESTART_FIRST", 0.01)
    caplog.set_level(logging.ERROR, logger="slotcron.roles")
    role = Flaky(shared)
    assert role.problem is None
    role.start()
    try:
        await wait_for(lambda: role.steps > 10, timeout=5, what="the restarted loop to run")
        assert role.runs == 3 and role.restarts == 2
        problem = role.problem
        assert problem is not None and "flaky" in problem and "bug number 2" in problem
        failures = [r for r in caplog.records if "flaky loop failed" in r.getMessage()]
        assert len(failures) == 2
        assert failures[0].exc_info, "the first failure carries its traceback"
        assert not failures[1].exc_info, "later ones are one line each"
    finally:
        await role.stop()
    assert role._task is None


async def test_a_problem_is_reported_only_while_it_is_recent(
    monkeypatch: pytest.MonkeyPatch, shared: Collaborators
) -> None:
    monkeypatch.setattr(roles, "RESTART_FIRST", 0.01)
    role = Flaky(shared)
    role.start()
    try:
        await wait_for(lambda: role.steps > 0, timeout=5, what="the restarted loop to run")
        assert role.problem is not None
        monkeypatch.setattr(roles, "PROBLEM_SECONDS", 0.0)
        assert role.problem is None
    finally:
        await role.stop()


async def test_stopping_a_role_that_must_finish_its_step_waits_for_it(
    shared: Collaborators,
) -> None:
    class Patient(Role):
        name = "patient"
        cancel_on_stop = False

        def __init__(self, shared: Collaborators) -> None:
            super().__init__(shared)
            self.closing = asyncio.Event()
            self.finished_step = False
            self.released = False

        async def request_stop(self) -> None:
            self.closing.set()

        async def stopped(self) -> None:
            self.released = True

        async def run(self) -> None:
            await self.closing.wait()
            await asyncio.sleep(0.05)  # the step under way when asked to stop
            self.finished_step = True

    role = Patient(shared)
    role.start()
    await asyncio.sleep(0.02)
    await role.stop()
    assert role.finished_step and role.released


async def test_a_stop_whose_cancellation_a_driver_turned_into_its_own_error_still_ends_the_loop(
    shared: Collaborators,
) -> None:
    """A MariaDB leader hung a full run's teardown: the stop's cancellation landed inside a
    database call, came back as the driver's error, and the loop took it for an outage and slept
    on, still cancelling, while the stop waited for it."""

    class Housekeeping(Role):
        """Shaped like the leader's loop: a database call whose errors are an outage, then a
        sleep. Its call turns a cancellation into the driver's own error."""

        name = "housekeeping"

        def __init__(self, shared: Collaborators) -> None:
            super().__init__(shared)
            self.in_call = asyncio.Event()
            self.slept_on = False

        async def _call(self) -> None:
            self.in_call.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                raise OperationalError(
                    "SELECT 1", None, Exception("Lost connection to server during query")
                ) from None

        async def run(self) -> None:
            while True:
                try:
                    await self._call()
                except DB_ERRORS as exc:
                    self.outage.failed(exc, "doing cluster housekeeping")
                self.slept_on = True
                await self.clock.sleep(20)

    role = Housekeeping(shared)
    role.start()
    await asyncio.wait_for(role.in_call.wait(), 5)
    await asyncio.wait_for(role.stop(), 5)  # before: waited forever
    assert not role.slept_on
    assert role.outage.failures == 0  # a stop, not an outage


class Stuck(Role):
    """Swallows its cancellation (as a driver did once) and waits for what never comes."""

    name = "stuck"

    def __init__(self, shared: Collaborators) -> None:
        super().__init__(shared)
        self.never: asyncio.Future[None] | None = None

    async def run(self) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(3600)
        self.never = asyncio.get_running_loop().create_future()
        await self.never


async def test_a_stop_goes_on_without_a_loop_that_does_not_end_and_says_where_it_is_stuck(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, shared: Collaborators
) -> None:
    monkeypatch.setattr(roles, "STOP_SECONDS", 0.2)
    caplog.set_level(logging.ERROR, logger="slotcron.roles")
    role = Stuck(shared)
    role.start()
    await asyncio.sleep(0.01)
    async with asyncio.timeout(5):  # without the bound, this stop never returns
        await role.stop()
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "the stuck loop did not end within 0.2 s of its cancellation" in errors[0]
    assert "run (" in errors[0] and "test_roles.py" in errors[0]  # the await chain, to its end
    assert role.never is not None and not role.never.done()
    role.never.cancel()
