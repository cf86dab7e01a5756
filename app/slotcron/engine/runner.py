"""Running one claimed slot: its start gate, jitter, timeout, the coroutine itself, and the
hand-over of its outcome to the writer (:mod:`slotcron.engine.outcomes`).

A run is in flight (:mod:`slotcron.lifeline.inflight`) from its claim until its outcome is written:
its
lease is renewed meanwhile, and shutdown waits for it or stops it.
"""

from __future__ import annotations

import asyncio
import logging
import random
import traceback
import types
from collections.abc import Awaitable, Callable, Generator
from datetime import datetime, timedelta

from slotcron.engine.handbacks import HandBacks
from slotcron.engine.kickoff import Kickoff
from slotcron.engine.outcomes import Outcomes
from slotcron.jobs.context import JobContext
from slotcron.jobs.registry import Job
from slotcron.lifeline.inflight import CancelReason, RunHandle, Runs, trusted_until
from slotcron.lifeline.roles import Collaborators
from slotcron.observe.events import Ending
from slotcron.observe.logs import run_fields
from slotcron.status import Status
from slotcron.store import runs as run_store
from slotcron.store.claims import Claim

log = logging.getLogger("slotcron.runner")

Admit = Callable[[], bool | Awaitable[bool]]
"""What a run claimed ahead still needs once its kick-off said yes (a run permit): whether it
may start, said at once when a permit is free (no coroutine per run at a burst's slot), else
awaited."""


