"""What an instance counts for Prometheus.

Two kinds of figure. Events the hot path reports through three hooks (a slot recorded not
run, a run started, a run finished): :class:`Metrics` is their no-op base, what an instance
without an HTTP server uses, and :class:`PrometheusMetrics` counts them. State that already
exists (claim statistics, database errors, leadership, draining, the clock offset, runs in
flight) is read when Prometheus scrapes, by :class:`InstanceCollector`, at no cost between
scrapes.

Labels are bounded by the code, never by the data (issue 26): a ``job`` label names a code job
(``@cron``/``@every``), or ``task:<name>`` for every runtime schedule of a task, or
:data:`OTHER` for anything else (a run the leader recorded for a job or schedule this instance
does not hold). A million schedules are as many series as one; their own figures stay in the
API and the timeline. :class:`JobLabels` does the mapping, from what the service gives it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from slotcron.clock import Clock
from slotcron.version import __version__

if TYPE_CHECKING:
    from slotcron.service.service import Service

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
        label = self.labels(job)
        self._count(label, outcome)
        if began:
            child = self._duration_children.get(label)
            if child is None:
                child = self._duration_children[label] = self._duration.labels(label)
            child.observe(time.monotonic() - began)


class InstanceCollector(Collector):
    """Figures read from the service's own state at scrape time."""

    def __init__(self, service: Service) -> None:
        self.service = service

    def collect(self) -> Iterator[Metric]:
        service = self.service
        stats = service.claimer.stats
        info = GaugeMetricFamily(
            "slotcron_instance_info", "This instance", labels=["instance", "version"]
        )
        info.add_metric([service.instance_id, __version__], 1)
        yield info
        yield CounterMetricFamily(
            "slotcron_claims",
            "Slots this instance claimed (decided: run, skipped or missed)",
            value=stats.claims,
        )
        yield CounterMetricFamily(
            "slotcron_claims_lost",
            "Claims lost to another instance (the slot was already claimed)",
            value=stats.taken,
        )
        yield CounterMetricFamily(
            "slotcron_claim_busy_retries",
            "Claims retried because another instance held the job's row at that moment",
            value=stats.busy_retries,
        )
        yield CounterMetricFamily(
            "slotcron_claims_given_up",
            "Slots not claimed before their deadline (left to the misfire policy)",
            value=stats.gave_up,
        )
        yield CounterMetricFamily(
            "slotcron_database_errors",
            "Database calls that failed (connection lost or refused, timeouts)",
            value=service.outage.errors,
        )
        yield GaugeMetricFamily(
            "slotcron_database_outage",
            "1 while the database is unreachable from this instance",
            value=1 if service.outage.ongoing else 0,
        )
        yield GaugeMetricFamily(
            "slotcron_runs_in_flight", "Runs executing on this instance", value=len(service.runs)
        )
        yield GaugeMetricFamily(
            "slotcron_leader",
            "1 while this instance holds the cluster's leadership lease",
            value=1 if service.leader.leading else 0,
        )
        yield GaugeMetricFamily(
            "slotcron_draining",
            "1 once shutdown has begun (no more claims; in-flight runs drain)",
            value=1 if service.state in ("draining", "stopped") else 0,
        )
        sent = service.alerts.stats
        yield CounterMetricFamily(
            "slotcron_alerts_sent",
            "Alert events the webhook accepted (SCHEDULER_ALERT_WEBHOOK_URL)",
            value=sent.sent,
        )
        yield CounterMetricFamily(
            "slotcron_alerts_failed",
            "POSTs to the alert webhook that failed (each retry counts)",
            value=sent.failed,
        )
        yield CounterMetricFamily(
            "slotcron_alerts_dropped",
            "Alert events given up: queue full, retries exhausted, refused, or shutdown",
            value=sent.dropped,
        )
        yield GaugeMetricFamily(
            "slotcron_alerts_queued", "Alert events waiting to be sent", value=sent.queued
        )
        yield GaugeMetricFamily(
            "slotcron_database_read_only",
            "1 while the database refuses this instance's writes as read-only",
            value=1 if service.db.read_only else 0,
        )
        replication = service.reconnection.replication
        if replication is not None:
            yield GaugeMetricFamily(
                "slotcron_database_synchronous_replication",
                "1 when commits wait for a standby (a failover keeps every acknowledged claim), "
                "0 when a failover can lose the last claims (PostgreSQL)",
                value=1 if replication.synchronous else 0,
            )
        yield GaugeMetricFamily(
            "slotcron_schedules_quarantined",
            "Runtime schedules due within the horizon whose rows cannot be read (listed with "
            "their error by GET /api/schedules); every other schedule fires",
            value=service.runtime.quarantined,
        )
        yield CounterMetricFamily(
            "slotcron_failover_fenced_runs",
            "Runs fenced after reconnecting because the database no longer had their claim",
            value=service.reconnection.fenced,
        )
        offset = getattr(service.clock, "offset", None)
        if offset is not None:
            yield GaugeMetricFamily(
                "slotcron_database_clock_offset_seconds",
                "Database clock minus this machine's clock, as last measured",
                value=offset.total_seconds(),
            )
