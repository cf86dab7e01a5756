"""Firing: claiming a slot for this instance and starting its run, under the capacity permits.

Every claim and run task is spawned here, so shutdown's phase 1 (:meth:`Firing.stop_claiming`)
finds every claim under way: they are short and finish, so no slot is left half-decided; runs
go on. Late slots are decided by the job's misfire policy (:mod:`slotcron.jobs.misfire`) before any
newer
slot of the job is claimed: a newer slot claimed first would close them (the high-water mark)
unrecorded. Slots older than ``catchup_window`` are recorded first of all, as one ``MISSED``
execution per passed-over range (:meth:`Firing.pass_over`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from slotcron.clock import Clock
from slotcron.engine.claims import BUSY_DEADLINE, Claimer
from slotcron.engine.permits import Permits
from slotcron.engine.runner import Runner
from slotcron.errors import SlotsUndecided
from slotcron.jobs import misfire
from slotcron.jobs.registry import Job
from slotcron.lifeline.outage import DB_ERRORS, Backoff
from slotcron.observe import alerts
from slotcron.observe.logs import run_fields
from slotcron.schedule.slots import Schedule
from slotcron.status import Status, Trigger
from slotcron.store import passed_over as passed_store
from slotcron.store import runs as run_store
from slotcron.store.claims import Claim

log = logging.getLogger("slotcron.scheduler")

SUMMED_UP = 5
"""Passed-over ranges recorded together past which one WARNING line sums them up."""


class Firing:
    def __init__(
        self,
        jobs: Mapping[str, Job],
        schedules: Mapping[str, Schedule],
        *,
        clock: Clock,
        claimer: Claimer,
        runner: Runner,
        permits: Permits,
    ) -> None:
        self.jobs = jobs
        self.schedules = schedules
        self.clock = clock
        self.claimer = claimer
        self.runner = runner
        self.permits = permits
        self._tasks: set[asyncio.Task[None]] = set()
        self._claiming: set[asyncio.Task[None]] = set()

    def spawn(self, coro: Coroutine[Any, Any, None], job: Job | None) -> None:
        """Run ``coro`` (a claim and what follows it) in a task that shutdown waits for while
        it is claiming."""
        task = asyncio.create_task(coro, name=f"slotcron-{job.name if job else 'due'}")
        self._tasks.add(task)
        self._claiming.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(self._claiming.discard)

    def _past_claim(self) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._claiming.discard(task)  # past the claim: shutdown lets it drain

    async def claim(
        self,
        job: Job,
        slot: datetime,
        *,
        trigger: str,
        missed_reason: str | None = None,
        check_gap: bool = True,
        give_up_at: datetime | None = None,
        wait_for_lease: float | None = None,
        behind: str = "any",
    ) -> Claim | None:
        return await self.claimer.claim(
            job,
            slot,
            trigger=trigger,
            following=self.schedules[job.name].next_after(slot),
            missed_reason=missed_reason,
            check_gap=check_gap,
            give_up_at=give_up_at,
            wait_for_lease=wait_for_lease,
            behind=behind,
        )

    async def fire(self, job: Job, slot: datetime) -> None:
        """Claim one slot at its time (not ahead) and run it here if this instance won it."""
        schedule = self.schedules[job.name]
        # Past its grace, a slot is no longer started as if on time: it is left to the misfire
        # policy (found by the next claim, or by the leader's sweep).
        give_up_at = slot + misfire.grace(schedule, slot)
        # Under misfire="all", a slot that comes while catch-up runs are still running the
        # missed slots before it waits its turn behind them (and runs late: a catch-up too).
        queue_up = job.catchup_window if job.misfire == "all" else None
        await self.clock.sleep_until(slot)
        async with self.permits.one(give_up_at.timestamp()):
            try:
                claim = await self.claim(
                    job,
                    slot,
                    trigger=job.trigger,
                    give_up_at=give_up_at,
                    wait_for_lease=queue_up,
                    behind=Trigger.CATCHUP.value,
                )
            except SlotsUndecided as gap:
                # Slots before this one were never decided: account for them first, in order.
                expected: datetime = gap.expected  # type: ignore[assignment]
                now = self.clock.now()
                late = misfire.undecided_before(job, schedule, expected, slot, now)
                passed = self.passed_over(job, expected, slot, now)
                log.warning(
                    "%s: %d slots from %s were never claimed (no live instance or no database); "
                    "applying misfire=%r",
                    job.name,
                    len(late),
                    gap.expected,
                    job.misfire,
                )
                await self.decide_late(job, late, now, passed)
                claim = await self.claim(
                    job,
                    slot,
                    trigger=job.trigger,
                    check_gap=False,
                    give_up_at=give_up_at,
                    wait_for_lease=queue_up,
                    behind=Trigger.CATCHUP.value,
                )
            self._past_claim()
            if claim is None or claim.status != Status.RUNNING:
                return  # the claimer logged and counted what it recorded instead
            on_time = await self.on_time(job, claim, give_up_at)
            if on_time is not None:
                await self.runner.run(job, on_time)

    async def on_time(self, job: Job, claim: Claim, give_up_at: datetime) -> Claim | None:
        """``claim`` if it may start as an on-time run. A claim that committed past its slot's
        grace (its transaction hung, say) does not: the misfire policy decides the slot, as if
        the claim had given up: ``skip`` records it MISSED (None), ``once``/``all`` run it as
        ``catchup``. Catch-up and manual runs are never late."""
        if claim.trigger not in (Trigger.CRON, Trigger.INTERVAL):
            return claim
        now = self.clock.now()
        if now <= give_up_at:
            return claim
        reason = None
        if job.misfire == "skip":
            reason = misfire.missed_reason(job, claim.scheduled_at, now)
        log.warning(
            "%s slot %s was claimed %.1f s after its time, past its grace: %s",
            job.name,
            claim.scheduled_at.isoformat(),
            (now - claim.scheduled_at).total_seconds(),
            "recorded MISSED" if reason else "run as a catch-up",
        )
        try:
            ours = await run_store.claimed_late(
                self.claimer.db,
                run=claim.key,
                instance_id=self.claimer.instance_id,
                now=now,
                missed_reason=reason,
            )
        except DB_ERRORS as exc:
            # Not started, not renewed: its lease lapses and the leader records it ABANDONED.
            self.claimer.outage.failed(exc, f"recording late claim {claim.execution_id}")
            return None
        if not ours or reason is not None:
            if ours:
                self.claimer.metrics.slot_recorded(job.name, Status.MISSED)
            return None
        return replace(claim, trigger=Trigger.CATCHUP)

    def start_run(
        self,
        job: Job,
        claim: Claim,
        give_up_at: datetime,
        start: asyncio.Future[bool] | None = None,
        *,
        ahead: bool = False,
    ) -> None:
        """Run a claim made under a permit already taken; give the permit back after. A claim
        made ahead of its slot starts when its kick-off (``start``: the database stamps its
        start at the slot, unless its job was paused meanwhile) says so. Past ``give_up_at``
        (its slot's grace) a claim is late: see :meth:`on_time`.

        ``ahead``: the permit taken is an ahead permit (:class:`slotcron.engine.permits.Permits`):
        the run
        takes a run permit once its slot has come (the most urgent first), and gives the ahead
        permit back then."""
        held: list[bool] = [not ahead]  # whether this run holds a run permit

        async def take_run_permit() -> bool:
            try:
                if not await self._run_permit(job, claim, give_up_at):
                    return False
                held[0] = True
                return True
            finally:
                self.permits.ahead.give_back()

        async def at_slot() -> bool:
            assert start is not None
            if not await start:
                self.permits.ahead.give_back()
                return False
            return await take_run_permit()

        async def run() -> None:
            try:
                gate = start
                if ahead and start is not None:
                    gate = asyncio.ensure_future(at_slot())
                elif ahead and not await take_run_permit():
                    return
                on_time = claim if gate is not None else await self.on_time(job, claim, give_up_at)
                if on_time is not None:
                    await self.runner.run(job, on_time, gate)
            finally:
                if held[0]:
                    self.permits.give_back()

        task = asyncio.create_task(run(), name=f"slotcron-{job.name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_permit(self, job: Job, claim: Claim, give_up_at: datetime) -> bool:
        """A run permit for a run claimed ahead whose slot has come, the most urgent first;
        False when the instance had no capacity for it before its grace ended (a ``skip`` job:
        recorded MISSED, saying so; ``once`` and ``all`` wait on: the slot runs late)."""
        deadline = give_up_at.timestamp()
        if job.misfire != "skip":
            await self.permits.run.take(deadline)
            return True
        wait = max((give_up_at - self.clock.now()).total_seconds(), 0.0)
        try:
            async with asyncio.timeout(wait):
                await self.permits.run.take(deadline)
            return True
        except TimeoutError:
            pass
        reason = (
            f"no capacity: {self.permits.run.capacity} runs (SCHEDULER_MAX_CONCURRENCY) were "
            f"in flight on instance {self.claimer.instance_id} until the slot's grace ended"
        )
        log.warning("%s slot %s MISSED: %s", job.name, claim.scheduled_at.isoformat(), reason)
        try:
            if await run_store.claimed_late(
                self.claimer.db,
                run=claim.key,
                instance_id=self.claimer.instance_id,
                now=self.clock.now(),
                missed_reason=reason,
            ):
                self.claimer.metrics.slot_recorded(job.name, Status.MISSED)
        except DB_ERRORS as exc:
            # Not started, not renewed: its lease lapses and the leader decides it.
            self.claimer.outage.failed(exc, f"recording {job.name} MISSED")
        return False

    async def _run_claimed(self, job: Job, claim: Claim) -> None:
        self._past_claim()
        async with self.permits.one():
            await self.runner.run(job, claim)

    async def _run_taken(self, job: Job, claim: Claim) -> None:
        self._past_claim()
        # A run taken from the queue can wait as long as a slot's longest grace.
        async with self.permits.one((self.clock.now() + misfire.MAX_GRACE).timestamp()):
            if claim.trigger in (Trigger.CRON, Trigger.INTERVAL):
                # A slot handed back unstarted (its claimer died, stopped or was fenced first):
                # on time within its grace, else its job's misfire policy decides it.
                schedule = self.schedules[job.name]
                give_up_at = claim.scheduled_at + misfire.grace(schedule, claim.scheduled_at)
                on_time = await self.on_time(job, claim, give_up_at)
                if on_time is None:
                    return
                claim = on_time
            await self.runner.run(job, claim)

    def start_claimed(self, job: Job, claim: Claim) -> None:
        """Run an execution another role took from the queue (a manual run, restart, retry, or
        a slot handed back before its start), under the same capacity and shutdown rules as
        scheduled runs."""
        self.spawn(self._run_taken(job, claim), job)

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
        """Log, count and alert a recorded range, as the claimer does a slot recorded MISSED
        (one WARNING each, unless many were recorded ``together``: then summed up)."""
        instance_id = self.claimer.instance_id
        log.log(
            logging.WARNING if together <= SUMMED_UP else logging.DEBUG,
            "%s: %s; recorded MISSED as execution %d",
            job.name,
            passed.reason,
            execution_id,
            extra=run_fields(job.name, passed.first, execution_id, instance_id, Status.MISSED),
        )
        self.claimer.metrics.slot_recorded(job.name, Status.MISSED)
        alerts.of(instance_id).not_run(
            Claim(
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
        )

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

    async def stop_claiming(self, timeout: float = 5.0) -> None:
        """Phase 1 of shutdown: claim nothing more. Claims already under way finish (they are
        short), so a slot is never left half-decided; runs go on."""
        self.claimer.closing = True
        if self._claiming:
            _, pending = await asyncio.wait(set(self._claiming), timeout=timeout)
            for task in pending:
                if task in self._claiming:
                    task.cancel()
