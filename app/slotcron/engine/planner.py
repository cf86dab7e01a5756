"""Plan and wake: one heap of next slots, one wake-up at the earliest, one task per due job.

Planning is O(jobs due now): the planner never scans the registered jobs. It never awaits one
job's claim before starting the next: every due slot is handed on at once (guarantee 6), a
lone one to :meth:`Firing.fire` at its time, slots due together to :meth:`Burst.fire_together`
ahead of their time by the burst's lead window. A slot reached past its grace goes through the
job's misfire policy, and the job re-enters the heap only once its late slots are decided.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import itertools
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

from slotcron.clock import Clock
from slotcron.engine.burst import Burst
from slotcron.engine.firing import Firing
from slotcron.jobs import misfire
from slotcron.jobs.registry import Job
from slotcron.lifeline.roles import stop_task
from slotcron.schedule.slots import NEVER, Schedule


class Planner:
    name = "planner"

    def __init__(
        self,
        jobs: Sequence[Job],
        schedules: Mapping[str, Schedule],
        *,
        clock: Clock,
        firing: Firing,
        burst: Burst,
    ) -> None:
        self.clock = clock
        self.firing = firing
        self.burst = burst
        self._schedules = schedules
        self._jobs = [job for job in jobs if job.enabled]
        self._heap: list[tuple[datetime, int, Job]] = []
        self._at_slot: dict[datetime, int] = {}  # how many heap entries share each slot
        self._seq = itertools.count()
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    def start(self, expected: Mapping[str, datetime | None] | None = None) -> None:
        """Start planning. ``expected`` is each job's next undecided slot as the cluster stored
        it: one in the past means slots were missed while no instance ran them."""
        now = self.clock.now()
        for job in self._jobs:
            schedule = self._schedules[job.name]
            first = schedule.next_after(now)
            stored = (expected or {}).get(job.name)
            if stored is not None and stored < first:
                first = min(first, schedule.next_after(stored - misfire.TICK))
            self._push(job, first)
        self._task = asyncio.create_task(self._plan(), name="slotcron-planner")

    async def stop(self) -> None:
        """Phase 1 of shutdown: plan and claim nothing more; claims under way finish (they are
        short), so a slot is never left half-decided; runs go on."""
        self.firing.claimer.closing = True
        if self._task is not None:
            self._task.cancel()
            await stop_task(self._task, f"the {self.name}")
        await self.firing.stop_claiming()

    def _push(self, job: Job, slot: datetime) -> None:
        if slot >= NEVER:  # its window has ended: it has no slot to plan (jobs/windows.py)
            return
        heapq.heappush(self._heap, (slot, next(self._seq), job))
        self._at_slot[slot] = self._at_slot.get(slot, 0) + 1

    def _pop(self) -> tuple[datetime, Job]:
        slot, _, job = heapq.heappop(self._heap)
        left = self._at_slot[slot] - 1
        if left:
            self._at_slot[slot] = left
        else:
            del self._at_slot[slot]
        return slot, job

    def _keeps(self, job: Job, slot: datetime) -> bool:
        """Whether an entry taken from the heap still stands: always, for code jobs (a runtime
        schedule's may have been removed or replaced since: :mod:`slotcron.engine.runtime`)."""
        return True

    def _push_and_wake(self, job: Job, slot: datetime) -> None:
        self._push(job, slot)
        self._wake.set()

    def _lead(self) -> timedelta:
        """How far ahead of the earliest slot to claim it (the burst's lead window)."""
        if not self._heap:
            return timedelta(0)
        slot, _, job = self._heap[0]
        together = self._at_slot[slot]
        if together < 2:
            return timedelta(0)
        period = self._schedules[job.name].next_after(slot) - slot
        return self.burst.lead(together, period)

    async def _sleep_until_due(self) -> None:
        """Sleep until the earliest slot (less the lead), or until the heap changes under us."""
        if not self._heap:
            await self._wake.wait()
        else:
            wake_at = self._heap[0][0] - self._lead()
            sleeper = asyncio.ensure_future(self.clock.sleep_until(wake_at))
            waker = asyncio.ensure_future(self._wake.wait())
            try:
                await asyncio.wait({sleeper, waker}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                sleeper.cancel()
                waker.cancel()
        self._wake.clear()

    async def _plan(self) -> None:
        firing = self.firing
        while True:
            await self._sleep_until_due()
            now = self.clock.now()
            horizon = now
            if self._heap and self._heap[0][0] - self._lead() <= now:
                horizon = max(now, self._heap[0][0])  # the earliest slot's jobs, claimed ahead
            due: list[tuple[Job, datetime]] = []
            at_slot: list[tuple[Job, datetime]] = []
            missed: list[tuple[Job, list[datetime], datetime]] = []
            passed_over: list[tuple[Job, misfire.PassedOver]] = []  # of the `missed` jobs
            following: list[tuple[Job, datetime]] = []  # pushed after the sweep: once per job
            while self._heap and self._heap[0][0] <= horizon:
                slot, job = self._pop()
                if firing.superseded(job.name):
                    continue  # a newer registration's schedule is in force: fired no more here
                if job.name in firing.claimer.exhausted:
                    continue  # its max_runs completed: it has no slot left
                if not self._keeps(job, slot):
                    continue
                schedule = self._schedules[job.name]
                if misfire.is_late(schedule, slot, now):
                    late, resume = misfire.late_slots(job, schedule, slot, now)
                    passed = misfire.passed_over(job, schedule, slot, now)
                    # The job re-enters the heap only once its late slots are decided: a newer
                    # slot claimed first would close them (the high-water mark) unrecorded.
                    if job.misfire == "skip":
                        missed.append((job, late, resume))
                        if passed is not None:
                            passed_over.append((job, passed))
                    else:
                        back = functools.partial(self._push_and_wake, job, resume)
                        firing.spawn(firing.misfire_then(job, late, now, back, passed), job)
                else:
                    after = schedule.next_after(slot)
                    following.append((job, after))
                    # Never more than half its period ahead: its previous slot's run may still
                    # be deciding (or holding its lease). Such a job is claimed at its slot.
                    ahead = slot > now and (slot - now) * 2 > after - slot
                    (at_slot if ahead else due).append((job, slot))
            for job, after in following:
                self._push(job, after)
            for job, slot in at_slot:
                firing.spawn(firing.fire(job, slot), job)
            if len(due) == 1:
                firing.spawn(firing.fire(*due[0]), due[0][0])
            elif due:
                firing.spawn(self.burst.fire_together(due), None)
            if missed:
                together = self.burst.miss_together(missed, now, self._push_and_wake)
                # Passed-over ranges first: their jobs' late slots would close them unrecorded.
                firing.spawn(firing.pass_over_then(passed_over, now, together), None)
