"""The watchdog: leases kept while a job blocks the event loop, and the stall named.

A job that calls blocking code (``time.sleep``, a synchronous driver, a long computation)
holds the event loop: nothing else on it runs, the heartbeat included. Without help its leases
would lapse, another instance would judge the instance dead and run its slots again, and a run
that completed would be recorded ``ABANDONED``. A blocked loop is a slow job, not a dead
instance (docs/explanation/guarantees.md, guarantee 7).

So a thread of its own watches the loop: a task on the loop marks each tick; when the loop has
not ticked for :data:`STALL` seconds, the thread renews the instance's leases itself, through
a connection of its own, every heartbeat period until the loop is back (and extends the runs'
deadlines as the heartbeat does). When the loop comes back, it logs one WARNING naming the job
found on the loop's stack and how long it blocked, and counts it in ``/metrics``. While the loop
runs freely the watchdog asks the database nothing.

Its renewal is the heartbeat's (:func:`slotcron.store.runs.renew`), with the same incarnation check:
once the instance id is found held by another process, the watchdog renews nothing more and
hands the finding to the loop (the heartbeat's ``lose_id``: fence, log, shut down), which runs
it as soon as the loop is free again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType

from slotcron.clock import Clock
from slotcron.jobs.registry import Job
from slotcron.lifeline.inflight import Runs, trusted_until
from slotcron.lifeline.outage import DB_ERRORS, describe
from slotcron.observe.events import Events
from slotcron.store import runs as run_store
from slotcron.store.database import Database
from slotcron.store.runs import IncarnationLost

log = logging.getLogger("slotcron.watchdog")

TICK = 0.1
"""Seconds between the loop's marks (and the thread's looks)."""
STALL = 1.0
"""Seconds without a mark after which the loop counts as blocked."""


class Watchdog:
    name = "watchdog"

    def __init__(
        self,
        *,
        db: Database,
        clock: Clock,
        instance_id: str,
        runs: Runs,
        jobs: list[Job],
        period: float,
        events: Events,
        instance_state: Callable[[], str],
        incarnation: Callable[[], str | None],
        on_id_taken: Callable[[], None],
    ) -> None:
        self._db = db
        self.clock = clock
        self.instance_id = instance_id
        self.runs = runs
        self.period = period
        self.events = events
        self.instance_state = instance_state
        self.incarnation = incarnation
        self.on_id_taken = on_id_taken
        """Run on the loop (thread-safely) once the renewal finds the id held by another."""
        self.id_taken = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._codes = {job.func.__code__: job.name for job in jobs if hasattr(job.func, "__code__")}
        self._mark = time.monotonic()
        self._stop = threading.Event()
        self._wake = threading.Event()
        """Set when runs begin with none before (and at stop): the thread sleeps on it."""
        self._thread: threading.Thread | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._loop_thread = threading.get_ident()
        self.stalls = 0
        self.renewals = 0

    def start(self) -> None:
        self._loop_thread = threading.get_ident()
        self._loop = asyncio.get_running_loop()
        self._mark = time.monotonic()
        self.runs.signal_busy(self._wake)
        self._ticker = asyncio.create_task(self._tick(), name="slotcron-watchdog-tick")
        self._thread = threading.Thread(target=self._watch, name="slotcron-watchdog", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 10)

    async def _tick(self) -> None:
        """Mark the loop's ticks while runs are in flight; with none, wait for one (an idle
        instance's loop is not woken for the watchdog)."""
        while True:
            self._mark = time.monotonic()
            if not len(self.runs):
                await self.runs.wait_busy()
                self._mark = time.monotonic()
            await asyncio.sleep(TICK)

    # The thread ------------------------------------------------------------------------------

    def _watch(self) -> None:
        """While runs are in flight, look every tick; with none, sleep until one begins (told
        by the call that adds it, even if its job then blocks the loop)."""
        stalled_since: float | None = None
        culprit = "?"
        renewed_at = 0.0
        watched_from = time.monotonic()
        db: Database | None = None
        with asyncio.Runner() as runner:
            try:
                while not self._stop.is_set():
                    if not len(self.runs):
                        if stalled_since is not None:  # the loop came back and ended them
                            self._report(culprit, stalled_since)
                            stalled_since = None
                        self._wake.wait()
                        self._wake.clear()
                        watched_from = time.monotonic()
                        continue
                    if self._stop.wait(TICK):
                        break
                    now = time.monotonic()
                    # A mark older than the first run is from before there was anything to watch.
                    last = max(self._mark, watched_from)
                    if now - last < STALL:
                        if stalled_since is not None:
                            self._report(culprit, stalled_since)
                            stalled_since = None
                        continue
                    if stalled_since is None:
                        stalled_since = last
                        culprit = self._blocking_job()
                    if now - renewed_at >= self.period and not self.id_taken:
                        renewed_at = now
                        if db is None:
                            db = self._db.sibling(1)
                        runner.run(self._renew(db))
                if stalled_since is not None:  # stopped (on the loop: it is back) before a look
                    self._report(culprit, stalled_since)
            finally:
                if db is not None:
                    runner.run(db.close())

    def _blocking_job(self) -> str:
        """The job whose code is on the blocked loop's stack, or ``?``."""
        frame: FrameType | None = sys._current_frames().get(self._loop_thread)
        while frame is not None:
            name = self._codes.get(frame.f_code)
            if name is not None:
                return name
            frame = frame.f_back
        return "?"

    async def _renew(self, db: Database) -> None:
        sent = self.clock.monotonic()
        try:
            handles = list(self.runs)
        except RuntimeError:  # the registry changed under us: next look
            return
        counts: dict[int, int] = {}
        for handle in handles:
            counts[handle.lease_ms] = counts.get(handle.lease_ms, 0) + 1
        try:
            async with asyncio.timeout(max(self.period, 1.0)):
                still_ours = await run_store.renew(
                    db,
                    instance_id=self.instance_id,
                    now=self.clock.now(),
                    lease_counts=counts,
                    instance_state=self.instance_state(),
                    incarnation=self.incarnation(),
                    ours=[handle.claim.key for handle in handles],
                )
        except IncarnationLost:
            # Renew nothing more: the runs' deadlines pass and they are fenced by time.
            self.id_taken = True
            if self._loop is not None:
                with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                    self._loop.call_soon_threadsafe(self.on_id_taken)
            return
        except DB_ERRORS as exc:
            log.warning("could not renew leases while the loop is blocked: %s", describe(exc))
            return
        self.renewals += 1
        for handle in handles:
            if still_ours is None or handle.id in still_ours:
                handle.deadline = max(handle.deadline, trusted_until(sent, handle.lease_ms))
        # A run no longer ours is fenced by the heartbeat once the loop is back.

    def _report(self, job: str, since: float) -> None:
        """Log and count the stall that began at ``since`` and just ended: at the loop's first
        mark after it, or now if the loop ended its runs before it marked again."""
        seconds = (self._mark if self._mark > since else time.monotonic()) - since
        self.stalls += 1
        self.events.loop_blocked(job, seconds)
        log.warning(
            "job %s blocked the event loop for %.1f s (leases were renewed from the watchdog "
            "thread meanwhile); await instead of blocking, or run blocking work in a thread "
            "(asyncio.to_thread)",
            job,
            seconds,
        )
