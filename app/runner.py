"""Running one claimed slot: jitter, timeout, the coroutine itself, and its one finishing write."""

from __future__ import annotations

import asyncio
import logging
import random
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from app import alerts, tracing
from app.clock import Clock
from app.context import JobContext
from app.logs import run_fields
from app.metrics import Metrics
from app.outage import DB_ERRORS, Backoff, Outage
from app.registry import Job
from app.store import runs as run_store
from app.store.claims import Claim
from app.store.database import Database

log = logging.getLogger("slotcron.runner")

COMPLETED_LINES_PER_SECOND = 20

SHUTDOWN = "shutdown"
FENCED = "fenced"


@dataclass
class RunHandle:
    """One run in flight on this instance."""

    claim: Claim
    job: Job
    task: asyncio.Task[object] | None
    lease_until: datetime
    lease_ms: int
    cancel_reason: str | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)
    finishing: bool = False
    """The job has returned; only its outcome's write is left (never cancelled)."""
    began: float = 0.0  # when the job's coroutine started (Metrics.run_started)

    @property
    def id(self) -> int:
        return self.claim.execution_id


class Runs:
    """The runs in flight on this instance, shared by the runner, heartbeat and shutdown."""

    def __init__(self) -> None:
        self._handles: dict[int, RunHandle] = {}
        self._empty = asyncio.Event()
        self._empty.set()

    def add(self, handle: RunHandle) -> None:
        self._handles[handle.id] = handle
        self._empty.clear()

    def remove(self, handle: RunHandle) -> None:
        self._handles.pop(handle.id, None)
        handle.done.set()
        if not self._handles:
            self._empty.set()

    def __iter__(self) -> Iterator[RunHandle]:
        return iter(list(self._handles.values()))

    def __len__(self) -> int:
        return len(self._handles)

    def lease_counts(self) -> dict[int, int]:
        counts: dict[int, int] = {}
        for handle in self._handles.values():
            counts[handle.lease_ms] = counts.get(handle.lease_ms, 0) + 1
        return counts

    def cancel(self, handle: RunHandle, reason: str) -> None:
        if handle.finishing:
            return  # its job is over: cancelling would only lose the outcome
        if handle.cancel_reason is None:
            handle.cancel_reason = reason
        if handle.task is not None:
            handle.task.cancel()

    async def wait_empty(self) -> None:
        await self._empty.wait()


