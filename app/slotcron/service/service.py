"""The service: wires the roles together, starts them, and runs until a signal."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import secrets
import socket
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy.ext.asyncio import AsyncConnection

from slotcron.clock import Clock, DatabaseClock
from slotcron.config import Settings
from slotcron.engine.burst import Burst
from slotcron.engine.claims import Claimer
from slotcron.engine.firing import Firing
from slotcron.engine.outcomes import Outcomes
from slotcron.engine.permits import Permits
from slotcron.engine.planner import Planner
from slotcron.engine.queued import QueuedRuns
from slotcron.engine.runner import Runner
from slotcron.engine.runtime import JobSchedules, Runtime, RuntimePlanner
from slotcron.engine.supersession import Supersession
from slotcron.errors import ConfigError, InvalidJobError
from slotcron.jobs.registry import REGISTRY, Job
from slotcron.lifeline.fencing import Fencing
from slotcron.lifeline.heartbeat import Heartbeat, Shedder
from slotcron.lifeline.inflight import Runs
from slotcron.lifeline.leader import Leader
from slotcron.lifeline.outage import DB_ERRORS, Backoff, Outage, describe, refused_login
from slotcron.lifeline.reconnection import Reconnection
from slotcron.lifeline.roles import Collaborators, Role, Stoppable
from slotcron.lifeline.watchdog import Watchdog
from slotcron.observe import alerts, tracing
from slotcron.observe.logs import run_fields
from slotcron.observe.metrics import JobLabels, Metrics, PrometheusMetrics
from slotcron.service.shutdown import Signals, shut_down
from slotcron.status import InstanceState
from slotcron.store import batch as batch_store
from slotcron.store import claims as claim_store
from slotcron.store import lifeline, markers, migrate, registrations
from slotcron.store import runs as run_store
from slotcron.store import schedules as schedule_store
from slotcron.store import starts as start_store
from slotcron.store.database import Database
from slotcron.store.registrations import JobRow
from slotcron.version import __version__

if TYPE_CHECKING:
    from slotcron.http import HttpServer

log = logging.getLogger("slotcron.service")

QUEUE_POLL_SECONDS = 1.0


GC_THRESHOLDS = (700, 10, 1000)
"""The cyclic collector's thresholds once start-up is frozen: Python's young generations (700,
10), but a full pass only after 1,000 middle ones (Python's is 10). ``gc.freeze`` leaves the old
generation empty, so Python's own guard against full passes (a quarter more objects than the
last one found) seldom holds, and one ran every 70,000 allocations: 4 times inside a 10,000-job
burst's 1 s claim window, each rescanning every run then in flight (50 to 70 ms loop pauses,
160 to 290 ms of the burst's 1.0 s of CPU). The young passes are left as they are: larger ones
would pause a small burst's start for milliseconds. Garbage in cycles that outlives the young
passes is freed after some 7 million allocations instead of 70,000."""


class Service:
    """One slotcron instance. ``clock`` defaults to the database's clock."""

    def __init__(
        self,
        settings: Settings,
        jobs: Sequence[Job],
        clock: Clock | None = None,
        tasks: Sequence[Job] | None = None,
    ) -> None:
        self.tasks = REGISTRY.tasks() if tasks is None else list(tasks)
        """The ``@task`` tasks this instance records for writers of schedules (issue 15)."""
        self.settings = settings
        self.jobs = list(jobs)
        self.instance_id = settings.instance_id
        self.db = Database.connect(
            settings.url,
            settings.pool_size,
            lease_seconds=settings.lease_seconds,
            pooler=settings.database_pooler,
        )
        self.clock: Clock = clock if clock is not None else DatabaseClock(self.db.clock_sample)
        self.db.server_clock = isinstance(self.clock, DatabaseClock)
        self.outage = Outage()
        self.incarnation = secrets.token_hex(16)
        """This process's hold on the instance id, drawn once: a start-up step retried after
        an error finds its own earlier registration and does not wait for itself."""
        self.runs = Runs()
        self.state: str = InstanceState.STARTING
        self.signals = Signals()
        self.exit_status = 0
        """1 once another process took the instance id over (see :meth:`_id_taken`)."""
        # Counted only when there is an HTTP server to expose them.
        # Labelled by code job and by task, never by schedule id (see
        # slotcron.observe.metrics.JobLabels).
        labels = JobLabels(
            [job.name for job in self.jobs],
            [task.name for task in self.tasks],
            lambda name: self.schedules.held(name),
        )
        prometheus = (
            PrometheusMetrics(self.clock, labels) if settings.http_port is not None else None
        )
        self.metrics: Metrics = prometheus or Metrics()
        shared = Collaborators(
            db=self.db,
            clock=self.clock,
            instance_id=self.instance_id,
            outage=self.outage,
            metrics=self.metrics,
        )
        self.schedules = JobSchedules(
            {job.name: job.schedule(settings.timezone) for job in self.jobs}
        )
        self.claimer = Claimer(shared, default_lease=settings.lease_seconds)
        self.supersession = self.claimer.supersession = Supersession(
            self.db,
            self.instance_id,
            {
                job.name: f"{self.schedules[job.name].describe()} "
                f"({job.timezone or settings.timezone})"
                for job in self.jobs
            },
        )
        self.outcomes = Outcomes(shared)
        self.reconnection = Reconnection(
            shared, runs=self.runs, lease=settings.lease_seconds, next_slot=self._slot_after
        )
        self.outcomes.on_recorded = self.reconnection.recorded
        self.outage.on_recovered = self.reconnection.reconnected
        self.runner = Runner(
            shared,
            runs=self.runs,
            outcomes=self.outcomes,
            on_retry_queued=lambda when: self.queued.wake_at(when),
            on_run_ended=lambda name: self.queued.run_ended(name),
        )
        self.firing = Firing(
            {job.name: job for job in self.jobs if job.enabled},
            self.schedules,
            clock=self.clock,
            claimer=self.claimer,
            runner=self.runner,
            permits=Permits(settings.max_concurrency),
        )
        burst = Burst(self.schedules, clock=self.clock, claimer=self.claimer, firing=self.firing)
        self.planner = Planner(
            self.jobs, self.schedules, clock=self.clock, firing=self.firing, burst=burst
        )
        # Runtime schedules (issue 15): their own heap, fed with what is due within the horizon.
        self.schedule_planner = RuntimePlanner(
            self.schedules, clock=self.clock, firing=self.firing, burst=burst
        )
        self.runtime = Runtime(
            shared,
            tasks=self.tasks,
            planner=self.schedule_planner,
            schedules=self.schedules,
            pool_size=settings.pool_size,
            lease=settings.lease_seconds,
        )
        self.supersession.changed = self.runtime.reread
        shortest_lease = min(
            [job.lease_seconds(settings.lease_seconds) for job in self.jobs]
            + [settings.lease_seconds]
        )
        period = min(settings.heartbeat_seconds, shortest_lease / 4)
        self.queued = QueuedRuns(
            shared,
            jobs={job.name: job for job in self.jobs},
            default_lease=settings.lease_seconds,
            # A manual run is expected to start within a second or two.
            period=min(period, QUEUE_POLL_SECONDS),
            start=self.firing.start_claimed,
            pool_size=settings.pool_size,
            resolve=self.runtime.resolve,
        )
        self.leader = Leader(
            shared,
            lease=settings.lease_seconds,
            # Three ticks to a lease: a lapsed lease or a silent instance is found within a
            # third of a lease, at three or four statements a minute while nothing happens.
            period=max(period, settings.lease_seconds / 3),
            reconcile=self.firing.reconcile,
            retention_days=settings.history_retention_days,
            on_queued=lambda when: self.queued.wake_at(when),
        )
        self.expected: dict[str, datetime | None] = {}
        self.heartbeat = Heartbeat(
            shared,
            runs=self.runs,
            # A lease must be renewed several times before it can lapse.
            period=period,
            instance_state=lambda: self.state,
        )
        self.heartbeat.on_id_taken = self._id_taken
        self.heartbeat.judging_elsewhere = lambda: self.reconnection.pending
        self.fencing = Fencing(shared, runs=self.runs)
        self.shedder = Shedder(shared)
        # Leases kept while a job blocks the loop (production clock only: a test's manual clock
        # does not move while the loop is blocked, and nothing lapses).
        self.watchdog: Watchdog | None = None
        if isinstance(self.clock, DatabaseClock):
            self.watchdog = Watchdog(
                db=self.db,
                clock=self.clock,
                instance_id=self.instance_id,
                runs=self.runs,
                jobs=self.jobs,
                period=period,
                metrics=self.metrics,
                instance_state=lambda: self.state,
                incarnation=lambda: self.heartbeat.incarnation,
                on_id_taken=self.heartbeat.lose_id,
            )
        self.http: HttpServer | None = None
        if prometheus is not None:
            from slotcron.http import HttpServer  # aiohttp is imported only when HTTP is configured

            self.http = HttpServer(self, prometheus)
        self.alerts = alerts.install(self)

    def _slot_after(self, job_name: str, slot: datetime) -> datetime | None:
        """The job's slot after ``slot`` (None when its schedule is not held here)."""
        try:
            return self.schedules[job_name].next_after(slot)
        except KeyError:
            return None

    @property
    def id_taken(self) -> bool:
        """Another process holds our instance id: its row is no longer ours to write."""
        return self.heartbeat.id_taken

    def _id_taken(self) -> None:
        """Our instance id is held by another process: shut down at once, without a drain
        (every run is fenced, nothing of ours is left to wait for), and exit 1 so the
        orchestrator starts a fresh process."""
        self.exit_status = 1
        self.signals.hurry.set()
        self.signals.requested.set()

    @property
    def roles(self) -> list[Role]:
        """The supervised background roles, in the order they start."""
        return [
            self.outcomes,
            self.heartbeat,
            self.fencing,
            self.shedder,
            self.reconnection,
            self.queued,
            self.runtime,
            self.leader,
        ]

    @property
    def claiming(self) -> list[Stoppable]:
        """What shutdown stops in phase 1, in order: whatever starts new runs or decides slots."""
        return [self.queued, self.runtime, self.schedule_planner, self.planner, self.leader]

    @property
    def keeping(self) -> list[Stoppable]:
        """What shutdown stops in phase 4, once no run is left, in order: what in-flight runs
        needed to the end (lease renewals, outcome writes). The HTTP server stops after them,
        last of all: /readyz says 503 through the whole shutdown."""
        return [
            *([self.watchdog] if self.watchdog else []),
            self.heartbeat,
            self.fencing,
            self.shedder,
            self.reconnection,
            self.outcomes,
        ]

    async def _prepare_database(self) -> None:
        if self.settings.migrate_on_start:
            before, after = await migrate.upgrade(self.db.engine, self.db.dialect)
            if before != after:
                log.info("database migrated from %s to %s", before or "empty", after)
        else:
            current = await migrate.current_revision(self.db.engine)
            head = migrate.HEAD
            if current != head:
                raise ConfigError(
                    "SCHEDULER_AUTO_MIGRATE",
                    f"database schema is at {current or 'nothing'}, this version needs {head}: "
                    "run `slotcron migrate` (or set SCHEDULER_AUTO_MIGRATE=true)",
                )
        # Behind a pooler every connection held is one of the pooler's few: one is opened ahead
        # (the rest as a burst needs them, closed again once idle).
        ahead = 1 if self.settings.database_pooler != "none" else len(self.jobs)
        await self.db.warm_up(min(self.settings.pool_size, max(ahead, 1)), self._rehearse)
        if isinstance(self.clock, DatabaseClock):
            offset = await self.clock.sync()
            log.info(
                "clock offset to the database: %+.1f ms (round trip %.1f ms)",
                offset.total_seconds() * 1000,
                self.clock.round_trip.total_seconds() * 1000,
            )
        # Whether a failover can lose our claims: said once at start-up, and after reconnecting.
        await self.reconnection.check_replication()
        # Refuses a second live process under this id; the heartbeat checks we still hold it.
        self.heartbeat.incarnation = await lifeline.hold_instance_id(
            self.db,
            instance_id=self.instance_id,
            lapse=self.settings.lease_seconds,
            clock=self.clock,
            incarnation=self.incarnation,
        )
        now = self.clock.now()
        for run in await lifeline.abandon_orphans(self.db, instance_id=self.instance_id, now=now):
            if run.handed_back:  # never started: QUEUED again, for any live instance
                continue
            self.metrics.slot_recorded(run.job_name, "ABANDONED")
            self.alerts.abandoned(run)
            log.warning(
                "execution %s of %s (slot %s) ABANDONED: left RUNNING by a previous process "
                "with this instance id%s",
                run.execution_id,
                run.job_name,
                run.scheduled_at.isoformat(),
                f"; retry queued as {run.retry_id}" if run.retry_id else "",
                extra=run_fields(
                    run.job_name, run.scheduled_at, run.execution_id, run.instance_id, "ABANDONED"
                ),
            )
        await registrations.register_instance(
            self.db,
            instance_id=self.instance_id,
            host=socket.gethostname(),
            pid=os.getpid(),
            version=__version__,
            now=now,
        )
        rows = [
            JobRow(
                name=job.name,
                kind=job.kind,
                schedule=self.schedules[job.name].describe(),
                timezone=job.timezone or self.settings.timezone,
                options=job.options(),
                first_slot=self.schedules[job.name].next_after(now),
                slots=self.schedules[job.name],
            )
            for job in self.jobs
        ]
        taken = await schedule_store.schedule_ids_among(self.db, [row.name for row in rows])
        if taken:  # registering would overwrite a runtime schedule's row
            raise InvalidJobError(
                taken[0], "name", "is the id of a runtime schedule: rename the job or remove it"
            )
        registered = await registrations.register_jobs(
            self.db, rows, now=now, instance_id=self.instance_id, version=__version__
        )
        self.supersession.registered(registered.fingerprints)
        await schedule_store.register_tasks(
            self.db, self.tasks, now=now, instance_id=self.instance_id, version=__version__
        )
        for row in rows:
            prior = registered.stored.get(row.name)
            # A new job expects the slot computed when it was registered, so a second boundary
            # passing before the planner starts is fired, not recorded MISSED. So does a job
            # whose schedule this registration changed: nothing of the old schedule is owed.
            took_over = row.name in registered.took_over
            self.expected[row.name] = (
                prior.next_slot_at if prior and not took_over else row.first_slot
            )
            if took_over and prior is not None:
                # The newest registration wins: instances still running the old schedule are
                # refused their claims of this job from now on (slotcron.engine.supersession).
                log.warning(
                    "schedule of %s changed: %s (%s) here takes over the cluster from %s (%s) "
                    "registered by %s (version %s)",
                    row.name,
                    row.schedule,
                    row.timezone,
                    prior.schedule,
                    prior.timezone,
                    prior.updated_by,
                    prior.version,
                )

    async def _rehearse(self, conn: AsyncConnection) -> None:
        await claim_store.rehearse(self.db, conn)
        await batch_store.rehearse(self.db, conn)
        await start_store.rehearse(self.db, conn)
        await markers.rehearse(self.db, conn)
        await run_store.rehearse(conn, self.db.dialect)

    async def start(self, stop: asyncio.Event | None = None) -> None:
        """Serve HTTP (if configured), connect (waiting out an unreachable database), register,
        and start firing."""
        tracing.install()  # when the OTEL_* variables ask for traces
        if self.http is not None:
            # First: the probes answer (/readyz 503) while the database is waited out.
            await self.http.start()
        try:
            await self._connect(stop)
        except BaseException:
            if self.http is not None:
                await self.http.stop()
            raise
        self.state = InstanceState.RUNNING
        # What start-up built (jobs, schedules, SQLAlchemy's metadata and caches) lives as long
        # as the process: keep it out of the collector's full passes, which otherwise pause the
        # loop for tens to hundreds of milliseconds in the middle of a burst of runs.
        gc.collect()
        gc.freeze()
        gc.set_threshold(*GC_THRESHOLDS)
        await self.alerts.start()
        self.planner.start(self.expected)
        self.schedule_planner.start()
        for role in self.roles:
            role.start()
        if self.watchdog is not None:
            self.watchdog.start()
        log.info(
            "instance %s running %d jobs on %s",
            self.instance_id,
            len(self.jobs),
            self.settings.safe_url,
        )

    async def _connect(self, stop: asyncio.Event | None) -> None:
        backoff = Backoff(first=0.5, cap=10.0)
        while True:
            try:
                await self._prepare_database()
                break
            except DB_ERRORS as exc:
                if refused_login(exc):
                    raise ConfigError(
                        "SCHEDULER_DATABASE_URL", f"the database refused us: {describe(exc)}"
                    ) from None
                self.outage.failed(exc, "starting up")
                if stop is not None and stop.is_set():
                    raise
                log.debug("start-up retry in %.1f s: %s", backoff.delay, describe(exc))
                await backoff.wait()
        self.outage.recovered()

    async def stop(self, signals: Signals | None = None) -> None:
        await shut_down(self, signals or Signals())

    async def run(self) -> bool:
        """Run until SIGTERM/SIGINT (or until another process takes our instance id over), then
        shut down in phases. False when some run ignored cancellation and is still alive (the
        caller must then exit without awaiting it). The exit status is :attr:`exit_status`."""
        signals = self.signals
        signals.install()
        starting = asyncio.create_task(self.start(signals.requested))
        requested = asyncio.create_task(signals.requested.wait())
        await asyncio.wait({starting, requested}, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await starting  # lets it stop the HTTP server
            await self.db.close()
            log.info("stopped before start-up completed")
            return True
        starting.result()
        await requested
        await self.stop(signals)
        return len(self.runs) == 0
