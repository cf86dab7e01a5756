"""Carrying backfills on: every live instance steps the backfills of the jobs it has.

A backfill is a row (:mod:`slotcron.store.backfills`); a step queues its next slots that never
completed as attempts with trigger ``backfill`` (:func:`slotcron.store.backfill_slots.step`),
which the queue of manual runs takes (:mod:`slotcron.engine.queued`). One instance steps a
backfill at a time (its row is locked for the step; another finds it busy and leaves it), so an
instance that dies or stops mid-backfill leaves it to the others: nothing is lost, and a slot is
never queued twice (the step decides under the job's row lock, as claims do).

Live slots come first:

- a backfill keeps at most a few runs in flight (``forbid``: one; else at most half the
  instance's capacity, :data:`slotcron.errors.MAX_QUEUED` and its rate's worth), and its queued
  runs wait for capacity behind any live slot (their deadline is later);
- a ``forbid`` job's backfill run starts only where it fits before the job's next live slot
  (twice its recent longest run, and :data:`FIT_MARGIN`): a run still holding the lease when a
  live slot comes would have that slot recorded ``SKIPPED``;
- at most ``rate`` starts a second (a token bucket, per instance: a backfill moves to another
  instance with an empty bucket).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from slotcron.engine.scheduled import JobSchedules
from slotcron.errors import MAX_QUEUED
from slotcron.jobs.calendars import excluded
from slotcron.jobs.registry import Job
from slotcron.jobs.stored import slots_between
from slotcron.lifeline.outage import DB_ERRORS
from slotcron.lifeline.roles import Collaborators, Role
from slotcron.schedule.slots import NEVER
from slotcron.store import backfill_slots, backfills
from slotcron.store.backfills import Backfill

log = logging.getLogger("slotcron.backfill")

IDLE_SECONDS = 2.0
"""How often an instance looks for backfills while none is under way (a backfill this instance
was asked for over HTTP starts at once: :meth:`Backfilling.wake`)."""
LISTENING_IDLE_SECONDS = 300.0
"""The same while notifications are heard (PostgreSQL), as the queue of manual runs: a backfill
created anywhere wakes every listening instance (its creation notifies), so the look is a safety
net only; at 2 s it was 90 statements a minute of an idle instance."""
BUSY_SECONDS = 0.1
"""How often it steps the backfills under way."""
WAIT_IN_FLIGHT = 0.5
"""Seconds before a backfill whose cursor stopped at a slot in flight looks again."""
STEP_SLOTS = 200
"""Slots one step considers at most (one transaction; passed-over slots cost a read each)."""
FIT_MARGIN = 1.5
"""Seconds a ``forbid`` job's backfill run keeps clear of its next live slot beyond twice its
recent longest run: the queue's look and the run's start take up to a second."""


@dataclass
class _Bucket:
    """Starts a backfill may still make here: ``rate`` a second, at most ``size`` at once."""

    rate: float
    size: int
    tokens: float = 0.0
    at: float = field(default_factory=time.monotonic)

    def fill(self) -> int:
        now = time.monotonic()
        self.tokens = min(float(self.size), self.tokens + (now - self.at) * self.rate)
        self.at = now
        return int(self.tokens)


class Backfilling(Role):
    name = "backfills"

    def __init__(
        self,
        shared: Collaborators,
        *,
        jobs: dict[str, Job],
        schedules: JobSchedules,
        timezone: str,
        capacity: int,
        retention_days: float,
        on_queued: Callable[[datetime], None],
        resolve: Callable[[str], Awaitable[Job | None]] | None = None,
        listening: Callable[[], bool] = lambda: False,
    ) -> None:
        super().__init__(shared)
        self.jobs = jobs
        self.schedules = schedules
        self.timezone = timezone
        self.capacity = capacity
        self.retention_days = retention_days
        self.on_queued = on_queued
        self._resolve = resolve
        self._listening = listening
        self.looks = 0
        """Looks for backfills since start (tests)."""
        self._buckets: dict[int, _Bucket] = {}
        self._not_before: dict[int, float] = {}
        """Backfills whose cursor waits (for the live schedule, or a run in flight): not stepped
        again before this ``time.monotonic()``, so a waiting backfill does not take the job's
        row lock ten times a second."""
        self._wake = asyncio.Event()

    def wake(self) -> None:
        """Look at the backfills now (one was just created here)."""
        self._wake.set()

    async def run(self) -> None:
        while True:
            try:
                busy = await self.tick()
            except DB_ERRORS as exc:
                self.outage.failed(exc, "carrying backfills on")
                busy = False
            self._wake.clear()
            # Real time: a backfill's pace is the real clock's, whatever a test's clock says.
            try:
                idle = LISTENING_IDLE_SECONDS if self._listening() else IDLE_SECONDS
                async with asyncio.timeout(BUSY_SECONDS if busy else idle):
                    await self._wake.wait()
            except TimeoutError:
                pass

    async def tick(self) -> bool:
        """Step every backfill under way whose job this instance has; True while any is."""
        self.looks += 1
        under_way = await backfills.active(self.db)
        self._buckets = {b.id: self._buckets[b.id] for b in under_way if b.id in self._buckets}
        self._not_before = {b.id: self._not_before.get(b.id, 0.0) for b in under_way}
        for backfill in under_way:
            job = await self._job(backfill.job)
            if job is not None:
                await self._step(backfill, job)
        return bool(under_way)

    async def _job(self, name: str) -> Job | None:
        job = self.jobs.get(name)
        if job is None and self._resolve is not None:
            job = await self._resolve(name)
        return job

    async def _step(self, backfill: Backfill, job: Job) -> None:
        now = self.clock.now()
        if backfill.next_at is None:
            if backfill.in_flight == 0 and await backfills.complete(self.db, backfill.id, now=now):
                self._buckets.pop(backfill.id, None)
                log.info(
                    "backfill %d of %s completed: %s", backfill.id, job.name, _progress(backfill)
                )
            return
        if time.monotonic() < self._not_before.get(backfill.id, 0.0):
            return
        budget = self._budget(backfill, job)
        if budget < 1 or not await self._fits(job, now):
            return
        slots, following = self._next_slots(job, backfill.next_at, backfill.end)
        stepped = await backfill_slots.step(
            self.db,
            backfill.id,
            cursor=backfill.next_at,
            slots=slots,
            following=following,
            budget=budget,
            now=now,
            kept_since=backfills.kept_since(now, self.retention_days),
        )
        self._wait(backfill.id, stepped, now)
        if stepped.queued:
            if (bucket := self._buckets.get(backfill.id)) is not None:
                bucket.tokens -= len(stepped.queued)
            self.on_queued(now)
            log.debug(
                "backfill %d of %s queued %d slots from %s",
                backfill.id, job.name, len(stepped.queued), stepped.queued[0].isoformat(),
            )  # fmt: skip

    def _wait(self, backfill_id: int, stepped: backfill_slots.Stepped, now: datetime) -> None:
        """After a step that stopped at a slot the live schedule has not decided (until that
        slot's time) or one in flight (half a second): look again then."""
        if stepped.at is None:
            return
        wait = WAIT_IN_FLIGHT
        if stepped.waiting == backfill_slots.LIVE:
            wait = max(wait, (stepped.at - now).total_seconds() + WAIT_IN_FLIGHT)
        self._not_before[backfill_id] = time.monotonic() + wait

    def _budget(self, backfill: Backfill, job: Job) -> int:
        """How many runs the backfill may queue now: room in flight, and its rate's tokens."""
        most = 1 if job.overlap == "forbid" else max(1, min(self.capacity // 2, MAX_QUEUED))
        if backfill.rate > 0:
            most = min(most, max(1, math.ceil(backfill.rate)))
        room = most - backfill.in_flight
        if backfill.rate == 0:
            return room
        bucket = self._buckets.setdefault(backfill.id, _Bucket(backfill.rate, most, tokens=1.0))
        return min(room, bucket.fill())

    async def _fits(self, job: Job, now: datetime) -> bool:
        """Whether a ``forbid`` job's backfill run fits before its next live slot."""
        if job.overlap != "forbid":
            return True
        try:
            live = self.schedules[job.name].next_after(now)
        except KeyError:
            return True  # not planned here: nothing live to keep clear of
        if live == NEVER:
            return True
        longest = await backfill_slots.longest_recent_run(self.db, job.name)
        needed = timedelta(seconds=2 * longest + FIT_MARGIN)
        return live - now > needed

    def _next_slots(
        self, job: Job, cursor: datetime, end: datetime
    ) -> tuple[list[datetime], datetime | None]:
        """The backfill's next slots from ``cursor`` (at most :data:`STEP_SLOTS`, each run by
        the job's calendar), and the next one after them (None: the range ends)."""
        zone = job.timezone or self.timezone
        found = slots_between(
            job.schedule(self.timezone),
            lambda slot: excluded(job, slot, zone) is None,
            cursor,
            end,
        )
        slots = list(itertools.islice(found, STEP_SLOTS))
        return slots, next(found, None)


def _progress(backfill: Backfill) -> str:
    return (
        f"{backfill.total} slots, {backfill.queued} queued, {backfill.passed} passed over "
        "(completed before, skipped, or of a pruned history)"
    )
