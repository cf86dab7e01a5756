"""The planner of runtime schedules: the planner's heap and wake-up
(:class:`slotcron.engine.planner.Planner`), for the schedules due within the horizon. An entry
whose schedule was removed or replaced since it was pushed is dropped when it comes up, and a
schedule's next slot re-enters the heap only if it is within the horizon; otherwise it is
forgotten until the loader (:class:`slotcron.engine.runtime.Runtime`) finds it again.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from slotcron.clock import Clock
from slotcron.engine.burst import LEAD_BASE, LEAD_MAX, Burst
from slotcron.engine.firing import Firing
from slotcron.engine.planner import Planner
from slotcron.engine.scheduled import JobSchedules, ScheduledJob
from slotcron.engine.shares import Shares
from slotcron.jobs.registry import Job
from slotcron.schedule.slots import NEVER

HORIZON = timedelta(seconds=60)
"""How far ahead an instance holds schedules in memory. Below the writers' announcement window
(:data:`slotcron.store.schedules.ANNOUNCE_WITHIN`): a write further ahead needs no word."""
PREPARE_COST = 200e-6
"""Seconds per runtime schedule's slot due together, to claim it and prepare its run ahead
(a claim's share of its chunk, its run's task and context), until the burst measures its own.
Measured on 2-core machines, PostgreSQL on loopback, 100,000 at once: 150 us on one; 188 us
on another (2026-11-24), where a lead of 15 s left the last claims 5 s after the slot, and
20 s (this figure, at the horizon's third) finished them 2.4 s before it."""


class RuntimePlanner(Planner):
    """The planner for runtime schedules: its own heap, holding the schedules due within the
    horizon (:attr:`current`, one version of each)."""

    name = "schedules planner"

    def __init__(
        self,
        schedules: JobSchedules,
        *,
        clock: Clock,
        firing: Firing,
        burst: Burst,
        horizon: timedelta = HORIZON,
        shares: Shares | None = None,
    ) -> None:
        super().__init__([], schedules, clock=clock, firing=firing, burst=burst, shares=shares)
        self.horizon = horizon
        self.current: dict[str, ScheduledJob] = {}
        self.taken: dict[str, ScheduledJob] = {}
        """Schedules of other members held only to fire one slot taken over (not planned on
        here: :mod:`slotcron.engine.takeover`)."""
        self.popped: dict[str, datetime] = {}
        """Each schedule's last slot taken from the heap: a row still showing it (its claim not
        yet committed) is not loaded again."""

    def admit(self, job: ScheduledJob, slot: datetime) -> None:
        """Hold ``job`` (new, or a new version of a schedule held) from ``slot``."""
        self.current[job.name] = job
        self._push_and_wake(job, slot)

    def take(self, job: ScheduledJob, slot: datetime) -> None:
        """Fire ``slot`` of another member's schedule once (taken over: its owner did not
        claim it in time); the schedule is forgotten here once that slot is fired."""
        if slot >= NEVER:
            return  # its window has ended: no slot to fire
        self.taken[job.name] = job
        self.adopt([(job, slot)])

    def _owns(self, name: str) -> bool:
        return self.shares.owns_now(name)  # not remembered: millions of names over a life

    def plans(self, name: str) -> bool:
        return name in self.current

    def _mine(self, job: Job, adopted: bool) -> bool:
        """A held schedule's entry is fired while this instance owns it (the loader holds only
        those); a slot taken over once. One held when the members changed is dropped."""
        if adopted or self._owns(job.name):
            return True
        self.current.pop(job.name, None)
        return False

    def drop(self, name: str) -> None:
        """Forget a schedule: its entry in the heap goes stale, and is dropped when it comes up."""
        self.current.pop(name, None)

    def _keeps(self, job: Job, slot: datetime) -> bool:
        if self.taken.get(job.name) is job:
            # Its one slot, fired now. Not remembered as popped: the loader would refuse to
            # load the schedule, or take it over again, while its row shows that slot (its
            # claim gave up; or this instance owns it now).
            del self.taken[job.name]
            return True
        if self.current.get(job.name) is not job:
            return False
        self.popped[job.name] = slot
        return True

    def _push(self, job: Job, slot: datetime) -> None:
        if self.current.get(job.name) is not job:
            return  # removed or replaced meanwhile
        if slot >= self.clock.now() + self.horizon:
            del self.current[job.name]  # the loader finds it again when it comes near
            return
        self._enter(job, slot)  # no `_held`: `current` says it

    def _lead(self) -> timedelta:
        """Slots due together are claimed ahead as a job's are, but past
        :data:`slotcron.engine.burst.LEAD_MAX` by what claiming and preparing a schedule's run
        costs each
        (:data:`PREPARE_COST`, or the burst's measure when higher): a schedule's slots are
        known a horizon ahead, and a burst of 100,000 takes seconds to claim. At most a third
        of the horizon (and half a period: the burst's own rule)."""
        lead = super()._lead()
        if lead < timedelta(seconds=LEAD_MAX) or not self._heap:
            return lead
        slot, _, job = self._heap[0]
        period = self._schedules[job.name].next_after(slot) - slot
        each = max(PREPARE_COST, self.burst.claim_cost)
        wanted = timedelta(seconds=LEAD_BASE + self._at_slot[slot] * each)
        return min(max(lead, wanted), self.horizon / 3, period / 2)

    def forget_popped(self, before: datetime) -> None:
        for name in [n for n, slot in self.popped.items() if slot < before]:
            del self.popped[name]
