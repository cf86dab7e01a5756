"""Firing: claiming a slot for this instance and starting its run, under the capacity permits.

Every claim and run task is spawned here, so shutdown's phase 1 (:meth:`Firing.stop_claiming`)
finds every claim under way: they are short and finish, so no slot is left half-decided; runs
go on. Late slots are decided by the job's misfire policy before any newer slot of the job is
claimed (:mod:`slotcron.engine.late`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Coroutine, Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any, Unpack

from slotcron.clock import Clock
from slotcron.engine.claims import ClaimAsk, Claimer
from slotcron.engine.late import LateSlots
from slotcron.engine.late_claims import NO_CAPACITY, LateClaims
from slotcron.engine.permits import Permits
from slotcron.engine.runner import Runner
from slotcron.errors import SlotsUndecided
from slotcron.jobs import misfire
from slotcron.jobs.registry import Job
from slotcron.lifeline.outage import DB_ERRORS
from slotcron.schedule.slots import Schedule
from slotcron.status import Status, Trigger
from slotcron.store.claims import Claim

log = logging.getLogger("slotcron.scheduler")


class Firing(LateSlots):
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
        self._tasks: set[asyncio.Task[Any]] = set()
        self._claiming: set[asyncio.Task[None]] = set()
        self.late = LateClaims(claimer.db, clock, claimer.instance_id)

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

    async def claim(self, job: Job, slot: datetime, **ask: Unpack[ClaimAsk]) -> Claim | None:
        following = self.schedules[job.name].next_after(slot)
        return await self.claimer.claim(job, slot, following=following, **ask)

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
        try:
            ours = await self.late.decide(claim, reason)
        except DB_ERRORS as exc:
            # Not started, not renewed: its lease lapses and the leader records it ABANDONED.
            self.claimer.outage.failed(exc, f"recording late claim {claim.execution_id}")
            return None
        if ours and reason is not None:
            self._late_missed(claim, reason)
        if not ours or reason is not None:
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
        the run takes a run permit once its slot has come (the most urgent first), and gives
        the ahead permit back then."""
        permit = _Permit(self, job, claim, give_up_at, ahead=ahead)

        async def run() -> None:
            try:
                if ahead and not await _admitted(permit.admit()):
                    return
                on_time = await self.on_time(job, claim, give_up_at)
                if on_time is not None:
                    await self.runner.run(job, on_time)
            finally:
                permit.release()

        task: asyncio.Task[Any]
        if start is None:
            task = asyncio.create_task(run(), name=f"slotcron-{job.name}")
        else:
            # Kicked off at its slot: the runner's task from the start, its permits given back
            # when it is done (a coroutine less to resume per run at a burst's slot).
            task = asyncio.create_task(
                self.runner.run(job, claim, start, permit.admit if ahead else None),
                name=f"slotcron-{job.name}",
            )
            task.add_done_callback(permit.release)
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
        try:
            if await self.late.decide(claim, reason, NO_CAPACITY):
                self._late_missed(claim, reason)
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

    def _late_missed(self, claim: Claim, reason: str) -> None:
        """Announce a claim recorded MISSED after it was made: late past its grace, or no
        capacity for it before its grace ended."""
        self.claimer.events.slots_passed(replace(claim, status=Status.MISSED, reason=reason))

    async def stop_claiming(self, timeout: float = 5.0) -> None:
        """Phase 1 of shutdown: claim nothing more. Claims already under way finish (they are
        short), and so do the claims they spawn as they end, within ``timeout`` seconds, so a
        slot is never left half-decided; runs go on."""
        self.claimer.closing = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        # A claim that ends may spawn more (slots its rows held, deferred, or gaps before it):
        # they are waited for too, or they would claim, and start runs, once shutdown had
        # counted the runs in flight (and closed the outcomes' writer they wait for).
        while self._claiming:
            left = deadline - loop.time()
            if left <= 0:
                for task in list(self._claiming):
                    task.cancel()
                break
            await asyncio.wait(set(self._claiming), timeout=left)
        # The runs the last claims started enter the registry at their task's first step:
        # one turn, and shutdown counts them (and hands back those not started).
        await asyncio.sleep(0)


class _Permit:
    """The permit a run started by :meth:`Firing.start_run` holds: a run permit, or an ahead
    permit until its slot and a run permit then."""

    __slots__ = ("ahead_held", "claim", "firing", "give_up_at", "job", "run_held")

    def __init__(
        self, firing: Firing, job: Job, claim: Claim, give_up_at: datetime, *, ahead: bool
    ) -> None:
        self.firing = firing
        self.job = job
        self.claim = claim
        self.give_up_at = give_up_at
        self.run_held = not ahead
        self.ahead_held = ahead

    def admit(self) -> bool | Awaitable[bool]:
        """At the slot: a run permit (in the run's task, with no wait when one is free: a
        future, task or coroutine more per run cost a burst of 1,000 runs milliseconds of start
        lag), and the ahead permit given back."""
        permits = self.firing.permits
        if permits.run.try_take():
            self.run_held = True
            self.ahead_held = False
            permits.ahead.give_back()
            return True
        return self._wait()

    async def _wait(self) -> bool:
        try:
            self.run_held = await self.firing._run_permit(self.job, self.claim, self.give_up_at)
            return self.run_held
        finally:
            self.ahead_held = False
            self.firing.permits.ahead.give_back()

    def release(self, _task: object = None) -> None:
        """The run is done (or never started): what it holds goes back."""
        permits = self.firing.permits
        if self.run_held:
            permits.give_back()
        if self.ahead_held:  # its kick-off said no, or it was cancelled before its slot
            permits.ahead.give_back()


async def _admitted(admitted: bool | Awaitable[bool]) -> bool:
    return admitted if isinstance(admitted, bool) else await admitted
