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
from slotcron.engine import missed_slots
from slotcron.engine.burst import BATCH_SIZE, Burst
from slotcron.engine.firing import Firing
from slotcron.engine.shares import Shares
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
        shares: Shares | None = None,
    ) -> None:
        self.clock = clock
        self.firing = firing
        self.burst = burst
        self.shares = shares or Shares(firing.claimer.instance_id)
        self._schedules = schedules
        self._jobs = [job for job in jobs if job.enabled]
        self.by_name = {job.name: job for job in self._jobs}
        self._held: set[str] = set()
        """The jobs this planner plans (each has its next slot in the heap, or is having its
        late slots decided): those it owns (:mod:`slotcron.engine.shares`)."""
        self._adopted: set[int] = set()
        """Heap entries (by sequence number) of slots taken over from another member: fired
        once, their next slot left to its owner."""
        self._heap: list[tuple[datetime, int, Job]] = []
        self._at_slot: dict[datetime, int] = {}  # how many heap entries share each slot
        self._seq = itertools.count()
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._since = clock.now()
        """When this planner last began planning jobs new to it (its start, a reshare): their
        slots before it were not its to decide, and deciding them late is not its lateness."""

    def start(self, expected: Mapping[str, datetime | None] | None = None) -> None:
        """Start planning. ``expected`` is each job's next undecided slot as the cluster stored
        it: one in the past means slots were missed while no instance ran them."""
        now = self._since = self.clock.now()
        for job in self._jobs:
            if job.name in self._held or not self.shares.owns(job.name):
                continue  # planned already; or another member plans it (and its misses)
            self._push(job, self._first(job, now, (expected or {}).get(job.name)))
        self._task = asyncio.create_task(self._plan(), name="slotcron-planner")

    async def stop(self) -> None:
        """Phase 1 of shutdown: plan and claim nothing more; claims under way finish (they are
        short), so a slot is never left half-decided; runs go on."""
        self.firing.claimer.closing = True
        if self._task is not None:
            self._task.cancel()
            await stop_task(self._task, f"the {self.name}")
        await self.firing.stop_claiming()

    def newly_owned(self) -> list[str]:
        """The jobs this instance owns now and does not plan yet (after the members changed)."""
        if self._task is None:
            return []  # not started: it plans what it owns then
        return [j.name for j in self._jobs if j.name not in self._held and self._owns(j.name)]

    def reshare(self, expected: Mapping[str, datetime | None]) -> None:
        """The members changed: plan the jobs this instance owns now and did not, from their
        next undecided slot as stored (``expected``, read for :meth:`newly_owned`): slots
        another member left undecided are decided here, late ones by their misfire policy. A
        job owned no more is dropped when its entry comes up. Before :meth:`start`, nothing:
        it plans what is owned then."""
        if self._task is None:
            return
        now = self.clock.now()
        for name in self.newly_owned():
            self._since = now
            job = self.by_name[name]
            self._push(job, self._first(job, now, expected.get(name)))
        self._wake.set()

    def _first(self, job: Job, now: datetime, stored: datetime | None) -> datetime:
        """Where planning a job starts: its next slot, or an earlier one stored undecided."""
        schedule = self._schedules[job.name]
        first = schedule.next_after(now)
        if stored is not None and stored < first:
            first = min(first, schedule.next_after(stored - misfire.TICK))
        return first

    def adopt(self, taken: list[tuple[Job, datetime]]) -> None:
        """Slots of other members' jobs that nobody claimed in time (a dead or paused owner):
        fired here once each, as any slot (late ones by their misfire policy); the jobs' next
        slots stay with their owners."""
        for job, slot in taken:
            if slot < NEVER:
                self._adopted.add(self._enter(job, slot))
        if taken:
            self._wake.set()

    def _push(self, job: Job, slot: datetime) -> None:
        if slot >= NEVER:  # its window has ended: it has no slot to plan (jobs/windows.py)
            self._held.discard(job.name)
            return
        self._enter(job, slot)
        self._held.add(job.name)

    def _enter(self, job: Job, slot: datetime) -> int:
        """Put ``job``'s ``slot`` in the heap; its entry's sequence number."""
        seq = next(self._seq)
        heapq.heappush(self._heap, (slot, seq, job))
        self._at_slot[slot] = self._at_slot.get(slot, 0) + 1
        return seq

    def _owns(self, name: str) -> bool:
        return self.shares.owns(name)

    def plans(self, name: str) -> bool:
        """Whether ``name`` is planned here already (has its entry, or is being decided)."""
        return name in self._held

    def _pop(self) -> tuple[datetime, Job, bool]:
        slot, seq, job = heapq.heappop(self._heap)
        left = self._at_slot[slot] - 1
        if left:
            self._at_slot[slot] = left
        else:
            del self._at_slot[slot]
        adopted = seq in self._adopted
        if adopted:
            self._adopted.discard(seq)
        return slot, job, adopted

    def _mine(self, job: Job, adopted: bool) -> bool:
        """Whether an entry taken from the heap is fired here: a slot taken over is; a job's
        own entry only while this instance owns the job (else it is dropped: its owner plans
        it)."""
        if adopted or self._owns(job.name):
            return True
        self._held.discard(job.name)
        return False

    def _keeps(self, job: Job, slot: datetime) -> bool:
        """Whether an entry taken from the heap still stands: always, for code jobs (a runtime
        schedule's may have been removed or replaced since: :mod:`slotcron.engine.runtime`)."""
        return True

    def _resume(self, job: Job, slot: datetime, adopted: bool) -> None:
        """A job's late slots are decided: it plans on from ``slot``; one whose late slot was
        taken over only if it is this instance's now and not planned here already."""
        if not adopted or (self._owns(job.name) and not self.plans(job.name)):
            self._push_and_wake(job, slot)

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
            taken_over: list[bool] = []  # per `missed` entry: a slot taken over, not owned
            while self._heap and self._heap[0][0] <= horizon:
                slot, job, adopted = self._pop()
                if not self._mine(job, adopted):
                    continue
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
                        taken_over.append(adopted)
                        if passed is not None:
                            passed_over.append((job, passed))
                    else:
                        back = functools.partial(self._resume, job, resume, adopted)
                        firing.spawn(firing.misfire_then(job, late, now, back, passed), job)
                else:
                    after = schedule.next_after(slot)
                    if not adopted:
                        following.append((job, after))
                    # Never more than half its period ahead: its previous slot's run may still
                    # be deciding (or holding its lease). Such a job is claimed at its slot.
                    ahead = slot > now and (slot - now) * 2 > after - slot
                    (at_slot if ahead else due).append((job, slot))
            for job, after in following:
                self._push(job, after)
            self._dispatch(at_slot, due, missed, passed_over, taken_over, now)

    def _dispatch(
        self,
        at_slot: list[tuple[Job, datetime]],
        due: list[tuple[Job, datetime]],
        missed: list[tuple[Job, list[datetime], datetime]],
        passed_over: list[tuple[Job, misfire.PassedOver]],
        taken_over: list[bool],
        now: datetime,
    ) -> None:
        """Hand on what one look at the heap found: slots claimed at their time, slots due
        together (one burst), late slots of ``misfire="skip"`` jobs (recorded together)."""
        firing = self.firing
        for job, slot in at_slot:
            firing.spawn(firing.fire(job, slot), job)
        if len(due) == 1:
            firing.spawn(firing.fire(*due[0]), due[0][0])
        elif due:
            firing.spawn(self.burst.fire_together(due), None)
        if missed:
            flags = iter(taken_over)  # miss_together resumes the jobs in `missed`'s order

            def resume(job: Job, slot: datetime) -> None:
                self._resume(job, slot, next(flags, False))

            # Late slots of its own, not slots that passed before it planned their jobs (its
            # start-up, a reshare) nor ones taken over: a member behind takes nothing over.
            own = any(
                late and late[-1] >= self._since and not adopted
                for (_, late, _), adopted in zip(missed, taken_over, strict=True)
            )
            together = missed_slots.miss_together(firing, missed, now, resume, BATCH_SIZE, own=own)
            # Passed-over ranges first: their jobs' late slots would close them unrecorded.
            firing.spawn(firing.pass_over_then(passed_over, now, together), None)
