"""Taking QUEUED executions (manual runs, restarts, retries) on any live instance.

Woken at the moment a retry this instance queued becomes due, and, on PostgreSQL, by the
notification every writer of a QUEUED execution sends (LISTEN/NOTIFY): an idle instance then
asks the database nothing, polling only every :data:`LISTENING_POLL_SECONDS` in case a
notification was lost. Without notifications (MariaDB, SQLite, or the listening connection
lost) it polls about once a second. Each is taken under the job's row lock, so
``overlap="forbid"`` holds against scheduled claims too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import datetime, timedelta

from slotcron.jobs.registry import Job
from slotcron.lifeline.outage import DB_ERRORS
from slotcron.lifeline.roles import Collaborators, Role
from slotcron.observe.logs import run_fields
from slotcron.status import Status
from slotcron.store import queue
from slotcron.store.claims import Claim
from slotcron.store.dialects import Listening
from slotcron.store.lifeline import BACKFILL_CREATED, QUEUED_CHANNEL

log = logging.getLogger("slotcron.queued")

LEASE_HELD_RECHECK = (0.1, 1.0)
"""How soon (seconds, drawn between the two) a queued run of a forbid job that found the lease
held looks again, at most: drawn, so the looks do not stay in step with the job's own runs (a
job busy most of each second kept a manual run waiting 25 to 41 s behind a fixed 1 s)."""
BUSY_RECHECK = 0.05
"""Seconds (of real time) after which a queued run whose job rows were locked is looked at
again."""
PAGE = 100
"""Queued executions read per look; a full page is followed by another look at once."""
LISTENING_POLL_SECONDS = 300.0
"""How often a listening instance looks anyway: notifications are not queued for a listener
whose connection was lost, and a new connection starts with a poll of its own."""


class QueuedRuns(Role):
    name = "queued runs"
    # A poll under way finishes first: cancelling it between taking an execution and starting
    # it would leave that execution RUNNING with nobody running it.
    cancel_on_stop = False

    def __init__(
        self,
        shared: Collaborators,
        *,
        jobs: dict[str, Job],
        default_lease: float,
        period: float,
        start: Callable[[Job, Claim], None],
        pool_size: int = 10,
        resolve: Callable[[str], Awaitable[Job | None]] | None = None,
    ) -> None:
        super().__init__(shared)
        self.jobs = jobs
        self.default_lease = default_lease
        self.period = period
        self._start = start
        self._resolve = resolve
        """Finds a job not in ``jobs``: a runtime schedule not held in memory
        (app/slotcron/engine/runtime.py)."""
        self._wake = asyncio.Event()
        self._closing = False
        self._timers: set[asyncio.Task[None]] = set()
        self._listening: Listening | None = None
        # A listener takes one pooled connection: only where the pool can spare it.
        self._may_listen = pool_size >= 2
        self._held: set[str] = set()
        """Forbid jobs whose queued run found the lease held at the last look: when a run of
        one ends here, the queue is looked at again at once (the gap before its next run)."""
        self.on_backfill: Callable[[], None] = lambda: None
        """Told of a backfill created anywhere (its notification shares the queue's channel)."""

    @property
    def listening(self) -> bool:
        """Whether notifications are heard (PostgreSQL, with a live listening connection)."""
        return self._listening is not None and self._listening.alive

    async def request_stop(self) -> None:
        """Stop taking runs, once the poll under way (if any) has started what it took."""
        self._closing = True
        self._wake.set()
        for timer in list(self._timers):
            timer.cancel()

    async def stopped(self) -> None:
        if self._listening is not None:
            await self._listening.close()
            self._listening = None

    def run_ended(self, job_name: str) -> None:
        """A run of ``job_name`` ended here (its outcome is written, its lease released)."""
        if job_name in self._held:
            self._wake.set()

    def wake_at(self, when: datetime) -> None:
        """Poll at ``when`` (a retry this instance queued becomes due then)."""
        self._wake_after(lambda: self.clock.sleep_until(when))

    def _look_again_soon(self) -> None:
        """Poll again shortly: rows another transaction holds are free again within moments
        of real time, whatever the scheduler's clock says (a test's manual clock stands still)."""
        self._wake_after(lambda: asyncio.sleep(BUSY_RECHECK))

    def _wake_after(self, wait: Callable[[], Awaitable[None]]) -> None:
        """Wake the poller once ``wait()`` is over. The wait is made in the timer's task: one
        made before it, by a timer cancelled before its first step (at shutdown), was a
        coroutine never awaited (Python warns of each)."""

        async def timer() -> None:
            await wait()
            self._wake.set()

        task = asyncio.create_task(timer())
        self._timers.add(task)
        task.add_done_callback(self._timers.discard)

    def _notified(self, payload: str) -> None:
        if payload == BACKFILL_CREATED:
            self.on_backfill()
            return
        try:
            when = datetime.fromisoformat(payload)
        except ValueError:
            self._wake.set()
            return
        if when <= self.clock.now():
            self._wake.set()
        else:
            self.wake_at(when)

    async def _listen(self) -> bool:
        """Listen for QUEUED notifications if possible; True when a new listener started."""
        if self._listening is not None and self._listening.alive:
            return False
        if self._listening is not None:
            await self._listening.close()
            self._listening = None
            log.info("lost the connection listening for queued runs: polling until it is back")
        try:
            self._listening = await self.db.dialect.listen(
                self.db.engine, QUEUED_CHANNEL, self._notified
            )
        except DB_ERRORS:
            return False
        return self._listening is not None

    async def run(self) -> None:
        while not self._closing:
            # A new listener polls once at once: something may have been queued unheard.
            if not (self._may_listen and await self._listen()):
                listening = self._listening is not None and self._listening.alive
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(
                        LISTENING_POLL_SECONDS if listening else self.period
                    ):
                        await self._wake.wait()
            self._wake.clear()
            if self._closing:
                return
            try:
                await self.poll()
            except DB_ERRORS as exc:
                self.outage.failed(exc, "looking for queued runs")

    async def poll(self) -> int:
        """Take every due QUEUED execution of a job this instance knows; return how many.

        Looks until a look takes nothing more (a job's queue is taken one run per look)."""
        taken = 0
        while not self._closing:
            took = await self._look()
            taken += took
            if not took:
                break
        return taken

    async def _look(self) -> int:
        """One look at every due QUEUED execution, a page at a time (at most
        :data:`slotcron.store.queue.PER_JOB` of one job in a page, and paging on past what cannot be
        taken now: a page of one held job's runs never hides another job's), each page taken
        in one transaction (:func:`queue.take_many`): a burst handed back by an instance that
        died before its slot is taken in a few statements, not one by one."""
        taken = 0
        self._held = set()
        after = queue.BEGINNING
        while not self._closing:
            page = await queue.due(self.db, now=self.clock.now(), limit=PAGE, after=after)
            if not page:
                break
            after = (page[-1].available_at, page[-1].execution_id)
            known = await self._jobs_of(page)
            unknown = {item.job_name for item in page if item.job_name not in known}
            if unknown:  # another version's jobs (left to it), or gone: settled, never taken
                settled = await queue.settle_orphans(self.db, unknown, now=self.clock.now())
                for name, count in settled.items():
                    log.info("%d queued runs of %s SKIPPED: %s", count, name, queue.REMOVED)
            # Another version's jobs are left to an instance that has them.
            wanted = [
                queue.Wanted(
                    item.execution_id,
                    item.job_name,
                    known[item.job_name].lease_ms(self.default_lease),
                    known[item.job_name].overlap == "forbid",
                )
                for item in page
                if item.job_name in known
            ]
            if not wanted:
                if len(page) < PAGE:
                    break
                continue
            sent = self.clock.monotonic()
            got = await queue.take_many(
                self.db, wanted, instance_id=self.instance_id, now=self.clock.now()
            )
            if got.busy:
                self._look_again_soon()  # someone is claiming these jobs right now
            self._held |= {w.job_name for w in wanted if w.execution_id in got.held}
            if got.held:
                # A run of a forbid job holds the lease: look again when it ends (at once, if it
                # ends here: run_ended), at the latest when it lapses (renewals move that on, so
                # also within a second), on every backend: no notification says that a run
                # ended elsewhere.
                until = min(got.held.values())
                recheck = timedelta(seconds=random.uniform(*LEASE_HELD_RECHECK))
                self.wake_at(min(until, self.clock.now() + recheck))
            for claim in got.claims:
                self._started(known[claim.job_name], replace(claim, sent=sent))
            taken += len(got.claims)
            if len(page) < PAGE:  # all due seen
                break
        return taken

    async def _jobs_of(self, page: list[queue.Queued]) -> dict[str, Job]:
        """The jobs of ``page`` this instance runs: its code jobs, and runtime schedules found
        by ``resolve`` (not held in memory unless due soon)."""
        known: dict[str, Job] = {}
        for item in page:
            if item.job_name in known:
                continue
            job = self.jobs.get(item.job_name)
            if job is None and self._resolve is not None:
                job = await self._resolve(item.job_name)
            if job is not None:
                known[item.job_name] = job
        return known

    def _started(self, job: Job, claim: Claim) -> None:
        log.info(
            "%s slot %s: starting attempt %d (%s)",
            job.name,
            claim.scheduled_at.isoformat(),
            claim.attempt,
            claim.trigger,
            extra=run_fields(
                job.name,
                claim.scheduled_at,
                claim.execution_id,
                self.instance_id,
                Status.RUNNING,
            ),
        )
        self._start(job, claim)
