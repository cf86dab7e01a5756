"""The runs in flight on this instance: what the runner, the heartbeat and shutdown share.

Each run has a :class:`RunHandle` from its claim until its outcome is written. The handle holds
the run's deadline and, once it is cancelled, why (:class:`CancelReason`): the runner records a
run stopped by shutdown ``STOPPED``, and writes nothing for a fenced one (the cluster may
already have recorded it elsewhere).

The deadline is on the local monotonic clock: when the last *confirmed* renewal of the run's
lease was *sent* (its claim, at first), plus the lease, less :func:`margin`. Trust never
outlives what the database granted, however slow its answer, and a paused process or a hung
database path is fenced by time alone, before any other instance can judge the lease lapsed
(:mod:`slotcron.lifeline.fencing`).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from slotcron.jobs.registry import Job
from slotcron.store.claims import Claim


class CancelReason(StrEnum):
    SHUTDOWN = "shutdown"
    """Phase 3 of shutdown: the run is recorded STOPPED."""
    FENCED = "fenced"
    """Its lease could not be renewed in time, or the record is no longer ours: nothing is
    written, since another instance may have judged the run already."""
    HANDED_BACK = "handed back"
    """Its body had not started, and its row went back to the queue for another instance
    (shutdown): nothing more is written here."""


def margin(lease_ms: int) -> float:
    """Seconds a run stops before its lease would lapse: a tenth of the lease, from 50 ms to
    1 s. What another instance needs to judge a lease lapsed is longer still (the leader's
    tick, by the database's clock)."""
    return min(1.0, max(0.05, lease_ms / 10_000))


def trusted_until(sent: float, lease_ms: int) -> float:
    """The deadline a lease granted by a statement sent at ``sent`` (monotonic) gives."""
    return sent + lease_ms / 1000 - margin(lease_ms)


@dataclass
class RunHandle:
    """One run in flight on this instance."""

    claim: Claim
    job: Job
    task: asyncio.Task[object] | None
    deadline: float
    """Past this (the clock's monotonic seconds) the run is fenced: see :func:`trusted_until`."""
    lease_ms: int
    cancel_reason: CancelReason | None = None
    lease_lost: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the run is fenced (``ctx.lease_lost``)."""
    done: asyncio.Event = field(default_factory=asyncio.Event)
    finishing: bool = False
    """The job has returned; only its outcome's write is left (never cancelled)."""
    began: float = 0.0
    """When its body started (:func:`time.monotonic`, from :meth:`Events.run_started`)."""
    started: bool = False
    """Its start is stamped (``started_at``): from then on it can no longer be handed back."""
    clock_at: Callable[[float], datetime] | None = None
    """The scheduler clock's :meth:`~slotcron.clock.Clock.said_at`: what makes :attr:`began` a
    ``started_at``."""
    fence_reason: str | None = None
    """Why it was fenced, when not for its lease (said in the log line and the alert)."""
    _started_at: datetime | None = field(default=None, init=False, repr=False)

    @property
    def id(self) -> int:
        return self.claim.execution_id

    @property
    def started_at(self) -> datetime | None:
        """When its body started, by the scheduler's clock: worked out from :attr:`began` when
        first asked for, not at the start, where a datetime per run was microseconds of every
        later body's start lag (a burst of 1,000 starts one after another)."""
        if self._started_at is None and self.started and self.clock_at is not None:
            self._started_at = self.clock_at(self.began)
        return self._started_at


class Runs:
    """The registry of runs in flight on this instance."""

    def __init__(self) -> None:
        self._handles: dict[int, RunHandle] = {}
        self._empty = asyncio.Event()
        self._empty.set()
        self._busy = asyncio.Event()
        self._busy_signals: list[threading.Event] = []
        self._added_earliest = float("inf")

    def signal_busy(self, event: threading.Event) -> None:
        """Set ``event`` whenever a run begins with none in flight before it, from the call that
        adds it: another thread waiting on ``event`` learns of it even if the run then blocks
        the loop."""
        self._busy_signals.append(event)

    def add(self, handle: RunHandle) -> None:
        if not self._handles:
            for event in self._busy_signals:
                event.set()
        self._handles[handle.id] = handle
        self._added_earliest = min(self._added_earliest, handle.deadline)
        self._empty.clear()
        self._busy.set()

    def remove(self, handle: RunHandle) -> None:
        self._handles.pop(handle.id, None)
        handle.done.set()
        if not self._handles:
            self._empty.set()
            self._busy.clear()

    def earliest_added(self) -> float:
        """The earliest deadline of the runs added since the last call (infinity if none)."""
        earliest, self._added_earliest = self._added_earliest, float("inf")
        return earliest

    def __iter__(self) -> Iterator[RunHandle]:
        return iter(list(self._handles.values()))

    def __len__(self) -> int:
        return len(self._handles)

    async def wait_busy(self) -> None:
        """Until at least one run is in flight."""
        await self._busy.wait()

    def lease_counts(self) -> dict[int, int]:
        """How many runs hold each lease length (ms): the heartbeat renews one length at a time."""
        counts: dict[int, int] = {}
        for handle in self._handles.values():
            counts[handle.lease_ms] = counts.get(handle.lease_ms, 0) + 1
        return counts

    def cancel(self, handle: RunHandle, reason: CancelReason, *, why: str | None = None) -> None:
        """Cancel a run for ``reason`` (``why``: a fence's cause, when not its lease); the first
        reason given is the one recorded."""
        if handle.finishing:
            return  # its job is over: cancelling would only lose the outcome
        if handle.cancel_reason is None:
            handle.cancel_reason = reason
            handle.fence_reason = why
        if reason == CancelReason.FENCED:
            handle.lease_lost.set()
        if handle.task is not None:
            handle.task.cancel()

    async def wait_empty(self) -> None:
        await self._empty.wait()
