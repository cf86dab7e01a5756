"""Delivering events to one user hook: a bounded queue of its own and a task that drains it.

A user's hook runs the user's code (an HTTP check-in, an audit write): it may be slow, hang or
raise. None of that may reach a run. So announcing an event to a hook is a non-blocking put;
the hook's own task awaits its methods one event at a time, in order. What does not fit in the
queue is dropped, counted (``slotcron_hook_events_dropped_total``, label ``hook``) and logged
once; an exception out of a hook is logged (the first of each method with its traceback, then
at most one line a minute) and the hook receives the next event as before.

At shutdown what is queued gets :data:`DRAIN_SECONDS` to be delivered, then the tasks end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

log = logging.getLogger("slotcron.hooks")

QUEUE_LIMIT = 1000
"""Events waiting for one hook; past it, new events for that hook are dropped (and counted)."""
DRAIN_SECONDS = 2.0
"""How long shutdown waits for the hooks' queued events (every run is recorded by then)."""
CANCEL_SECONDS = 1.0
"""How long shutdown waits for a hook's task to end once cancelled."""
LOG_EVERY_SECONDS = 60.0

Method = Callable[[Any], Awaitable[None]]


class HookQueue:
    """The queue and task of one hook. ``on_dropped`` counts each event dropped."""

    def __init__(self, name: str, on_dropped: Callable[[str], None] = lambda _name: None) -> None:
        self.name = name
        self.on_dropped = on_dropped
        self.dropped = 0
        self.delivered = 0
        self.failed = 0
        self._queue: asyncio.Queue[tuple[Method, Any]] = asyncio.Queue(QUEUE_LIMIT)
        self._task: asyncio.Task[None] | None = None
        self._raised: set[str] = set()
        self._logged_at = -LOG_EVERY_SECONDS

    def put(self, method: Method, event: Any) -> None:
        """Queue ``method(event)`` for the hook's task; never blocks, never raises."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._consume(), name=f"slotcron-hook-{self.name}"
            )
        try:
            self._queue.put_nowait((method, event))
        except asyncio.QueueFull:
            self.dropped += 1
            self.on_dropped(self.name)
            if self.dropped == 1:
                log.warning(
                    "hook %s is behind by %d events: further events are dropped while its "
                    "queue is full (counted in slotcron_hook_events_dropped_total)",
                    self.name,
                    QUEUE_LIMIT,
                )

    async def _consume(self) -> None:
        while True:
            method, event = await self._queue.get()
            try:
                await method(event)
                self.delivered += 1
            except Exception:  # the hook's own failure: said, and the next event delivered
                self.failed += 1
                self._raised_in(getattr(method, "__name__", "?"))
            finally:
                self._queue.task_done()

    def _raised_in(self, what: str) -> None:
        """Log a hook's exception: the first of each method with its traceback, then one line
        a minute at most (a hook that always raises must not flood the log)."""
        now = time.monotonic()
        if what not in self._raised:
            self._raised.add(what)
            log.exception("hook %s raised in %s (it keeps receiving events)", self.name, what)
        elif now - self._logged_at >= LOG_EVERY_SECONDS:
            log.warning(
                "hook %s raised again in %s (%d failures so far)", self.name, what, self.failed
            )
        else:
            return
        self._logged_at = now

    async def stop(self, deadline: float) -> None:
        """Deliver what is queued until ``deadline`` (``time.monotonic()``), then end the task;
        what is left is dropped and said."""
        if self._task is None:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(deadline - time.monotonic(), 0.0)):
                await self._queue.join()
        self._task.cancel()
        # Bounded too: a hook that swallows its cancellation is left behind, not waited for.
        await asyncio.wait({self._task}, timeout=CANCEL_SECONDS)
        self._task = None
        left = self._queue.qsize()
        if left:
            log.warning("hook %s: %d events not delivered before shutdown", self.name, left)
            self._queue = asyncio.Queue(QUEUE_LIMIT)
