"""Events: what the engine announces about runs and passed slots, and who hears it.

The engine and the lifeline call one thing, :class:`Events`: a run's body starts, a run ends
(``COMPLETED``, ``FAILED``, ``STOPPED``, or ``ABANDONED`` by the instance that recorded it so),
slots are recorded not run (``SKIPPED``, ``MISSED``). Each is announced once, by the instance
whose write recorded it, after the write.

Two kinds of listener hear the same events:

- **Built-in observers** (:class:`Observer`: metrics, alerts, traces, the run log) are called
  inline, synchronously, in the announcing task: they are cheap, written here, and tracing needs
  the run's own task. They also get what only they need (:class:`Ending`, the claim record) and
  the few internal moments traces span (a claim's start, the outcome's write).
- **User hooks** (:class:`Hook`, the public extension point) never run inline: each has a
  bounded queue and a task of its own (:mod:`slotcron.observe.delivery`), so a hook that is slow
  or raises never delays, fails or loses a run. Only ``wrap_run`` runs in the run's task, around
  the body (that is its purpose): see :func:`slotcron.observe.wrapping.around`.

With no user hook attached, an announcement costs what the built-ins cost: a :class:`RunEvent`
is built once and handed to each of them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from slotcron.observe.delivery import DRAIN_SECONDS, HookQueue
from slotcron.observe.hooks import Hook, RunEvent, SlotsEvent, hook_name, load_hooks, overrides
from slotcron.observe.wrapping import around

__all__ = [
    "Ending",
    "Events",
    "Hook",
    "Observer",
    "RunEvent",
    "SlotsEvent",
    "hook_name",
    "load_hooks",
    "overrides",
]

if TYPE_CHECKING:
    from slotcron.clock import Clock
    from slotcron.jobs.context import JobContext
    from slotcron.jobs.registry import Job
    from slotcron.store.claims import Claim
    from slotcron.store.lifeline import Abandoned


@dataclass(frozen=True, slots=True)
class Ending:
    """What the built-ins need of a run's end beyond the public event. The common ends are
    shared instances (:meth:`written`): nothing is built for them."""

    final: bool = True
    """No attempt is left: a FAILED run will not be retried."""
    why: str | None = None
    """Fenced before its outcome was written: why (no write was tried)."""
    recorded: bool = True
    """False: the outcome write found the record no longer ours."""
    abandoned: Abandoned | None = None
    """An ABANDONED run: the record the abandon write returned."""
    at_start_up: bool = False
    """ABANDONED at start-up (left RUNNING by a previous process), not by the leader."""

    @staticmethod
    def written(*, final: bool, recorded: bool) -> Ending:
        """The end of a run whose outcome write was tried."""
        return _WRITTEN[final, recorded]


_WRITTEN = {
    (final, recorded): Ending(final=final, recorded=recorded)
    for final in (True, False)
    for recorded in (True, False)
}


class Observer:
    """A built-in listener (metrics, alerts, traces, the run log). Called inline: every method
    must be cheap and must not raise. The base does nothing; :class:`Events` calls only what a
    subclass overrides."""

    def claim_began(self) -> None:
        """A claim (of one slot or of a batch) starts in this task."""

    def claimed(self, claim: Claim) -> None:
        """The claim begun in this task decided ``claim`` (any status)."""

    def run_began(self, job: Job, claim: Claim, instance_id: str) -> None:
        """A claimed run is in flight in this task (its body may start later, or never)."""

    def run_started(self, run: RunEvent) -> None:
        """The run's body started (announced once the runs ready to start with it have
        started, outside its task: ``run.started_at`` says when)."""

    def finishing(self) -> None:
        """The body ended; the write of its outcome starts."""

    def run_not_started(self) -> None:
        """The run ends without its body having started (handed back, skipped)."""

    def run_finished(self, run: RunEvent, end: Ending) -> None:
        """A run's end was recorded (or found no longer ours: ``run.fenced``)."""

    def slots_passed(self, event: SlotsEvent, record: Claim, together: int | None) -> None:
        """Slots recorded not run. ``record``: the execution written; ``together``: None for
        one slot decided by a claim, else the number of passed-over ranges recorded at once."""

    def loop_blocked(self, job: str, seconds: float) -> None:
        """A job held the event loop (called from the watchdog's thread)."""


