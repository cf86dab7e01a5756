"""What an instance counts for Prometheus.

Two kinds of figure. Events the hot path reports through three hooks (a slot recorded not
run, a run started, a run finished): :class:`Metrics` is their no-op base, what an instance
without an HTTP server uses, and :class:`PrometheusMetrics` counts them. State that already
exists (claim statistics, database errors, leadership, draining, the clock offset, runs in
flight) is read when Prometheus scrapes, by :class:`slotcron.observe.collector.InstanceCollector`,
at no cost between scrapes.

Labels are bounded by the code, never by the data (issue 26): a ``job`` label names a code job
(``@cron``/``@every``), or ``task:<name>`` for every runtime schedule of a task, or
:data:`OTHER` for anything else (a run the leader recorded for a job or schedule this instance
does not hold). A million schedules are as many series as one; their own figures stay in the
API and the timeline. :class:`JobLabels` does the mapping, from what the service gives it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram

from slotcron.clock import Clock
from slotcron.observe.collector import InstanceCollector, Scraped
from slotcron.observe.events import Ending, Observer, RunEvent, SlotsEvent

if TYPE_CHECKING:
    from slotcron.store.claims import Claim

__all__ = [
    "OTHER",
    "TASK_LABEL",
    "Counting",
    "InstanceCollector",
    "JobLabels",
    "Metrics",
    "PrometheusMetrics",
    "Scraped",
]

# Fire lag: a healthy instance starts within milliseconds of the slot.
LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)

# Fire lag is measured for these triggers only: a catch-up or retry is late by design, and a
# manual run's slot is the moment it was asked for.
ON_TIME_TRIGGERS = frozenset({"cron", "interval"})


TASK_LABEL = "task:"
"""Prefix of the ``job`` label of a task's runtime schedules: ``task:<task name>``."""
OTHER = "(other)"
"""The ``job`` label of a name that is neither a code job here nor a schedule held here."""


class _Scheduled(Protocol):
    @property
    def task(self) -> str: ...


class JobLabels:
    """Maps a job name (what the engine reports) to its ``job`` label: a code job's name; for a
    runtime schedule held here, ``task:<its task>``; else :data:`OTHER`. Every value comes from
    the code jobs and tasks named at construction, so no schedule id can become a series.

    ``held`` finds the runtime schedule a name belongs to (the service's
    ``schedules.held``): a plain dictionary lookup, cheap on a run's path and safe from the
    watchdog's thread."""

    def __init__(
        self,
        jobs: Iterable[str],
        tasks: Iterable[str],
        held: Callable[[str], _Scheduled | None],
    ) -> None:
        self._jobs = frozenset(jobs)
        self._tasks = {task: TASK_LABEL + task for task in tasks}
        self._held = held

    def __call__(self, name: str) -> str:
        if name in self._jobs:
            return name
        job = self._held(name)
        label = self._tasks.get(job.task) if job is not None else None
        return label if label is not None else OTHER


def _anonymous(name: str) -> str:
    return OTHER


class Metrics:
    """The hooks the scheduler calls. This base does nothing, so calling them costs a method
    call when nobody scrapes."""

    def slot_recorded(self, job: str, outcome: str) -> None:
        """A slot this instance decided not to run (``SKIPPED``, ``MISSED``), or a run it
        recorded ``ABANDONED`` (as leader)."""

    def run_started(self, job: str, trigger: str, slot: datetime) -> float:
        """The job's coroutine starts now; returns the moment to pass to :meth:`run_finished`."""
        return 0.0

    def run_finished(self, job: str, outcome: str, began: float) -> None:
        """A run ended (``COMPLETED``, ``FAILED``, ``STOPPED``, or ``FENCED`` when its record was
        no longer ours). ``began`` is what :meth:`run_started` returned (0.0: it never did)."""

    def loop_blocked(self, job: str, seconds: float) -> None:
        """A job held the event loop for ``seconds`` (called from the watchdog's thread)."""

    def hook_dropped(self, hook: str) -> None:
        """An event for the user hook ``hook`` was dropped: its queue was full."""


