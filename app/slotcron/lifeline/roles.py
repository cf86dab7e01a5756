"""Background roles on one supervised base, and the collaborators they share.

Every background role (heartbeat, leader, queued runs, HTTP) is a :class:`Role`: ``start()``
runs its :meth:`Role.run` loop in a task; ``stop()`` ends it. A loop that raises is never
silently gone: the error is logged once with its traceback, the role shows it in
:attr:`Role.problem` (readiness reports it), and the loop is started again after a backoff.
Shutdown stops roles from a list, in order (:mod:`slotcron.service.shutdown`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from slotcron.clock import Clock
from slotcron.lifeline.outage import Backoff, Outage, describe
from slotcron.observe.events import Events
from slotcron.store.database import Database

log = logging.getLogger("slotcron.roles")

RESTART_FIRST = 0.5
RESTART_CAP = 30.0
PROBLEM_SECONDS = 60.0
"""How long after a restart a role still reports the error that stopped it."""
STOP_SECONDS = 10.0
"""How long a stop waits for a cancelled loop to end before it goes on without it."""


async def stop_task(task: asyncio.Task[None], what: str) -> None:
    """Await ``task``, cancelled, for at most :data:`STOP_SECONDS`: a shutdown goes on without a
    loop that does not end (a driver that swallowed its cancellation and waits for an answer
    that never comes: seen once on MariaDB), and says where it is stuck."""
    done, _ = await asyncio.wait({task}, timeout=STOP_SECONDS)
    if not done:
        log.error(
            "%s did not end within %g s of its cancellation; going on without it. Stuck at: %s",
            what,
            STOP_SECONDS,
            " <- ".join(awaiting(task)) or "?",
            extra={"left_behind": what},
        )
    elif not task.cancelled() and (exc := task.exception()) is not None:
        log.error("%s ended on an error while stopping: %s", what, describe(exc))


def awaiting(task: asyncio.Task[Any]) -> list[str]:
    """Where ``task`` waits: each coroutine of its await chain, innermost last."""
    where: list[str] = []
    coro: Any = task.get_coro()
    while coro is not None and len(where) < 50:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is not None:
            where.append(f"{frame.f_code.co_name} ({frame.f_code.co_filename}:{frame.f_lineno})")
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return where


@dataclass(frozen=True)
class Collaborators:
    """What every role works with: the database, the scheduler's clock, this instance's id,
    the outage tracker (each outage logged once) and the events they announce (runs ended,
    slots passed: :mod:`slotcron.observe.events`)."""

    db: Database
    clock: Clock
    instance_id: str
    outage: Outage = field(default_factory=Outage)
    events: Events = field(default_factory=Events)


class Stoppable(Protocol):
    """What shutdown needs of a role."""

    name: str

    async def stop(self) -> None: ...


class Role:
    """A supervised background loop. Subclasses set :attr:`name` and implement :meth:`run`.

    :meth:`run` is expected to loop until cancelled (or until :meth:`request_stop` tells it
    to return); an exception out of it is a bug or an unforeseen failure, and restarts it."""

    name = "role"
    cancel_on_stop = True
    """False for a role whose loop must finish its step (it returns once asked to stop)."""

    def __init__(self, shared: Collaborators) -> None:
        self.shared = shared
        self.db = shared.db
        self.clock = shared.clock
        self.instance_id = shared.instance_id
        self.outage = shared.outage
        self.events = shared.events
        self.restarts = 0
        self._failed_at: float | None = None
        self._last_error = ""
        self._task: asyncio.Task[None] | None = None

    async def run(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        self._task = asyncio.create_task(self._supervise(), name=f"slotcron-{self.name}")

    async def stop(self) -> None:
        await self.request_stop()
        if self._task is not None:
            if self.cancel_on_stop:
                self._task.cancel()
                await stop_task(self._task, f"the {self.name} loop")
            else:
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task
            self._task = None
        await self.stopped()

    async def request_stop(self) -> None:
        """Ask :meth:`run` to return (roles with ``cancel_on_stop = False``)."""

    async def stopped(self) -> None:
        """After the loop ended: release what the role holds."""

    @property
    def problem(self) -> str | None:
        """The error that last stopped this role's loop, while it is recent."""
        if self._failed_at is None or time.monotonic() - self._failed_at > PROBLEM_SECONDS:
            return None
        return f"{self.name} loop failed ({self.restarts} restarts): {self._last_error}"

    async def _supervise(self) -> None:
        backoff = Backoff(first=RESTART_FIRST, cap=RESTART_CAP)
        while True:
            try:
                await self.run()
                return
            except Exception as exc:
                self.restarts += 1
                self._failed_at = time.monotonic()
                self._last_error = describe(exc)
                log.error(
                    "the %s loop failed and restarts in %.1f s: %s",
                    self.name,
                    backoff.delay,
                    self._last_error,
                    exc_info=self.restarts == 1,  # the traceback once; then one line each
                )
                await backoff.wait()