def _callers(observers: Sequence[Observer], name: str) -> tuple[Callable[..., None], ...]:
    return tuple(getattr(o, name) for o in observers if overrides(o, name, Observer))


class Events:
    """The one thing the engine announces through. ``observers`` are called inline;
    ``hooks`` (user hooks) get their events through queues of their own. ``on_dropped`` is told
    the name of a hook each time one of its events is dropped (a Prometheus counter)."""

    def __init__(
        self,
        observers: Sequence[Observer] = (),
        hooks: Sequence[Hook] = (),
        *,
        clock: Clock | None = None,
        instance_id: str = "",
        on_dropped: Callable[[str], None] = lambda _hook: None,
    ) -> None:
        self.observers = tuple(observers)
        self.hooks = tuple(hooks)
        self.clock = clock
        self.instance_id = instance_id
        self._claim_began = _callers(self.observers, "claim_began")
        self._claimed = _callers(self.observers, "claimed")
        self._run_began = _callers(self.observers, "run_began")
        self._started = _callers(self.observers, "run_started")
        self._finishing = _callers(self.observers, "finishing")
        self._not_started = _callers(self.observers, "run_not_started")
        self._finished = _callers(self.observers, "run_finished")
        self._passed = _callers(self.observers, "slots_passed")
        self._blocked = _callers(self.observers, "loop_blocked")
        self.queues = [HookQueue(hook_name(hook, self.hooks), on_dropped) for hook in self.hooks]
        self._to_hooks = {
            name: tuple(
                (q, getattr(h, name))
                for q, h in zip(self.queues, self.hooks, strict=True)
                if overrides(h, name)
            )
            for name in ("run_started", "run_finished", "slots_passed")
        }
        self.wrappers = tuple(h.wrap_run for h in self.hooks if overrides(h, "wrap_run"))
        self._starts: list[tuple[Claim, float]] = []
        """Runs started since the last announcement of starts (:meth:`run_started`)."""
        """The user hooks' ``wrap_run``: empty (the common case) costs the runner nothing."""

    async def around(self, ctx: JobContext, body: Callable[[], Awaitable[None]]) -> None:
        """Await ``body()`` inside the user hooks' ``wrap_run`` (call only when
        :attr:`wrappers` is not empty: the common case awaits the body directly)."""
        await around(self.wrappers, ctx, body)

    def hooked(self, name: str) -> bool:
        """Whether a user hook listens to ``name`` (``run_started``, ``run_finished``,
        ``slots_passed``): what only a hook needs is worked out only then."""
        return bool(self._to_hooks[name])

    # --- claims -------------------------------------------------------------------------

    def claim_began(self) -> None:
        for call in self._claim_began:
            call()

    def claimed(self, claim: Claim) -> None:
        """``claim`` was decided by this instance: a run to start, or a slot recorded not run
        (announced as passed)."""
        for call in self._claimed:
            call(claim)
        if claim.status != "RUNNING":
            self.slots_passed(claim)

    def slots_passed(
        self,
        record: Claim,
        *,
        last: datetime | None = None,
        count: int | None = 1,
        together: int | None = None,
    ) -> None:
        """``record`` (SKIPPED or MISSED) was written; with ``last``, it stands for the
        passed-over range from its slot to ``last`` (``together``: ranges recorded at once)."""
        event = SlotsEvent(
            record.job_name,
            record.status,
            record.reason,
            record.scheduled_at,
            last or record.scheduled_at,
            count,
        )
        for call in self._passed:
            call(event, record, together)
        for queue, method in self._to_hooks["slots_passed"]:
            queue.put(method, event)

    # --- runs ---------------------------------------------------------------------------

    def run_began(self, job: Job, claim: Claim) -> None:
        for call in self._run_began:
            call(job, claim, self.instance_id)

    def run_started(self, claim: Claim) -> float:
        """The body of ``claim``'s run starts now; returns the moment (:func:`time.monotonic`)
        it started: what its duration is measured from (:meth:`since`) and its ``started_at``
        worked out from (the clock's :meth:`~slotcron.clock.Clock.said_at`). Announced once the runs
        ready to start with it have started (one callback for all of them): at a burst's slot,
        every microsecond spent here is the start lag of every body after it."""
        began = time.monotonic()
        if self._started or self._to_hooks["run_started"]:
            self._starts.append((claim, began))
            if len(self._starts) == 1:
                asyncio.get_running_loop().call_soon(self._announce_starts)
        return began

    def _started_at(self, began: float) -> datetime:
        if self.clock is not None:
            return self.clock.said_at(began)
        return datetime.now(UTC) - timedelta(seconds=time.monotonic() - began)

    def _announce_starts(self) -> None:
        starts, self._starts = self._starts, []
        hooks = self._to_hooks["run_started"]
        for claim, began in starts:
            started_at = self._started_at(began)
            run = RunEvent(
                claim.job_name,
                claim.scheduled_at,
                claim.execution_id,
                claim.attempt,
                claim.trigger,
                self.instance_id,
                "RUNNING",
                False,
                started_at,
                None,
                None,
                claim.params,
                max((started_at - claim.scheduled_at).total_seconds(), 0.0),
            )
            for call in self._started:
                call(run)
            for queue, method in hooks:
                queue.put(method, run)

    @staticmethod
    def since(began: float) -> float:
        """Seconds since ``began`` (what :meth:`run_started` returned)."""
        return time.monotonic() - began

    def finishing(self) -> None:
        for call in self._finishing:
            call()

    def run_not_started(self) -> None:
        for call in self._not_started:
            call()

    def run_finished(
        self,
        claim: Claim,
        status: str | None,
        error: str | None,
        *,
        started_at: datetime | None,
        duration: float | None,
        end: Ending,
    ) -> None:
        """A run's outcome was written (``end.recorded``: it was still ours), or it was fenced
        before (``status`` None, ``end.why``). Announced after the write."""
        fenced = end.why is not None or not end.recorded
        lag = None
        if started_at is not None:
            lag = max((started_at - claim.scheduled_at).total_seconds(), 0.0)
        run = RunEvent(
            claim.job_name,
            claim.scheduled_at,
            claim.execution_id,
            claim.attempt,
            claim.trigger,
            self.instance_id,
            status or "STOPPED",
            fenced,
            started_at,
            self._now(),
            error if end.why is None else f"run fenced: {end.why}",
            claim.params,
            lag,
            duration,
        )
        self._finished_run(run, end)

    def abandoned(self, runs: Sequence[Abandoned], *, at_start_up: bool = False) -> None:
        """This instance's abandon write recorded ``runs`` ABANDONED (those handed back, never
        started, are QUEUED again: no event)."""
        now = self._now()
        for found in runs:
            if found.handed_back:
                continue
            run = RunEvent(
                found.job_name,
                found.scheduled_at,
                found.execution_id,
                found.attempt,
                found.trigger,
                found.instance_id,
                "ABANDONED",
                started_at=found.started_at,
                finished_at=now,
                error=found.error or _lapsed(found, at_start_up),
                params=found.params,
            )
            self._finished_run(run, Ending(abandoned=found, at_start_up=at_start_up))

    def _finished_run(self, run: RunEvent, end: Ending) -> None:
        for call in self._finished:
            call(run, end)
        for queue, method in self._to_hooks["run_finished"]:
            queue.put(method, run)

    def loop_blocked(self, job: str, seconds: float) -> None:
        """A job held the event loop for ``seconds`` (from the watchdog's thread: observers
        only, never a user hook's queue)."""
        for call in self._blocked:
            call(job, seconds)

    def _now(self) -> datetime | None:
        return self.clock.now() if self.clock is not None else None

    # --- life ---------------------------------------------------------------------------

    async def stop(self) -> None:
        """Give the user hooks' queued events up to :data:`DRAIN_SECONDS`, then end their tasks;
        then stop the built-ins that hold resources (the alert sender)."""
        deadline = time.monotonic() + DRAIN_SECONDS
        for queue in self.queues:
            await queue.stop(deadline)
        for observer in self.observers:
            stop = getattr(observer, "stop", None)
            if stop is not None:
                await stop()


def _lapsed(run: Abandoned, at_start_up: bool) -> str:
    if at_start_up:
        return "left RUNNING by a previous process with this instance id"
    return f"instance {run.instance_id} let its lease lapse at {run.lease_until.isoformat()}"
