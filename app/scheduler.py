"""Plan and fire: one heap of next slots, one wake-up at the earliest, one task per due job.

Firing is O(jobs due now): the planner never scans the registered jobs. It never awaits one
job's claim before starting the next: every due job gets its own task at once (guarantee 6).
Slots that nobody decided in time (this instance late, every instance down, the database
down) go through the job's misfire policy before any newer slot is claimed.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import time
from collections.abc import Coroutine, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from app.claims import Claimer
from app.clock import Clock
from app.errors import SlotsUndecided
from app.registry import Job
from app.runner import Runner
from app.schedule import Schedule, slots_between
from app.store.claims import Claim, Due

log = logging.getLogger("slotcron.scheduler")

MIN_GRACE = timedelta(seconds=1)
MAX_GRACE = timedelta(seconds=60)
_TICK = timedelta(microseconds=1)

BATCH_SIZE = 500
"""Slots decided per claim transaction. A larger burst is split into chunks."""
CHUNKS_IN_FLIGHT = 2

LEAD_BASE = 0.01
"""Seconds ahead of their time that slots due together are claimed, plus the measured cost of
claiming each of them: their runs then start on time instead of as their chunk is decided."""
LEAD_MAX = 1.0
CLAIM_COST_FIRST = 100e-6  # as measured on a 2-core machine, PostgreSQL on loopback
"""Seconds per slot claimed together, until measured on this instance."""


def grace(schedule: Schedule, slot: datetime) -> timedelta:
    """How late a slot may still be started: until its successor is due, between 1 s and 60 s."""
    return min(max(schedule.next_after(slot) - slot, MIN_GRACE), MAX_GRACE)


def missed_reason(job: Job, slot: datetime, now: datetime) -> str:
    """Why a late slot is recorded MISSED: how late it was reached, and the policy."""
    lateness = (now - slot).total_seconds()
    return f"misfire: not claimed until {lateness:.1f} s after its time (misfire={job.misfire!r})"


class Scheduler:
    def __init__(
        self,
        jobs: Sequence[Job],
        *,
        clock: Clock,
        claimer: Claimer,
        runner: Runner,
        capacity: int,
        default_timezone: str,
    ) -> None:
        self.clock = clock
        self.claimer = claimer
        self.runner = runner
        self._capacity = asyncio.Semaphore(capacity)
        self._schedules = {job.name: job.schedule(default_timezone) for job in jobs}
        self._jobs = [job for job in jobs if job.enabled]
        self._by_name = {job.name: job for job in self._jobs}
        self._heap: list[tuple[datetime, int, Job]] = []
        self._at_slot: dict[datetime, int] = {}  # how many heap entries share each slot
        self._claim_cost = CLAIM_COST_FIRST
        self._seq = itertools.count()
        self._tasks: set[asyncio.Task[None]] = set()
        self._claiming: set[asyncio.Task[None]] = set()
        self._planner: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        # Chunks in flight at once: two keep both the database and this loop busy; more would
        # interleave on the loop, and every chunk (not only the last) would finish late.
        self._claiming_chunks = asyncio.Semaphore(CHUNKS_IN_FLIGHT)

    def schedule_of(self, job: Job) -> Schedule:
        return self._schedules[job.name]

    def start(self, expected: Mapping[str, datetime | None] | None = None) -> None:
        """Start planning. ``expected`` is each job's next undecided slot as the cluster stored
        it: one in the past means slots were missed while no instance ran them."""
        now = self.clock.now()
        for job in self._jobs:
            schedule = self.schedule_of(job)
            first = schedule.next_after(now)
            stored = (expected or {}).get(job.name)
            if stored is not None and stored < first:
                first = min(first, schedule.next_after(stored - _TICK))
            self._push(job, first)
        self._planner = asyncio.create_task(self._plan(), name="slotcron-planner")

    def _push(self, job: Job, slot: datetime) -> None:
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

    def _lead(self) -> timedelta:
        """How far ahead of the earliest slot to claim it: none for a lone job; for jobs due
        together, what claiming them all is measured to take (bounded)."""
        if not self._heap:
            return timedelta(0)
        slot, _, job = self._heap[0]
        together = self._at_slot[slot]
        if together < 2:
            return timedelta(0)
        # At most half a period ahead: the previous slot's runs have had time to end (a forbid
        # job's slot claimed while its lease is held is deferred, and claimed again at its time).
        half_period = (self.schedule_of(job).next_after(slot) - slot).total_seconds() / 2
        return timedelta(
            seconds=min(LEAD_MAX, half_period, LEAD_BASE + together * self._claim_cost)
        )

    def _push_and_wake(self, job: Job, slot: datetime) -> None:
        self._push(job, slot)
        self._wake.set()

    async def _sleep_until_due(self) -> None:
        """Sleep until the earliest slot, or until the heap changes under us."""
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
        while True:
            await self._sleep_until_due()
            now = self.clock.now()
            horizon = now
            if self._heap and self._heap[0][0] - self._lead() <= now:
                horizon = max(now, self._heap[0][0])  # the earliest slot's jobs, claimed ahead
            due: list[tuple[Job, datetime]] = []
            at_slot: list[tuple[Job, datetime]] = []
            missed: list[tuple[Job, list[datetime], datetime]] = []
            following: list[tuple[Job, datetime]] = []  # pushed after the sweep: once per job
            while self._heap and self._heap[0][0] <= horizon:
                slot, job = self._pop()
                schedule = self.schedule_of(job)
                if now - slot > grace(schedule, slot):
                    late, resume = self._late_slots(job, slot, now)
                    # The job re-enters the heap only once its late slots are decided: a newer
                    # slot claimed first would close them (the high-water mark) unrecorded.
                    if job.misfire == "skip":
                        missed.append((job, late, resume))
                    else:
                        self._spawn(self._misfire(job, late, now, resume), job)
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
                self._spawn(self._fire(job, slot), job)
            if len(due) == 1:
                self._spawn(self._fire(*due[0]), due[0][0])
            elif due:
                self._spawn(self._fire_together(due), None)
            if missed:
                self._spawn(self._miss_together(missed, now), None)

    def _spawn(self, coro: Coroutine[Any, Any, None], job: Job | None) -> None:
        task = asyncio.create_task(coro, name=f"slotcron-{job.name if job else 'due'}")
        self._tasks.add(task)
        self._claiming.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(self._claiming.discard)

    def _past_claim(self) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._claiming.discard(task)  # past the claim: shutdown lets it drain

    async def _claim(
        self,
        job: Job,
        slot: datetime,
        *,
        trigger: str,
        missed_reason: str | None = None,
        check_gap: bool = True,
        give_up_at: datetime | None = None,
    ) -> Claim | None:
        return await self.claimer.claim(
            job,
            slot,
            trigger=trigger,
            following=self.schedule_of(job).next_after(slot),
            missed_reason=missed_reason,
            check_gap=check_gap,
            give_up_at=give_up_at,
        )

    async def _fire(self, job: Job, slot: datetime) -> None:
        # Past its grace, a slot is no longer started as if on time: it is left to the misfire
        # policy (found by the next claim, or by the leader's sweep).
        give_up_at = slot + grace(self.schedule_of(job), slot)
        await self.clock.sleep_until(slot)  # one job alone is claimed at its time, not ahead
        async with self._capacity:
            try:
                claim = await self._claim(job, slot, trigger=job.trigger, give_up_at=give_up_at)
            except SlotsUndecided as gap:
                # Slots before this one were never decided: account for them first, in order.
                expected: datetime = gap.expected  # type: ignore[assignment]
                now = self.clock.now()
                start = self._window_start(job, expected, now)
                late = list(slots_between(self.schedule_of(job), start - _TICK, slot - _TICK))
                log.warning(
                    "%s: %d slots from %s were never claimed (no live instance or no database); "
                    "applying misfire=%r",
                    job.name,
                    len(late),
                    gap.expected,
                    job.misfire,
                )
                await self._decide_late(job, late, now)
                claim = await self._claim(
                    job, slot, trigger=job.trigger, check_gap=False, give_up_at=give_up_at
                )
            self._past_claim()
            if claim is None or claim.status != "RUNNING":
                return  # the claimer logged and counted what it recorded instead
            await self.runner.run(job, claim)

    async def _fire_together(self, due: list[tuple[Job, datetime]]) -> None:
        """Claim every slot due at once in a few transactions, then start each run in its own
        task. Only as many are claimed as this instance has capacity for; the rest wait for
        capacity and are claimed together in turn. Whatever a batch could not decide goes
        through :meth:`_fire`, one by one."""
        while due:
            await self._capacity.acquire()
            permitted = 1
            while permitted < len(due) and not self._capacity.locked():
                await self._capacity.acquire()  # free capacity: returns at once
                permitted += 1
            batch, due = due[:permitted], due[permitted:]
            # In chunks claimed concurrently: the first runs start while the database is still
            # deciding later chunks, and no transaction holds thousands of rows.
            chunks = [batch[i : i + BATCH_SIZE] for i in range(0, len(batch), BATCH_SIZE)]
            began = time.perf_counter()
            await asyncio.gather(*(self._claim_together(chunk) for chunk in chunks))
            cost = (time.perf_counter() - began) / len(batch)
            # What the next burst's lead is sized by: recent bursts weigh most.
            self._claim_cost = min(max(0.7 * self._claim_cost + 0.3 * cost, 5e-6), 1e-3)

    def _give_back(self, permits: int) -> None:
        """Return capacity permits taken for slots that will not run here after all."""
        for _ in range(permits):
            self._capacity.release()

    async def _claim_together(
        self, batch: list[tuple[Job, datetime]], *, check_gap: bool = True
    ) -> None:
        """Claim ``batch`` under capacity permits already taken, one per slot; each permit is
        given back when its slot's run ends, or at once if the slot does not run here."""
        try:
            await self._claiming_chunks.acquire()
        except BaseException:  # cancelled while waiting its turn (shutdown)
            self._give_back(len(batch))
            raise
        try:
            await self._claim_chunk(batch, check_gap)
        finally:
            self._claiming_chunks.release()

    async def _claim_chunk(self, batch: list[tuple[Job, datetime]], check_gap: bool) -> None:
        jobs = {job.name: job for job, _ in batch}
        items = [self._due(job, slot, check_gap) for job, slot in batch]
        ends: dict[tuple[int, datetime], datetime] = {}  # jobs mostly share a few schedules
        for job, slot in batch:
            schedule = self._schedules[job.name]
            if (id(schedule), slot) not in ends:
                ends[id(schedule), slot] = slot + grace(schedule, slot)
        give_up_at = min(ends.values())
        try:
            decided = await self.claimer.claim_many(items, give_up_at=give_up_at)
        except BaseException:
            self._give_back(len(batch))
            raise
        for name, claim in decided.claims.items():
            if claim.status == "RUNNING":
                self._start_run(jobs[name], claim)
                continue
            self._capacity.release()  # SKIPPED: logged and counted by the claimer
        for _ in decided.taken:
            self._capacity.release()
        gaps: list[tuple[Job, datetime]] = []
        for item in decided.undecided:
            job = jobs[item.job_name]
            if job.misfire == "skip":  # many at once after an overload: together, in order
                gaps.append((job, item.slot))
                continue
            self._capacity.release()
            self._spawn(self._fire(job, item.slot), job)
        if gaps:  # keeping their permits
            self._spawn(self._close_gaps(gaps, decided.expected), None)
        for item in decided.held:
            self._capacity.release()
            self._spawn(self._fire(jobs[item.job_name], item.slot), jobs[item.job_name])
        if decided.deferred:  # keeping their permits
            deferred = [(jobs[item.job_name], item.slot) for item in decided.deferred]
            self._spawn(self._claim_at_slot(deferred), None)

    async def _claim_at_slot(self, batch: list[tuple[Job, datetime]]) -> None:
        """Claim together, once their time has come, the slots a batch claimed ahead deferred
        (a forbid job's lease was still held): under load there may be thousands, and one
        claim each would put the instance further behind."""
        try:
            await self.clock.sleep_until(max(slot for _, slot in batch))
        except BaseException:
            self._give_back(len(batch))
            raise
        await self._claim_together(batch)

    async def _close_gaps(
        self, batch: list[tuple[Job, datetime]], expected: Mapping[str, datetime]
    ) -> None:
        """Record MISSED, together, the slots of ``misfire="skip"`` jobs that no instance
        decided before ``batch``'s (claims that gave up under overload, say), then claim the
        batch's slots together: one job at a time, thousands of such gaps would put this
        instance further behind, and leave more gaps at the next slot."""
        try:
            now = self.clock.now()
            missed: list[tuple[Job, list[datetime]]] = []
            for job, slot in batch:
                start = self._window_start(job, expected[job.name], now)
                late = list(slots_between(self.schedule_of(job), start - _TICK, slot - _TICK))
                missed.append((job, late))
            await self._record_missed(missed, now)
            if count := sum(len(late) for _, late in missed):
                log.warning(
                    "%d slots of %d jobs were never claimed (no live instance, no database, or "
                    "an overloaded one): recorded MISSED (misfire='skip')",
                    count,
                    len(missed),
                )
        except BaseException:
            self._give_back(len(batch))
            raise
        # Their gaps are decided (or were older than catchup_window, passed over): no new check.
        await self._claim_together(batch, check_gap=False)

    async def _miss_together(
        self, missed: list[tuple[Job, list[datetime], datetime]], now: datetime
    ) -> None:
        """Record late slots of ``misfire="skip"`` jobs MISSED, many jobs per transaction: an
        overloaded or paused instance that falls behind on thousands of jobs catches up in a
        few statements, instead of falling further behind deciding them one by one."""
        try:
            await self._record_missed([(job, late) for job, late, _ in missed], now)
            count = sum(len(late) for _, late, _ in missed)
            if count:
                log.warning(
                    "%d slots of %d jobs reached past their grace: recorded MISSED "
                    "(misfire='skip')",
                    count,
                    len(missed),
                )
        finally:
            for job, _, resume in missed:
                self._push(job, resume)
            self._wake.set()

    async def _record_missed(self, missed: list[tuple[Job, list[datetime]]], now: datetime) -> None:
        """The k-th late slot of every job goes in round k, so each job's slots stay in order."""
        if not missed:
            return
        jobs = {job.name: job for job, _ in missed}
        for k in range(max(len(late) for _, late in missed)):
            items = [
                Due(
                    job_name=job.name,
                    slot=late[k],
                    following=self.schedule_of(job).next_after(late[k]),
                    trigger=job.trigger,
                    lease_ms=0,
                    forbid_overlap=False,
                    missed_reason=missed_reason(job, late[k], now),
                    check_gap=False,
                )
                for job, late in missed
                if k < len(late)
            ]
            for begin in range(0, len(items), BATCH_SIZE):
                chunk = items[begin : begin + BATCH_SIZE]
                decided = await self.claimer.claim_many(chunk, give_up_at=now + MAX_GRACE)
                for item in decided.held + decided.undecided:  # one by one, in order
                    await self._claim(
                        jobs[item.job_name],
                        item.slot,
                        trigger=item.trigger,
                        check_gap=False,
                        missed_reason=item.missed_reason,
                    )

    def _due(self, job: Job, slot: datetime, check_gap: bool = True) -> Due:
        return Due(
            job_name=job.name,
            slot=slot,
            following=self._schedules[job.name].next_after(slot),
            trigger=job.trigger,
            lease_ms=job.lease_ms(self.claimer.default_lease),
            forbid_overlap=job.overlap == "forbid",
            check_gap=check_gap,
        )

    def _start_run(self, job: Job, claim: Claim) -> None:
        """Run a claim made under a capacity permit already taken; give the permit back after."""

        # Claimed ahead of its time, it starts at its slot (by the database's clock), not now.
        start_at = claim.scheduled_at if claim.scheduled_at > self.clock.now() else None

        async def run() -> None:
            try:
                await self.runner.run(job, claim, start_at)
            finally:
                self._capacity.release()

        task = asyncio.create_task(run(), name=f"slotcron-{job.name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_claimed(self, job: Job, claim: Claim) -> None:
        self._past_claim()
        async with self._capacity:
            await self.runner.run(job, claim)

    def reconcile(self, name: str, expected: datetime) -> bool:
        """Decide a job's overdue slots now, from ``expected`` (the leader's sweep after an
        outage). False when this instance does not have the job."""
        job = self._by_name.get(name)
        if job is None or self.claimer.closing:
            return False
        now = self.clock.now()
        late, _ = self._late_slots(job, expected, now)
        if late:
            log.warning(
                "%s: deciding %d overdue slots from %s (misfire=%r)",
                name,
                len(late),
                expected.isoformat(),
                job.misfire,
            )
            self._spawn(self._reconcile(job, late, now), job)
        return True

    async def _reconcile(self, job: Job, late: list[datetime], now: datetime) -> None:
        async with self._capacity:
            await self._decide_late(job, late, now)

    def start_claimed(self, job: Job, claim: Claim) -> None:
        """Run an execution another role started (a QUEUED retry), under the same capacity
        and shutdown rules as scheduled runs."""
        self._spawn(self._run_claimed(job, claim), job)

    def _late_slots(
        self, job: Job, first: datetime, now: datetime
    ) -> tuple[list[datetime], datetime]:
        """The slots from ``first`` on that are past their grace, within ``catchup_window``,
        and the first slot that is not late (where normal firing resumes)."""
        schedule = self.schedule_of(job)
        late: list[datetime] = []
        slot = schedule.next_after(self._window_start(job, first, now) - _TICK)
        while slot <= now and now - slot > grace(schedule, slot):
            late.append(slot)
            slot = schedule.next_after(slot)
        return late, slot

    def _window_start(self, job: Job, first: datetime, now: datetime) -> datetime:
        """Where deciding late slots starts: ``first``, or the edge of ``catchup_window``.
        Older slots are passed over (not enumerated: an outage of days must not stall us)."""
        edge = now - timedelta(seconds=job.catchup_window)
        if first >= edge:
            return first
        log.warning(
            "%s: slots from %s to %s are older than catchup_window=%gs: passed over",
            job.name,
            first.isoformat(),
            edge.isoformat(),
            job.catchup_window,
        )
        return edge

    async def _misfire(
        self, job: Job, late: list[datetime], now: datetime, resume: datetime
    ) -> None:
        """Account for slots this instance reached too late, then resume normal firing."""
        try:
            async with self._capacity:
                await self._decide_late(job, late, now)
        finally:
            self._push_and_wake(job, resume)

    async def _decide_late(self, job: Job, late: list[datetime], now: datetime) -> None:
        """By the job's misfire policy: ``skip`` records each MISSED, ``once`` runs the newest
        as ``catchup`` and records the rest MISSED, ``all`` runs each in order as ``catchup``."""
        run = {"skip": [], "once": late[-1:], "all": late}[job.misfire]
        for slot in late:
            if slot not in run:
                await self._claim(
                    job,
                    slot,
                    trigger=job.trigger,
                    check_gap=False,
                    missed_reason=missed_reason(job, slot, now),
                )
                continue
            claim = await self._claim(job, slot, trigger="catchup", check_gap=False)
            if claim is None or claim.status != "RUNNING":
                continue
            if job.overlap == "forbid":
                # One after another: each catch-up run ends before the next slot is claimed,
                # so forbid holds and none of them is SKIPPED for overlapping its predecessor.
                await self.runner.run(job, claim)
            else:
                self._spawn(self._run_claimed(job, claim), job)

    async def stop_claiming(self, timeout: float = 5.0) -> None:
        """Phase 1 of shutdown: claim nothing more. Claims already under way finish (they are
        short), so a slot is never left half-decided; runs go on."""
        self.claimer.closing = True
        if self._planner is not None:
            self._planner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._planner
        if self._claiming:
            _, pending = await asyncio.wait(set(self._claiming), timeout=timeout)
            for task in pending:
                if task in self._claiming:
                    task.cancel()
