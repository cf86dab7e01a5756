"""Running one claimed slot: jitter, timeout, the coroutine itself, and its one finishing write."""

from __future__ import annotations

import asyncio
import logging
import random
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from app.clock import Clock
from app.context import JobContext
from app.outage import DB_ERRORS, Outage
from app.registry import Job
from app.store import runs as run_store
from app.store.claims import Claim
from app.store.database import Database

log = logging.getLogger("slotcron.runner")

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
    ) -> None:
        self.on_retry_queued = on_retry_queued
        self.db = db
        self.clock = clock
        self.instance_id = instance_id
        self.runs = runs
        self.outage = outage

    async def run(self, job: Job, claim: Claim) -> str | None:
        """Run a ``RUNNING`` claim to its end and record the outcome; return the status recorded
        (None when the record was no longer ours: fenced, or taken over)."""
        assert claim.lease_until is not None and claim.lease_ms is not None
        handle = RunHandle(
            claim=claim,
            job=job,
            task=asyncio.current_task(),
            lease_until=claim.lease_until,
            lease_ms=claim.lease_ms,
        )
        self.runs.add(handle)
        status: str | None
        try:
            status, error = await self._execute(job, claim, handle)
        finally:
            self.runs.remove(handle)
        if status is None:
            log.warning(
                "run %s of %s was fenced: its lease lapsed unrenewed; not recording an outcome",
                claim.execution_id,
                job.name,
            )
            return None
        retry = status == "FAILED" and claim.attempt < job.max_attempts
        recorded = await self._finish(claim, status, error, job.retry_backoff if retry else None)
        if recorded and retry:
            self.on_retry_queued(self.clock.now() + timedelta(seconds=job.retry_backoff))
        return status if recorded else None

    async def _execute(
        self, job: Job, claim: Claim, handle: RunHandle
    ) -> tuple[str | None, str | None]:
        ctx = JobContext(
            job=job.name,
            scheduled_at=claim.scheduled_at,
            execution_id=claim.execution_id,
            attempt=claim.attempt,
            trigger=claim.trigger,
            instance_id=self.instance_id,
            logger=logging.LoggerAdapter(
                logging.getLogger(f"slotcron.job.{job.name}"),
                {"job": job.name, "execution_id": claim.execution_id},
            ),
            params=dict(claim.params),
            state=dict(claim.state),
            _save=lambda state: self._save_state(claim, state),
        )
        timeout = asyncio.timeout(None)
        try:
            if job.jitter:
                await self.clock.sleep(random.uniform(0, job.jitter))
            log.debug(
                "starting %s slot %s (execution %s)",
                job.name,
                claim.scheduled_at,
                claim.execution_id,
            )
            async with timeout:
                if job.timeout is not None:
                    timeout.reschedule(asyncio.get_running_loop().time() + job.timeout)
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
            if timeout.expired():
                return "FAILED", f"TimeoutError: run exceeded its timeout of {job.timeout:g} s"
            return "FAILED", traceback.format_exc()
        except BaseException:  # a job's own SystemExit/KeyboardInterrupt must not kill the service
            return "FAILED", traceback.format_exc()
        return "COMPLETED", None

    async def _save_state(self, claim: Claim, state: dict[str, object]) -> None:
        await run_store.save_state(
            self.db, execution_id=claim.execution_id, instance_id=self.instance_id, state=state
        )

    async def _finish(
        self, claim: Claim, status: str, error: str | None, retry_backoff: float | None
    ) -> bool:
        """Write the outcome, retrying through an outage: a finished run is never left RUNNING
        by us. Conditional, so a run fenced or marked ABANDONED meanwhile is not overwritten."""
        delay = 0.05
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
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            self.outage.recovered()
            if status == "FAILED":
                first = (error or "").strip().splitlines()[-1:] or [""]
                log.warning(
                    "%s slot %s FAILED: %s",
                    claim.job_name,
                    claim.scheduled_at.isoformat(),
                    first[0],
                )
            else:
                log.info("%s slot %s %s", claim.job_name, claim.scheduled_at.isoformat(), status)
            if not recorded:
                log.warning(
                    "execution %s (%s) was no longer ours to record as %s",
                    claim.execution_id,
                    claim.job_name,
                    status,
                )
            return recorded