class Runner:
    def __init__(
        self,
        *,
        db: Database,
        clock: Clock,
        instance_id: str,
        runs: Runs,
        outage: Outage,
        on_retry_queued: Callable[[datetime], None] = lambda _when: None,
        metrics: Metrics | None = None,
    ) -> None:
        self.metrics = metrics or Metrics()
        self.on_retry_queued = on_retry_queued
        self.db = db
        self.clock = clock
        self.instance_id = instance_id
        self.runs = runs
        self.outage = outage
        self._finishing = Finishing(self)
        self._loggers: dict[str, logging.Logger] = {}
        self._completed_lines = LineQuota(COMPLETED_LINES_PER_SECOND)
        self._gates: dict[datetime, asyncio.Event] = {}
        self._openers: set[asyncio.Task[None]] = set()

    async def run(self, job: Job, claim: Claim, start_at: datetime | None = None) -> str | None:
        """Run a ``RUNNING`` claim to its end and record the outcome; return the status recorded
        (None when the record was no longer ours: fenced, or taken over).

        A slot claimed ahead of its time starts at ``start_at`` by the scheduler's clock; it is
        in flight meanwhile (its lease renewed, shutdown waits for it or stops it)."""
        assert claim.lease_until is not None and claim.lease_ms is not None
        handle = RunHandle(
            claim=claim,
            job=job,
            task=asyncio.current_task(),
            lease_until=claim.lease_until,
            lease_ms=claim.lease_ms,
        )
        self.runs.add(handle)
        tracing.run_began(job, claim, self.instance_id)
        # The run stays in `runs` until its outcome is written: its lease is renewed meanwhile
        # (a write retried through an outage must not see it ABANDONED), and shutdown waits
        # for the write before it closes the database.
        try:
            status, error = await self._execute(job, claim, handle, start_at)
            handle.finishing = True
            self.metrics.run_finished(job.name, status or "FENCED", handle.began)
            if status is None:
                log.warning(
                    "run %s of %s was fenced: its lease lapsed unrenewed; not recording an outcome",
                    claim.execution_id,
                    job.name,
                    extra=self._fields(claim, "FENCED"),
                )
                alerts.of(self.instance_id).run_fenced(claim, "its lease lapsed unrenewed")
                tracing.run_ended("FENCED")
                return None
            retry = status == "FAILED" and claim.attempt < job.max_attempts
            tracing.finishing()
            recorded = await self._finish(
                claim, status, error, job.retry_backoff if retry else None
            )
            alerts.of(self.instance_id).run_finished(
                claim, status, error, recorded=recorded, final=not retry
            )
            tracing.run_ended(status if recorded else "FENCED", error)
        finally:
            self.runs.remove(handle)
        if recorded and retry:
            self.on_retry_queued(self.clock.now() + timedelta(seconds=job.retry_backoff))
        return status if recorded else None

    async def _execute(
        self, job: Job, claim: Claim, handle: RunHandle, start_at: datetime | None
    ) -> tuple[str | None, str | None]:
        ctx = JobContext(
            job=job.name,
            scheduled_at=claim.scheduled_at,
            execution_id=claim.execution_id,
            attempt=claim.attempt,
            trigger=claim.trigger,
            instance_id=self.instance_id,
            logger=logging.LoggerAdapter(
                self._job_logger(job.name), {"job": job.name, "execution_id": claim.execution_id}
            ),
            params=dict(claim.params),
            state=dict(claim.state),
            _save=lambda state: self._save_state(claim, state),
        )
        timeout: asyncio.Timeout | None = None
        try:
            if start_at is not None:
                await self._gate(start_at).wait()
            if job.jitter:
                await self.clock.sleep(random.uniform(0, job.jitter))
            if log.isEnabledFor(logging.DEBUG):
                log.debug(
                    "starting %s slot %s (execution %s)",
                    job.name,
                    claim.scheduled_at,
                    claim.execution_id,
                    extra=self._fields(claim, "RUNNING"),
                )
            handle.began = self.metrics.run_started(job.name, claim.trigger, claim.scheduled_at)
            tracing.job_started(self.clock)
            if job.timeout is None:
                await (job.func(ctx) if job.takes_context else job.func())
            else:
                timeout = asyncio.timeout(job.timeout)  # from now: jitter is not the job's time
                async with timeout:
                    await (job.func(ctx) if job.takes_context else job.func())
        except asyncio.CancelledError:
            reason = handle.cancel_reason
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            if reason == FENCED:
                return None, None
            return "STOPPED", f"stopped by shutdown of instance {self.instance_id}"
        except TimeoutError:
            if timeout is not None and timeout.expired():
                return "FAILED", f"TimeoutError: run exceeded its timeout of {job.timeout:g} s"
            return "FAILED", traceback.format_exc()
        except BaseException:  # a job's own SystemExit/KeyboardInterrupt must not kill the service
            return "FAILED", traceback.format_exc()
        return "COMPLETED", None

    def _gate(self, when: datetime) -> asyncio.Event:
        """One gate per start time, opened by one sleeper: a thousand runs claimed ahead of
        the same slot cost one timer, not a thousand (each liable to wake a hair early)."""
        gate = self._gates.get(when)
        if gate is None:
            gate = self._gates[when] = asyncio.Event()

            async def open_at() -> None:
                try:
                    await self.clock.sleep_until(when)
                    gate.set()
                finally:
                    del self._gates[when]

            opener = asyncio.create_task(open_at(), name="slotcron-start-gate")
            self._openers.add(opener)
            opener.add_done_callback(self._openers.discard)
        return gate

    def _job_logger(self, name: str) -> logging.Logger:
        logger = self._loggers.get(name)
        if logger is None:
            logger = self._loggers[name] = logging.getLogger(f"slotcron.job.{name}")
        return logger

    async def _save_state(self, claim: Claim, state: dict[str, object]) -> None:
        await run_store.save_state(
            self.db, execution_id=claim.execution_id, instance_id=self.instance_id, state=state
        )

    async def _finish(
        self, claim: Claim, status: str, error: str | None, retry_backoff: float | None
    ) -> bool:
        """Write the outcome, retrying through an outage: a finished run is never left RUNNING
        by us. Conditional, so a run fenced or marked ABANDONED meanwhile is not overwritten."""
        if retry_backoff is None:
            recorded = await self._finishing.record(claim.execution_id, status, error)
        else:
            recorded = await self._finish_and_retry(claim, status, error, retry_backoff)
        if status == "FAILED":
            first = (error or "").strip().splitlines()[-1:] or [""]
            log.warning(
                "%s slot %s FAILED: %s",
                claim.job_name,
                claim.scheduled_at.isoformat(),
                first[0],
                extra=self._fields(claim, status),
            )
        elif status != "COMPLETED" or self._completed_lines.take():
            log.info(
                "%s slot %s %s",
                claim.job_name,
                claim.scheduled_at.isoformat(),
                status,
                extra=self._fields(claim, status),
            )
        if not recorded:
            log.warning(
                "execution %s (%s) was no longer ours to record as %s",
                claim.execution_id,
                claim.job_name,
                status,
                extra=self._fields(claim, "FENCED"),
            )
        return recorded

    async def _finish_and_retry(
        self, claim: Claim, status: str, error: str | None, retry_backoff: float
    ) -> bool:
        backoff = Backoff()
        while True:
            try:
                recorded = await run_store.finish(
                    self.db,
                    execution_id=claim.execution_id,
                    instance_id=self.instance_id,
                    status=status,
                    now=self.clock.now(),
                    error=error,
                    retry_backoff=retry_backoff,
                )
            except DB_ERRORS as exc:
                self.outage.failed(exc, f"recording the end of execution {claim.execution_id}")
                await backoff.wait()
                continue
            self.outage.recovered()
            return recorded

    def _fields(self, claim: Claim, outcome: str) -> dict[str, object]:
        return run_fields(
            claim.job_name, claim.scheduled_at, claim.execution_id, self.instance_id, outcome
        )