class Runner:
    def __init__(
        self,
        shared: Collaborators,
        *,
        runs: Runs,
        outcomes: Outcomes,
        on_retry_queued: Callable[[datetime], None] = lambda _when: None,
        on_run_ended: Callable[[str], None] = lambda _job: None,
    ) -> None:
        self.db = shared.db
        self.clock = shared.clock
        self.instance_id = shared.instance_id
        self.events = shared.events
        self.runs = runs
        self.outcomes = outcomes
        self.on_retry_queued = on_retry_queued
        self.on_run_ended = on_run_ended
        """Told the job's name once a run's outcome is written (its lease released)."""
        self.kickoff = Kickoff(shared)
        self.handbacks = HandBacks(shared.db, shared.clock, shared.instance_id)
        self._loggers: dict[str, logging.Logger] = {}

    async def run(
        self,
        job: Job,
        claim: Claim,
        start: asyncio.Future[bool] | None = None,
        admit: Admit | None = None,
    ) -> str | None:
        """Run a ``RUNNING`` claim to its end and record the outcome; return the status recorded
        (None when the record was no longer ours: fenced, or taken over; or when its body never
        started: see :mod:`slotcron.engine.kickoff`).

        A slot claimed ahead of its time starts when ``start`` (its kick-off at the slot) says
        so; it is in flight meanwhile (its lease renewed, shutdown hands it back or stops it).
        ``admit``, then, in this task, takes what else it needs to start (a run permit: see
        :meth:`slotcron.engine.firing.Firing.start_run`); False: it does not start."""
        handle = self._in_flight(job, claim)
        # The run stays in `runs` until its outcome is written: its lease is renewed meanwhile
        # (a write retried through an outage must not see it ABANDONED), and shutdown waits
        # for the write before it closes the database.
        try:
            ctx = self._context(job, claim, handle)
            status, error = await self._execute(job, claim, handle, ctx, start, admit)
            if handle.started:
                try:
                    # One turn of the loop before its bookkeeping (outcome, log, metrics,
                    # alert): the bodies ready to start meanwhile (a burst's, kicked off
                    # together) start first. Cancelled meanwhile for a reason (fenced,
                    # stopped): judged below like a cancellation the job returned through.
                    await _one_turn()
                except asyncio.CancelledError:
                    if handle.cancel_reason is None:
                        raise
            ended = await self._finish(handle, status, error)
        finally:
            self.runs.remove(handle)
        if ended is None:  # never started, or fenced
            return None
        recorded, retry = ended
        self.on_run_ended(job.name)
        if recorded and retry:
            self.on_retry_queued(self.clock.now() + timedelta(seconds=job.retry_backoff))
        return status if recorded else None

    def _in_flight(self, job: Job, claim: Claim) -> RunHandle:
        """The run's handle, in flight from now on (its lease renewed)."""
        assert claim.lease_until is not None and claim.lease_ms is not None
        handle = RunHandle(
            claim=claim,
            job=job,
            task=asyncio.current_task(),
            deadline=trusted_until(claim.sent or self.clock.monotonic(), claim.lease_ms),
            lease_ms=claim.lease_ms,
            clock_at=self.clock.said_at,
        )
        self.runs.add(handle)
        self.events.run_began(job, claim)
        return handle

    async def _finish(
        self, handle: RunHandle, status: Status | None, error: str | None
    ) -> tuple[bool, bool] | None:
        """Record how the run ended: None when nothing is recorded here (its body never
        started, or it was fenced), else whether the outcome was still ours to record and
        whether a retry was queued with it."""
        job, claim = handle.job, handle.claim
        task = asyncio.current_task()
        if handle.cancel_reason is not None and task is not None and task.cancelling():
            task.uncancel()  # the job returned although cancelled: the request is spent
        if not handle.started:
            self.events.run_not_started()
            await self._not_started(handle)
            return None
        if handle.cancel_reason is CancelReason.FENCED:
            # Fenced, whatever the job then did (it may return once ctx.lease_lost is set,
            # or swallow the cancellation): the cluster may have judged the run already.
            status, error = None, None
        handle.finishing = True
        duration = self.events.since(handle.began)
        if status is None:
            self._fenced(handle, duration)
            return None
        retry = status == Status.FAILED and claim.attempt < job.max_attempts
        recorded = await self._record(handle, status, error, duration, retry)
        return recorded, retry

    def _fenced(self, handle: RunHandle, duration: float) -> None:
        """A run fenced before its outcome's write: nothing is written (the cluster may have
        judged it already); announced as fenced."""
        why = handle.fence_reason or "its lease lapsed unrenewed"
        self.events.run_finished(
            handle.claim,
            None,
            None,
            started_at=handle.started_at,
            duration=duration,
            end=Ending(why=why),
        )

    async def _record(
        self, handle: RunHandle, status: Status, error: str | None, duration: float, retry: bool
    ) -> bool:
        """Write the run's outcome (queuing its retry when ``retry``), then announce it; whether
        the record was still ours."""
        claim = handle.claim
        self.events.finishing()
        recorded = await self.outcomes.record(
            claim, status, error, handle.job.retry_backoff if retry else None, handle.started_at
        )
        self.events.run_finished(
            claim,
            status,
            error,
            started_at=handle.started_at,
            duration=duration,
            end=Ending.written(final=not retry, recorded=recorded),
        )
        return recorded

    def _context(self, job: Job, claim: Claim, handle: RunHandle) -> JobContext:
        return JobContext(
            job=job.name,
            scheduled_at=claim.scheduled_at,
            execution_id=claim.execution_id,
            attempt=claim.attempt,
            trigger=claim.trigger,
            instance_id=self.instance_id,
            logger=logging.LoggerAdapter(
                # A runtime schedule logs under its task's name: one logger per schedule would
                # be 100,000 loggers for good (the logging module never frees one).
                self._job_logger(getattr(job, "task", "") or job.name),
                {"job": job.name, "execution_id": claim.execution_id},
            ),
            params=dict(claim.params),
            state=dict(claim.state),
            fencing_token=claim.fencing_token or 0,
            lease_lost=handle.lease_lost,
            _save=lambda state: self._save_state(claim, state),
        )

    def _may_start(
        self, job: Job, claim: Claim, kicked_off: bool, admit: Admit | None
    ) -> bool | Awaitable[bool]:
        """Whether the body may start: True at once when nothing is left to wait for (the
        common case at a burst's slot: a run permit free, no jitter, its start stamped by its
        kick-off), else an awaitable that says."""
        admitted = True if admit is None else admit()
        if admitted is True and not job.jitter and (kicked_off or claim.started):
            return True
        return self._may_start_later(job, claim, kicked_off, admitted)

    async def _may_start_later(
        self, job: Job, claim: Claim, kicked_off: bool, admitted: bool | Awaitable[bool]
    ) -> bool:
        """:meth:`_may_start` when something is left: a run permit, its jitter, its start's
        stamp (a run not yet stamped can be handed back; the stamp fails once it has been)."""
        if not (admitted if isinstance(admitted, bool) else await admitted):
            return False
        if job.jitter:
            await self.clock.sleep(random.uniform(0, job.jitter))
        if job.jitter or not (kicked_off or claim.started):
            return await self.kickoff.one(claim)
        return True

    async def _execute(
        self,
        job: Job,
        claim: Claim,
        handle: RunHandle,
        ctx: JobContext,
        start: asyncio.Future[bool] | None,
        admit: Admit | None,
    ) -> tuple[Status | None, str | None]:
        timeout: asyncio.Timeout | None = None
        try:
            # Handed back, SKIPPED (paused) or no longer ours; or started as part of its chunk
            # just as shutdown began: handed back, its body never started. (Awaited here, in a
            # coroutine made ahead: at a burst's slot each object made per run, and each frame
            # resumed, is start lag of every body after it.)
            if start is not None and not (await start and not self.kickoff.closing):
                return None, None
            ready = self._may_start(job, claim, start is not None, admit)
            if ready is not True and not (ready if isinstance(ready, bool) else await ready):
                return None, None
            handle.started = True
            handle.began = self.events.run_started(claim)
            if log.isEnabledFor(logging.DEBUG):
                log.debug(
                    "starting %s slot %s (execution %s)",
                    job.name,
                    claim.scheduled_at,
                    claim.execution_id,
                    extra=self._fields(claim, Status.RUNNING),
                )
            if job.timeout is None:
                await self._body(job, ctx)
            else:
                timeout = asyncio.timeout(job.timeout)  # from now: jitter is not the job's time
                async with timeout:
                    await self._body(job, ctx)
        except asyncio.CancelledError:
            _uncancel()
            if handle.cancel_reason == CancelReason.FENCED:
                return None, None
            return Status.STOPPED, f"stopped by shutdown of instance {self.instance_id}"
        except TimeoutError:
            if timeout is not None and timeout.expired():
                return Status.FAILED, f"TimeoutError: run exceeded its timeout of {job.timeout:g} s"
            return Status.FAILED, traceback.format_exc()
        except BaseException:  # a job's own SystemExit/KeyboardInterrupt must not kill the service
            return Status.FAILED, traceback.format_exc()
        return Status.COMPLETED, None

    def _body(self, job: Job, ctx: JobContext) -> Awaitable[None]:
        """The job's coroutine, inside the user hooks' ``wrap_run`` when there are any (one
        call, no coroutine of its own: it is on every body's way to its start)."""
        if not self.events.wrappers:
            return job.func(ctx) if job.takes_context else job.func()
        return self.events.around(ctx, lambda: job.func(ctx) if job.takes_context else job.func())

    async def _not_started(self, handle: RunHandle) -> None:
        """A run whose body never started records nothing itself. Stopped by shutdown or
        fenced before its start, it is handed back, for another instance to run; if that write
        fails, its lease lapses and the leader hands it back."""
        stopped = handle.cancel_reason in (CancelReason.SHUTDOWN, CancelReason.FENCED)
        if not (stopped or (self.kickoff.closing and handle.cancel_reason is None)):
            return  # SKIPPED, handed back already, or no longer ours
        if await self.handbacks.hand_back(handle.id):
            log.info(
                "%s slot %s handed back before its start (%s)",
                handle.job.name,
                handle.claim.scheduled_at.isoformat(),
                handle.cancel_reason,
                extra=self._fields(handle.claim, Status.QUEUED),
            )

    def _job_logger(self, name: str) -> logging.Logger:
        logger = self._loggers.get(name)
        if logger is None:
            logger = self._loggers[name] = logging.getLogger(f"slotcron.job.{name}")
        return logger

    async def _save_state(self, claim: Claim, state: dict[str, object]) -> None:
        await run_store.save_state(
            self.db, run=claim.key, instance_id=self.instance_id, state=state
        )

    def _fields(self, claim: Claim, outcome: str) -> dict[str, object]:
        return run_fields(
            claim.job_name, claim.scheduled_at, claim.execution_id, self.instance_id, outcome
        )


def _uncancel() -> None:
    """Spend the cancellation the current task was stopped by: the runner judges it itself
    (:attr:`RunHandle.cancel_reason`), and the task goes on to record or hand back its run."""
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()


@types.coroutine
def _one_turn() -> Generator[None, None, None]:
    """Yield to the loop once (``asyncio.sleep(0)`` without its two coroutine objects)."""
    yield