class PrometheusMetrics(Metrics):
    """The event counters of one instance, in a registry of its own (several services may
    share a process, as tests do)."""

    def __init__(
        self,
        clock: Clock,
        labels: Callable[[str], str] = _anonymous,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.clock = clock
        self.labels = labels
        """A job name's ``job`` label (:class:`JobLabels`); every event goes through it."""
        self.registry = registry if registry is not None else CollectorRegistry()
        self._slots = Counter(
            "slotcron_slots",
            "Slots this instance decided, by code job or task (task:<name>) and outcome "
            "(COMPLETED, FAILED, STOPPED, SKIPPED, MISSED, ABANDONED, FENCED)",
            ["job", "outcome"],
            registry=self.registry,
        )
        self._lag = Histogram(
            "slotcron_fire_lag_seconds",
            "Start of a cron or interval run minus its slot, by the database clock (includes "
            "jitter, when a job sets one)",
            buckets=LAG_BUCKETS,
            registry=self.registry,
        )
        self._duration = Histogram(
            "slotcron_run_duration_seconds",
            "How long runs took, by code job or task (task:<name>)",
            ["job"],
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )
        self._blocked = Counter(
            "slotcron_loop_blocked_seconds",
            "Seconds a job held the event loop without yielding (it should await, or run its "
            "blocking work in a thread), by code job or task (task:<name>)",
            ["job"],
            registry=self.registry,
        )
        self._stalls = Counter(
            "slotcron_loop_stalls",
            "Times a job held the event loop for longer than the watchdog tolerates, by code "
            "job or task (task:<name>)",
            ["job"],
            registry=self.registry,
        )
        self._hook_dropped = Counter(
            "slotcron_hook_events_dropped",
            "Events a user hook (SCHEDULER_HOOKS, Scheduler(hooks=...)) did not get because its "
            "queue was full, by hook",
            ["hook"],
            registry=self.registry,
        )
        # Children cached per label set (never per job name: there may be a million), one
        # dict lookup per event instead of labels().
        self._slot_children: dict[tuple[str, str], Counter] = {}
        self._duration_children: dict[str, Histogram] = {}

    def _count(self, label: str, outcome: str) -> None:
        child = self._slot_children.get((label, outcome))
        if child is None:
            child = self._slot_children[label, outcome] = self._slots.labels(label, outcome)
        child.inc()

    def slot_recorded(self, job: str, outcome: str) -> None:
        self._count(self.labels(job), outcome)

    def run_started(self, job: str, trigger: str, slot: datetime) -> float:
        if trigger in ON_TIME_TRIGGERS:
            self._lag.observe(max((self.clock.now() - slot).total_seconds(), 0.0))
        return time.monotonic()

    def loop_blocked(self, job: str, seconds: float) -> None:
        label = self.labels(job)
        self._blocked.labels(label).inc(seconds)
        self._stalls.labels(label).inc()

    def run_finished(self, job: str, outcome: str, began: float) -> None:
        self.run_ended(job, outcome, time.monotonic() - began if began else None)

    def run_ended(self, job: str, outcome: str, seconds: float | None) -> None:
        label = self.labels(job)
        self._count(label, outcome)
        if seconds is not None:
            child = self._duration_children.get(label)
            if child is None:
                child = self._duration_children[label] = self._duration.labels(label)
            child.observe(seconds)

    def hook_dropped(self, hook: str) -> None:
        self._hook_dropped.labels(hook).inc()


class Counting(Observer):
    """The metrics as a built-in observer of the engine's events."""

    def __init__(self, metrics: PrometheusMetrics) -> None:
        self.metrics = metrics
        self._lag = metrics._lag

    def run_started(self, run: RunEvent) -> None:
        if run.trigger in ON_TIME_TRIGGERS and run.lag_seconds is not None:
            self._lag.observe(run.lag_seconds)

    def run_finished(self, run: RunEvent, end: Ending) -> None:
        if end.abandoned is not None:
            self.metrics.slot_recorded(run.job, run.status)
        else:
            outcome = "FENCED" if run.fenced else run.status
            self.metrics.run_ended(run.job, outcome, run.duration_seconds)

    def slots_passed(self, event: SlotsEvent, record: Claim, together: int | None) -> None:
        self.metrics.slot_recorded(event.job, event.status)

    def loop_blocked(self, job: str, seconds: float) -> None:
        self.metrics.loop_blocked(job, seconds)
