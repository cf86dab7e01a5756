"""Taking over slots their owner did not claim in time (a dead, paused or cut-off member).

Each job is planned by one member (:mod:`slotcron.engine.shares`); the others do not plan it at
all, so a member that dies, hangs or loses the database leaves its jobs' slots undecided. While
an instance shares its jobs with others, it looks for such slots: one range read on the
``next_slot_at`` index for the slots at least :data:`DELAY` past their time that no claim has
closed, then, when there are none, when the next slot of the cluster is due (one ``min``), and
sleeps until that slot is :data:`DELAY` past. A slot found is taken first by the member next in
its job's line (rendezvous order without its owner), by any member once :data:`ANYONE_AFTER`
past. A slot taken is fired here once, as its owner
would have (a code job's through the planner, a runtime schedule's through its loader), and
its claim decides as any claim does: if the owner claims it meanwhile, one claim wins. The
job's next slots stay with its owner; once the members are read again without the dead one,
its jobs are planned by their new owners (:meth:`slotcron.engine.planner.Planner.reshare`).

A dead owner's slots are so taken over within :data:`DELAY` plus a look (at most
:data:`LOOK_MIN_SECONDS` apart while slots are due), not after a lease or a heartbeat, by a
member that is not itself behind (:data:`BEHIND`): when every member is late, the cluster is
short of capacity, and each claim of another's slot is one more claim of the same row.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from slotcron.engine.planner import Planner
from slotcron.engine.runtime import Runtime
from slotcron.engine.shares import Shares
from slotcron.jobs.misfire import MAX_GRACE
from slotcron.jobs.registry import Job
from slotcron.lifeline.outage import DB_ERRORS, resume_cancellation
from slotcron.lifeline.roles import Collaborators, Role
from slotcron.store import membership

log = logging.getLogger("slotcron.takeover")

DELAY = timedelta(seconds=0.3)
"""How long past its time a slot nobody claimed waits for its owner before it is taken over, by
the member next in the job's line (the one that would own it if its owner left)."""
ANYONE_AFTER = 2 * DELAY
"""How long past its time such a slot waits for that member before any member takes it over
(that member may be gone too). Every member taking every overdue slot at once put a cluster
under load into a spiral: the same rows claimed by all, their heartbeats late, members judged
gone, more slots overdue."""
LOOK_MIN_SECONDS = 0.2
LOOK_MAX_SECONDS = 2.0
ALONE_SECONDS = 1.0
"""How often an instance alone looks whether it still is (nothing is read: its own view)."""
SKIPPED_SECONDS = 0.5
"""The next look, when every overdue slot found was this instance's own or taken over lately
(their claims not committed yet): those found may hide others."""
LIMIT = 2000
"""Overdue slots taken per look."""
LOG_EVERY = timedelta(seconds=10)
RETRY = timedelta(seconds=10)
"""A slot taken over and still open this long after is taken over again (its claim gave up,
or was dropped): meanwhile a look that finds it open (its claim not committed yet, or waiting
for a lease its live owner's run holds) leaves it. A claim that gave up is not lost either way:
the next slot's claim finds it undecided and decides it by the misfire policy."""
REMEMBERED = 50_000
BEHIND = timedelta(seconds=2)
"""An instance that decided a slot of its own late this recently takes nothing over: it is
behind, so the cluster is short of capacity, not of a member; a slot it took over would be
claimed twice (by it and by its owner, late too) and put both further behind. Three instances
started together at 4,000 jobs a second missed 432 to 4,210 slots in the benchmark's window
(4 runs of 4) when each took over the slots the others were still deciding after their start."""


class Takeover(Role):
    name = "takeover"

    def __init__(
        self, shared: Collaborators, *, shares: Shares, planner: Planner, runtime: Runtime
    ) -> None:
        super().__init__(shared)
        self.shares = shares
        self.planner = planner
        self.runtime = runtime
        self.taken = 0
        """Slots taken over since start (for tests, metrics and benchmarks)."""
        self._taken: dict[str, tuple[datetime, datetime]] = {}
        """Slots taken over lately: name -> (slot, when)."""
        self._logged_at: datetime | None = None

    async def run(self) -> None:
        while True:
            if self.shares.alone:
                await self.clock.sleep(ALONE_SECONDS)
                continue
            try:
                wait = await self.look()
            except DB_ERRORS as exc:
                resume_cancellation(exc)
                wait = LOOK_MAX_SECONDS
            await self.clock.sleep(wait)

    async def look(self) -> float:
        """Take over what is overdue; return how long to sleep until the next look."""
        if self.planner.firing.late.behind(BEHIND):
            return LOOK_MIN_SECONDS
        now = self.clock.now()
        rows = await membership.overdue(
            self.db,
            before=now - DELAY,
            after=now - MAX_GRACE,
            limit=LIMIT,
            tasks=self.runtime.tasks,
        )
        code: list[tuple[Job, datetime]] = []
        schedules: list[str] = []
        for name, task, slot in rows:
            earlier = self._taken.get(name)
            if earlier is not None and earlier[0] == slot and now - earlier[1] < RETRY:
                continue
            if now - slot < ANYONE_AFTER and not self.shares.next_in_line(name):
                continue  # the next member in the job's line takes it first
            if task is None:
                job = self.planner.by_name.get(name)
                if job is None or (self.shares.owns(name) and self.planner.plans(name)):
                    # Not run here; or ours and planned, and the planner decides its lateness
                    # (one ours but not planned yet, its reshare failing, is taken over).
                    continue
                code.append((job, slot))
            elif self.runtime.may_take(name, task):
                schedules.append(name)
            else:
                continue
            self._taken[name] = (slot, now)
        if len(self._taken) > REMEMBERED:
            self._taken = {n: t for n, t in self._taken.items() if now - t[1] < RETRY}
        if code or schedules:
            self.taken += len(code) + len(schedules)
            if self._logged_at is None or now - self._logged_at > LOG_EVERY:
                self._logged_at = now
                log.warning(
                    "taking over %d slots their owners did not claim within %.1f s (a member "
                    "dead, paused or cut off; %d taken over since start)",
                    len(code) + len(schedules),
                    DELAY.total_seconds(),
                    self.taken,
                )
            self.planner.adopt(code)
            self.runtime.take_over(schedules)
            return LOOK_MIN_SECONDS
        if rows:  # overdue, but this instance's own, or taken over lately: look again soon
            return SKIPPED_SECONDS
        following = await membership.next_due(self.db, after=now - DELAY)
        if following is None:
            return LOOK_MAX_SECONDS
        wait = (following + DELAY - self.clock.now()).total_seconds()
        return min(max(wait, LOOK_MIN_SECONDS), LOOK_MAX_SECONDS)
