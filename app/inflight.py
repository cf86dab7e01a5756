"""The runs in flight on this instance: what the runner, the heartbeat and shutdown share.

Each run has a :class:`RunHandle` from its claim until its outcome is written. The handle holds
the run's deadline (when its lease ends unless renewed) and, once it is cancelled, why
(:class:`CancelReason`): the runner records a run stopped by shutdown ``STOPPED``, and writes
nothing for a fenced one (the cluster may already have recorded it elsewhere).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from app.registry import Job
from app.store.claims import Claim


class CancelReason(StrEnum):
    SHUTDOWN = "shutdown"
    """Phase 3 of shutdown: the run is recorded STOPPED."""
    FENCED = "fenced"
    """Its lease could not be renewed in time, or the record is no longer ours: nothing is
    written, since another instance may have judged the run already."""


@dataclass
class RunHandle:
    """One run in flight on this instance."""

    claim: Claim
    job: Job
    task: asyncio.Task[object] | None
    deadline: datetime
    """When the run's lease ends unless renewed (by the scheduler's clock)."""
    lease_ms: int
    cancel_reason: CancelReason | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)
    finishing: bool = False
    """The job has returned; only its outcome's write is left (never cancelled)."""
    began: float = 0.0  # when the job's coroutine started (Metrics.run_started)

    @property
    def id(self) -> int:
        return self.claim.execution_id


class Runs:
    """The registry of runs in flight on this instance."""

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
        """How many runs hold each lease length (ms): the heartbeat renews one length at a time."""
        counts: dict[int, int] = {}
        for handle in self._handles.values():
            counts[handle.lease_ms] = counts.get(handle.lease_ms, 0) + 1
        return counts

    def cancel(self, handle: RunHandle, reason: CancelReason) -> None:
        """Cancel a run for ``reason``; the first reason given is the one recorded."""
        if handle.finishing:
            return  # its job is over: cancelling would only lose the outcome
        if handle.cancel_reason is None:
            handle.cancel_reason = reason
        if handle.task is not None:
            handle.task.cancel()

    async def wait_empty(self) -> None:
        await self._empty.wait()
