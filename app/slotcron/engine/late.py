"""Slots reached late: deciding them by the job's misfire policy, and recording those older
than ``catchup_window`` as one ``MISSED`` execution per passed-over range
(:meth:`LateSlots.pass_over`).

Part of :class:`slotcron.engine.firing.Firing` (what it gives: late slots decided in order,
before any newer slot of the job is claimed, so the high-water mark never closes them
unrecorded).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine, Mapping
from datetime import datetime, timedelta
from typing import Any, Unpack

from slotcron.clock import Clock
from slotcron.engine.claims import BUSY_DEADLINE, ClaimAsk, Claimer
from slotcron.engine.permits import Permits
from slotcron.engine.runner import Runner
from slotcron.jobs import misfire
from slotcron.jobs.registry import Job
from slotcron.lifeline.outage import DB_ERRORS, Backoff
from slotcron.schedule.slots import Schedule
from slotcron.status import Status, Trigger
from slotcron.store import passed_over as passed_store
from slotcron.store.claims import Claim

log = logging.getLogger("slotcron.scheduler")

SUMMED_UP = 5
"""Passed-over ranges recorded together past which one WARNING line sums them up."""


class LateSlots:
    """Late slots' decisions; mixed into :class:`slotcron.engine.firing.Firing`, which gives
    the claim, the spawning of tasks and the runs."""

    jobs: Mapping[str, Job]
    schedules: Mapping[str, Schedule]
    clock: Clock
    claimer: Claimer
    runner: Runner
    permits: Permits

    async def claim(self, job: Job, slot: datetime, **ask: Unpack[ClaimAsk]) -> Claim | None:
        raise NotImplementedError

    def spawn(self, coro: Coroutine[Any, Any, None], job: Job | None) -> None:
        raise NotImplementedError

    async def _run_claimed(self, job: Job, claim: Claim) -> None:
        raise NotImplementedError

    def reconcile(self, name: str, expected: datetime) -> bool:
        """Decide a job's overdue slots now, from ``expected`` (the leader's sweep after an
        outage). False when this instance does not have the job."""
        job = self.jobs.get(name)
        if job is None or self.claimer.closing:
            return False
        if self.superseded(name):
            return True  # another schedule is in force: its instances decide its slots
        now = self.clock.now()
        schedule = self.schedules[name]
        late, _ = misfire.late_slots(job, schedule, expected, now)
        passed = misfire.passed_over(job, schedule, expected, now)
        if late or passed:
            log.warning(
                "%s: deciding %d overdue slots from %s (misfire=%r)",
                name,
                len(late),
                expected.isoformat(),
                job.misfire,
            )
            self.spawn(self._reconcile(job, late, now, passed), job)
        return True

    async def _reconcile(
        self, job: Job, late: list[datetime], now: datetime, passed: misfire.PassedOver | None
    ) -> None:
        async with self.permits.one():
            await self.decide_late(job, late, now, passed)

    async def misfire_then(
        self,
        job: Job,
        late: list[datetime],
        now: datetime,
        resume: Callable[[], None],
        passed: misfire.PassedOver | None = None,
    ) -> None:
        """Account for slots this instance reached too late (``passed`` over, then ``late``),
        then ``resume`` normal firing."""
        try:
            async with self.permits.one():
                await self.decide_late(job, late, now, passed)
        finally:
            resume()

    async def pass_over_then(
        self,
        ranges: list[tuple[Job, misfire.PassedOver]],
        now: datetime,
        then: Coroutine[Any, Any, None],
    ) -> None:
        """Record ``ranges`` (:meth:`pass_over`), then await ``then`` (which decides the later
        slots of their jobs), whatever became of the ranges."""
        try:
            await self.pass_over(ranges, now)
        finally:
            await then

    async def pass_over(self, ranges: list[tuple[Job, misfire.PassedOver]], now: datetime) -> None:
        """Record each passed-over range as one ``MISSED`` execution, before any later slot of
        its job is decided (a later slot decided first would close the range unrecorded).

        A range found decided in part (another instance back from the same outage, whose
        window edge came later, recorded a longer range or its first late slots) is recorded
        from the slot after what was decided, to its end: no slot is left out, none is on the
        record twice. A database outage is waited out up to :data:`BUSY_DEADLINE`."""
        todo = {job.name: (job, passed) for job, passed in ranges}
        deadline = self.clock.now() + timedelta(seconds=BUSY_DEADLINE)
        backoff = Backoff(jitter=0.5)
        while todo and not self.claimer.closing:
            try:
                outcomes = await passed_store.record(
                    self.claimer.db,
                    [self._range(job, passed) for job, passed in todo.values()],
                    instance_id=self.claimer.instance_id,
                    now=self.clock.now(),
                )
            except DB_ERRORS as exc:
                self.claimer.outage.failed(exc, f"recording {len(todo)} passed-over ranges")
                if self.clock.now() > deadline:
                    log.warning("gave up recording passed-over slots of %s", ", ".join(todo))
                    return
                await backoff.wait()
                continue
            self.claimer.outage.recovered()
            rest: dict[str, tuple[Job, misfire.PassedOver]] = {}
            refused = [name for name, outcome in outcomes.items() if outcome.superseded]
            if refused and self.claimer.supersession is not None:
                await self.claimer.supersession.refused(refused)
            recorded = [name for name, outcome in outcomes.items() if outcome.execution_id]
            if len(recorded) > SUMMED_UP:
                log.warning(
                    "%d jobs had slots older than their catchup_window: each range recorded "
                    "MISSED as one execution (%s, ...)",
                    len(recorded),
                    ", ".join(recorded[:SUMMED_UP]),
                )
            for name, outcome in outcomes.items():
                job, passed = todo[name]
                if outcome.execution_id is not None:
                    self._passed_over(job, passed, outcome.execution_id, len(recorded))
                elif outcome.high_water is not None and outcome.high_water < passed.last:
                    schedule = self.schedules[name]
                    first = schedule.next_after(outcome.high_water)
                    rest[name] = (job, misfire.passed_over_range(job, schedule, first, passed.last))
            todo = rest

    def superseded(self, name: str) -> bool:
        """Whether a newer registration's schedule of the job is in force: not ours to fire."""
        supersession = self.claimer.supersession
        return supersession is not None and name in supersession.superseded

    def passed_over(
        self, job: Job, expected: datetime, slot: datetime, now: datetime
    ) -> misfire.PassedOver | None:
        """The range of a gap (slots from ``expected`` before ``slot``) older than
        ``catchup_window``, to record before the gap's later slots."""
        return misfire.passed_over(job, self.schedules[job.name], expected, now, before=slot)

    def _range(self, job: Job, passed: misfire.PassedOver) -> passed_store.Range:
        return passed_store.Range(
            job_name=job.name,
            first=passed.first,
            last=passed.last,
            following=self.schedules[job.name].next_after(passed.last),
            trigger=job.trigger,
            reason=passed.reason,
            fingerprint=self.claimer.fingerprint(job),
        )

    def _passed_over(
        self, job: Job, passed: misfire.PassedOver, execution_id: int, together: int
    ) -> None:
        """Announce a recorded range, as the claimer does a slot recorded MISSED (the run log
        writes one WARNING each, unless many were recorded ``together``: then summed up)."""
        record = Claim(
            execution_id=execution_id,
            job_name=job.name,
            scheduled_at=passed.first,
            trigger=job.trigger,
            status=Status.MISSED,
            attempt=1,
            lease_until=None,
            lease_ms=None,
            reason=passed.reason,
        )
        count = None
        if self.claimer.events.hooked("slots_passed"):  # only a user hook reads the count
            count = misfire.count_slots(self.schedules[job.name], passed.first, passed.last)
        self.claimer.events.slots_passed(record, last=passed.last, count=count, together=together)

    async def decide_late(
        self,
        job: Job,
        late: list[datetime],
        now: datetime,
        passed: misfire.PassedOver | None = None,
    ) -> None:
        """Record the ``passed``-over range, then decide ``late`` slots in order by the job's
        misfire policy (:func:`misfire.decide`)."""
        if passed is not None:
            await self.pass_over([(job, passed)], now)
        for verdict in misfire.decide(job, late):
            if not verdict.run:
                await self.claim(
                    job,
                    verdict.slot,
                    trigger=job.trigger,
                    check_gap=False,
                    missed_reason=misfire.missed_reason(job, verdict.slot, now),
                )
                continue
            claim = await self.claim(
                job,
                verdict.slot,
                trigger=Trigger.CATCHUP,
                check_gap=False,
                # misfire="all" runs every missed slot: under forbid, one after another, each
                # waiting for the run before it (this instance's or another's: every instance
                # back from an outage decides the same slots), never SKIPPED for overlapping it.
                wait_for_lease=job.catchup_window if job.misfire == "all" else None,
            )
            if claim is None or claim.status != Status.RUNNING:
                continue
            if job.overlap == "forbid":
                # One after another: each catch-up run ends before the next slot is claimed,
                # so forbid holds and none of them is SKIPPED for overlapping its predecessor.
                await self.runner.run(job, claim)
            else:
                self.spawn(self._run_claimed(job, claim), job)