class LineQuota:
    """At most ``per_second`` lines a second; past it, one line says how many were left out.

    A COMPLETED line per run is what a human reading the log wants at a few runs a second; at
    thousands a second, writing them would be most of the instance's work (and nobody reads
    them: the executions table holds every run)."""

    def __init__(self, per_second: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_second = per_second
        self.clock = clock
        self._second = 0
        self._used = 0
        self._dropped = 0

    def take(self) -> bool:
        second = int(self.clock())
        if second != self._second:
            if self._dropped:
                log.info(
                    "%d more runs COMPLETED in that second without a line each "
                    "(`slotcron history` lists them)",
                    self._dropped,
                )
            self._second, self._used, self._dropped = second, 0, 0
        if self._used < self.per_second:
            self._used += 1
            return True
        self._dropped += 1
        return False


class Finishing:
    """Group commit for outcomes: runs ending while a write is under way are recorded together
    by the next one. A lone run is written at once; a thousand cost a few statements."""

    LIMIT = 1000

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self._pending: list[tuple[int, str, str | None, asyncio.Future[bool]]] = []
        self._writer: asyncio.Task[None] | None = None

    async def record(self, execution_id: int, status: str, error: str | None) -> bool:
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._pending.append((execution_id, status, error, done))
        if self._writer is None:
            self._writer = asyncio.create_task(self._write(), name="slotcron-finishing")
        return await done  # a cancelled waiter cancels only its own wait: see _write

    async def _write(self) -> None:
        runner = self.runner
        try:
            while self._pending:
                batch, self._pending = self._pending[: self.LIMIT], self._pending[self.LIMIT :]
                backoff = Backoff()
                while True:
                    try:
                        recorded = await run_store.finish_many(
                            runner.db,
                            [(i, status, error) for i, status, error, _ in batch],
                            instance_id=runner.instance_id,
                            now=runner.clock.now(),
                        )
                    except DB_ERRORS as exc:
                        runner.outage.failed(exc, f"recording the end of {len(batch)} runs")
                        await backoff.wait()
                        continue
                    break
                runner.outage.recovered()
                for execution_id, _, _, done in batch:
                    if not done.done():  # its run was cancelled while waiting
                        done.set_result(execution_id in recorded)
        finally:
            self._writer = None
