"""Assembling an instance: the named steps :class:`slotcron.service.service.Service` is built
from. Each takes plain values and returns what it built (no step sees the service).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from slotcron.clock import Clock, DatabaseClock
from slotcron.config import Settings
from slotcron.engine.backfilling import Backfilling
from slotcron.engine.burst import Burst
from slotcron.engine.claims import Claimer
from slotcron.engine.firing import Firing
from slotcron.engine.horizon import RuntimePlanner
from slotcron.engine.outcomes import Outcomes
from slotcron.engine.permits import Permits
from slotcron.engine.planner import Planner
from slotcron.engine.queued import QueuedRuns
from slotcron.engine.runner import Runner
from slotcron.engine.runtime import Runtime
from slotcron.engine.scheduled import JobSchedules, ScheduledJob
from slotcron.engine.shares import Shares, jobs_digest
from slotcron.engine.supersession import Supersession
from slotcron.engine.takeover import Takeover
from slotcron.jobs.registry import Job
from slotcron.lifeline.fencing import Fencing
from slotcron.lifeline.heartbeat import Heartbeat, Shedder
from slotcron.lifeline.inflight import Runs
from slotcron.lifeline.leader import Leader
from slotcron.lifeline.membership import Membership
from slotcron.lifeline.reconnection import Reconnection
from slotcron.lifeline.roles import Collaborators
from slotcron.lifeline.watchdog import Watchdog
from slotcron.observe.alerts import AlertFlags, Alerting, Alerts, install
from slotcron.observe.events import Events, Hook, Observer, load_hooks
from slotcron.observe.metrics import Counting, JobLabels, Metrics, PrometheusMetrics
from slotcron.observe.runlog import RunLog
from slotcron.observe.tracing import Tracing
from slotcron.store import membership as membership_store

QUEUE_POLL_SECONDS = 1.0
"""The longest the queue of manual runs waits between looks (with no notification)."""


@dataclass
class Observing:
    """What observes an instance: its metrics (Prometheus's when it serves HTTP), its alert
    sender, and the events the engine announces to them and to the user hooks."""

    metrics: Metrics
    prometheus: PrometheusMetrics | None
    alerts: Alerts
    events: Events


def observing(
    settings: Settings,
    *,
    clock: Clock,
    jobs: Sequence[Job],
    tasks: Sequence[Job],
    held: Callable[[str], ScheduledJob | None],
    hooks: Sequence[Hook] = (),
    http_address: Callable[[], tuple[str, int] | None] = lambda: None,
) -> Observing:
    """The built-in observers (metrics, traces, alerts, the run log) and the user hooks
    (``hooks``, then ``SCHEDULER_HOOKS``) on one :class:`Events`. ``held`` finds the runtime
    schedule a name belongs to (labels and alert flags by task, never by schedule id)."""
    prometheus = None
    if settings.http_port is not None:  # counted only when there is a server to expose them
        labels = JobLabels([job.name for job in jobs], [task.name for task in tasks], held)
        prometheus = PrometheusMetrics(clock, labels)
    metrics: Metrics = prometheus or Metrics()
    alerts = install(
        settings,
        alerting=AlertFlags({job.name: job.alert for job in jobs}, held),
        clock=clock,
        dashboard=http_address,
    )
    observers: list[Observer] = [Tracing(), RunLog(settings.instance_id)]
    if prometheus is not None:
        observers.insert(0, Counting(prometheus))
    if settings.alert_webhook_url is not None:
        observers.append(Alerting(alerts))
    events = Events(
        observers,
        [*hooks, *load_hooks(settings.hooks)],
        clock=clock,
        instance_id=settings.instance_id,
        on_dropped=metrics.hook_dropped,
    )
    return Observing(metrics, prometheus, alerts, events)


@dataclass
class Engine:
    """What claims slots and runs them: every part the service holds, built together (they
    call one another)."""

    schedules: JobSchedules
    claimer: Claimer
    supersession: Supersession
    outcomes: Outcomes
    reconnection: Reconnection
    runner: Runner
    firing: Firing
    planner: Planner
    schedule_planner: RuntimePlanner
    runtime: Runtime
    queued: QueuedRuns
    backfilling: Backfilling
    period: float
    """Seconds between the roles' looks (heartbeat, queue): several to the shortest lease."""
    membership: Membership
    takeover: Takeover


def engine(
    settings: Settings,
    shared: Collaborators,
    *,
    jobs: Sequence[Job],
    tasks: Sequence[Job],
    runs: Runs,
) -> Engine:
    """The claimer, runner, outcome writer, firing and its planners (code jobs', runtime
    schedules'), the queue of manual runs, the backfills' carrier, the reconnection check."""
    schedules = JobSchedules({job.name: job.schedule(settings.timezone) for job in jobs})
    claimer = Claimer(shared, default_lease=settings.lease_seconds, timezone=settings.timezone)
    described = {
        job.name: f"{schedules[job.name].describe()} ({job.timezone or settings.timezone})"
        for job in jobs
    }
    supersession = claimer.supersession = Supersession(shared.db, shared.instance_id, described)
    outcomes = Outcomes(shared)
    reconnection = Reconnection(
        shared, runs=runs, lease=settings.lease_seconds, next_slot=_slot_after(schedules)
    )
    outcomes.on_recorded = reconnection.recorded
    claimer.counted.update(job.name for job in jobs if job.max_runs is not None)
    outcomes.counted = reconnection.counted = claimer.counted
    shared.outage.on_recovered = reconnection.reconnected
    runner = Runner(
        shared,
        runs=runs,
        outcomes=outcomes,
        on_retry_queued=lambda when: queued.wake_at(when),
        on_run_ended=lambda name: queued.run_ended(name),
    )
    firing = Firing(
        {job.name: job for job in jobs if job.enabled},
        schedules,
        clock=shared.clock,
        claimer=claimer,
        runner=runner,
        permits=Permits(settings.max_concurrency),
    )
    planner, schedule_planner, runtime = _planners(settings, shared, jobs, tasks, firing)
    supersession.changed = runtime.reread
    shortest_lease = min([job.lease_seconds(settings.lease_seconds) for job in jobs] + [math.inf])
    period = min(settings.heartbeat_seconds, min(shortest_lease, settings.lease_seconds) / 4)
    queued = QueuedRuns(
        shared,
        jobs={job.name: job for job in jobs},
        default_lease=settings.lease_seconds,
        # A manual run is expected to start within a second or two.
        period=min(period, QUEUE_POLL_SECONDS),
        start=firing.start_claimed,
        pool_size=settings.pool_size,
        resolve=runtime.resolve,
    )
    return Engine(
        schedules, claimer, supersession, outcomes, reconnection, runner, firing, planner,
        schedule_planner, runtime, queued,
        _backfilling(settings, shared, jobs, schedules, queued, runtime), period,
        *_sharing(shared, jobs_digest(jobs, tasks, settings.timezone), planner, runtime, period),
    )  # fmt: skip


def _sharing(
    shared: Collaborators,
    digest: str,
    planner: Planner,
    runtime: Runtime,
    period: float,
) -> tuple[Membership, Takeover]:
    """Each slot planned by one member (issue 29): the members' view, read every ``period``,
    and the look for slots their owner did not claim in time."""

    async def reshare() -> None:
        names = planner.newly_owned()
        planner.reshare(await membership_store.next_slots(shared.db, names) if names else {})
        runtime.reshare()

    takeover = Takeover(shared, shares=planner.shares, planner=planner, runtime=runtime)
    stats = planner.firing.claimer.stats
    membership = Membership(
        shared,
        shares=planner.shares,
        jobs_digest=digest,
        period=period,
        on_change=reshare,
        signs=lambda: stats.taken + takeover.taken,
    )
    return membership, takeover


def _backfilling(
    settings: Settings,
    shared: Collaborators,
    jobs: Sequence[Job],
    schedules: JobSchedules,
    queued: QueuedRuns,
    runtime: Runtime,
) -> Backfilling:
    """The carrier of backfills: it queues their slots for the queue of manual runs."""
    backfilling = Backfilling(
        shared,
        jobs={job.name: job for job in jobs},
        schedules=schedules,
        timezone=settings.timezone,
        capacity=settings.max_concurrency,
        retention_days=settings.history_retention_days,
        on_queued=queued.wake_at,
        resolve=runtime.resolve,
        listening=lambda: queued.listening,
    )
    queued.on_backfill = backfilling.wake
    return backfilling


def _planners(
    settings: Settings,
    shared: Collaborators,
    jobs: Sequence[Job],
    tasks: Sequence[Job],
    firing: Firing,
) -> tuple[Planner, RuntimePlanner, Runtime]:
    """The code jobs' planner; the runtime schedules' (issue 15: their own heap, fed by the
    loader with what is due within the horizon); the loader."""
    schedules = firing.schedules
    assert isinstance(schedules, JobSchedules)
    burst = Burst(schedules, clock=shared.clock, claimer=firing.claimer, firing=firing)
    shares = Shares(shared.instance_id)
    planner = Planner(
        jobs, schedules, clock=shared.clock, firing=firing, burst=burst, shares=shares
    )
    schedule_planner = RuntimePlanner(
        schedules, clock=shared.clock, firing=firing, burst=burst, shares=shares
    )
    runtime = Runtime(
        shared,
        tasks=tasks,
        planner=schedule_planner,
        schedules=schedules,
        pool_size=settings.pool_size,
        lease=settings.lease_seconds,
    )
    return planner, schedule_planner, runtime


def _slot_after(schedules: JobSchedules) -> Callable[[str, datetime], datetime | None]:
    def slot_after(job_name: str, slot: datetime) -> datetime | None:
        """The job's slot after ``slot`` (None when its schedule is not held here)."""
        try:
            return schedules[job_name].next_after(slot)
        except KeyError:
            return None

    return slot_after


@dataclass
class Lifeline:
    """What keeps the instance's runs and leadership alive, and judges others'."""

    leader: Leader
    heartbeat: Heartbeat
    fencing: Fencing
    shedder: Shedder
    watchdog: Watchdog | None


def lifeline(
    settings: Settings,
    shared: Collaborators,
    parts: Engine,
    *,
    jobs: Sequence[Job],
    runs: Runs,
    instance_state: Callable[[], str],
    on_id_taken: Callable[[], None],
) -> Lifeline:
    """The leader, the heartbeat (``on_id_taken``: another process holds our id), fencing by
    time, the idle-connection shedder, and the watchdog of a blocked loop."""
    leader = Leader(
        shared,
        lease=settings.lease_seconds,
        # Three ticks to a lease: a lapsed lease or a silent instance is found within a third
        # of a lease, at three or four statements a minute while nothing happens.
        period=max(parts.period, settings.lease_seconds / 3),
        reconcile=parts.firing.reconcile,
        retention_days=settings.history_retention_days,
        on_queued=parts.queued.wake_at,
    )
    heartbeat = Heartbeat(
        shared,
        runs=runs,
        # A lease must be renewed several times before it can lapse.
        period=parts.period,
        instance_state=instance_state,
    )
    heartbeat.on_id_taken = on_id_taken
    heartbeat.judging_elsewhere = lambda: parts.reconnection.pending
    heartbeat.on_reshare = parts.membership.flagged
    watchdog = None
    # Leases kept while a job blocks the loop (production clock only: a test's manual clock
    # does not move while the loop is blocked, and nothing lapses).
    if isinstance(shared.clock, DatabaseClock):
        watchdog = Watchdog(
            db=shared.db,
            clock=shared.clock,
            instance_id=shared.instance_id,
            runs=runs,
            jobs=list(jobs),
            period=parts.period,
            events=shared.events,
            instance_state=instance_state,
            incarnation=lambda: heartbeat.incarnation,
            on_id_taken=heartbeat.lose_id,
        )
    return Lifeline(leader, heartbeat, Fencing(shared, runs=runs), Shedder(shared), watchdog)
