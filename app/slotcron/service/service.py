"""The service: wires the roles together, starts them, and runs until a signal."""

from __future__ import annotations

import asyncio
import gc
import logging
import secrets
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from slotcron.clock import Clock, DatabaseClock
from slotcron.config import Settings
from slotcron.database_url import where
from slotcron.errors import ConfigError, DatabaseUnreachable
from slotcron.jobs.registry import REGISTRY, Job
from slotcron.lifeline.inflight import Runs
from slotcron.lifeline.outage import DB_ERRORS, Backoff, Outage, describe, refused_login
from slotcron.lifeline.roles import Collaborators, Role, Stoppable
from slotcron.observe import tracing
from slotcron.observe.events import Hook
from slotcron.service import assemble, memory, startup
from slotcron.service.shutdown import Signals, shut_down
from slotcron.status import InstanceState
from slotcron.store import instance_ids, lifeline
from slotcron.store.database import Database

if TYPE_CHECKING:
    from slotcron.http import HttpServer
    from slotcron.observe.metrics import PrometheusMetrics

log = logging.getLogger("slotcron.service")

GC_THRESHOLDS = (700, 10, 1000)
"""The cyclic collector's thresholds once start-up is frozen: Python's young generations (700,
10), but a full pass only after 1,000 middle ones (Python's is 10). ``gc.freeze`` leaves the old
generation empty, so Python's own guard against full passes (a quarter more objects than the
last one found) seldom holds, and one ran every 70,000 allocations: 4 times inside a 10,000-job
burst's 1 s claim window, each rescanning every run then in flight (50 to 70 ms loop pauses,
160 to 290 ms of the burst's 1.0 s of CPU). The young passes are left as they are: larger ones
would pause a small burst's start for milliseconds. Garbage in cycles that outlives the young
passes is freed after some 7 million allocations instead of 70,000."""


def tune_gc() -> None:
    """Keep what start-up built (jobs, schedules, SQLAlchemy's metadata and caches: it lives as
    long as the process) out of the collector's full passes, which otherwise pause the loop for
    tens to hundreds of milliseconds in the middle of a burst of runs. The process's own
    choice: ``slotcron run`` makes it, an application embedding a scheduler keeps its own."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


class Service:
    """One slotcron instance. ``clock`` defaults to the database's clock."""

    def __init__(
        self,
        settings: Settings,
        jobs: Sequence[Job],
        clock: Clock | None = None,
        tasks: Sequence[Job] | None = None,
        *,
        hooks: Sequence[Hook] = (),
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
        http = self._observe(hooks)
        self._assemble_roles()
        self.expected: dict[str, datetime | None] = {}
        self.http: HttpServer | None = None
        if http is not None:
            from slotcron.http import HttpServer  # aiohttp is imported only when HTTP is configured

            self.http = HttpServer(self, http)

    def _observe(self, hooks: Sequence[Hook]) -> PrometheusMetrics | None:
        """Metrics, alerts and the events (:func:`assemble.observing`); the Prometheus metrics
        the HTTP server exposes, when it is configured."""
        observing = assemble.observing(
            self.settings,
            clock=self.clock,
            jobs=self.jobs,
            tasks=self.tasks,
            held=lambda name: self.schedules.held(name),
            hooks=hooks,
            http_address=lambda: (self.http.host, self.http.port) if self.http else None,
        )
        self.metrics, self.alerts = observing.metrics, observing.alerts
        self.events = observing.events
        """What the engine announces runs and passed slots through (observe/events)."""
        return observing.prometheus

    def _assemble_roles(self) -> None:
        """The engine's parts and the lifeline's roles (:func:`assemble.engine`,
        :func:`assemble.lifeline`), held by name."""
        shared = Collaborators(
            db=self.db,
            clock=self.clock,
            instance_id=self.instance_id,
            outage=self.outage,
            events=self.events,
        )
        parts = assemble.engine(
            self.settings, shared, jobs=self.jobs, tasks=self.tasks, runs=self.runs
        )
        self.schedules, self.claimer, self.supersession = (
            parts.schedules, parts.claimer, parts.supersession
        )  # fmt: skip
        self.outcomes, self.reconnection, self.runner = (
            parts.outcomes, parts.reconnection, parts.runner
        )  # fmt: skip
        self.firing, self.planner, self.queued = parts.firing, parts.planner, parts.queued
        self.schedule_planner, self.runtime = parts.schedule_planner, parts.runtime
        self.backfilling = parts.backfilling
        self.membership, self.takeover = parts.membership, parts.takeover
        kept = assemble.lifeline(
            self.settings,
            shared,
            parts,
            jobs=self.jobs,
            runs=self.runs,
            instance_state=lambda: self.state,
            on_id_taken=self._id_taken,
        )
        self.leader, self.heartbeat, self.fencing = kept.leader, kept.heartbeat, kept.fencing
        self.shedder, self.watchdog = kept.shedder, kept.watchdog

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
            self.backfilling,
            self.runtime,
            self.leader,
            self.membership,
            self.takeover,
        ]

    @property
    def claiming(self) -> list[Stoppable]:
        """What shutdown stops in phase 1, in order: whatever starts new runs or decides slots."""
        return [
            self.takeover,
            self.membership,
            self.queued,
            self.backfilling,
            self.runtime,
            self.schedule_planner,
            self.planner,
            self.leader,
        ]

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
        """The start-up steps (:mod:`slotcron.service.startup`), in order."""
        await startup.schema(self.db, self.settings)
        await startup.warm_up(self.db, self.settings, len(self.jobs))
        await startup.sync_clock(self.clock)
        # Whether a failover can lose our claims: said once at start-up, and after reconnecting.
        await self.reconnection.check_replication()
        # Refuses a second live process under this id; the heartbeat checks we still hold it.
        self.heartbeat.incarnation = await instance_ids.hold_instance_id(
            self.db,
            instance_id=self.instance_id,
            lapse=self.settings.lease_seconds,
            clock=self.clock,
            incarnation=self.incarnation,
        )
        now = self.clock.now()
        orphans = await lifeline.abandon_orphans(self.db, instance_id=self.instance_id, now=now)
        self.events.abandoned(orphans, at_start_up=True)  # those never started: QUEUED again
        # Without its job digest: a member of nobody until it plans (Membership joins then).
        await startup.register_instance(self.db, self.instance_id, now)
        self.expected = await startup.register_jobs(
            self.db,
            self.settings,
            jobs=self.jobs,
            tasks=self.tasks,
            schedules=self.schedules,
            supersession=self.supersession,
            now=now,
        )

    async def start(self, stop: asyncio.Event | None = None, *, patient: bool = True) -> None:
        """:meth:`open`, then :meth:`begin`."""
        await self.open(stop, patient=patient)
        await self.begin()

    async def open(self, stop: asyncio.Event | None = None, *, patient: bool = True) -> None:
        """Serve HTTP (if configured), connect and register. ``patient``: wait out an
        unreachable database (until ``stop`` is set), as ``slotcron run`` does; else raise
        :class:`DatabaseUnreachable` at the first failure to reach it."""
        tracing.install()  # when the OTEL_* variables ask for traces
        if self.http is not None:
            # First: the probes answer (/readyz 503) while the database is waited out.
            await self.http.start()
        try:
            await self._connect(stop, patient)
        except BaseException:
            if self.http is not None:
                await self.http.stop()
            raise

    async def begin(self) -> None:
        """Start firing: the planners and the background roles."""
        self.state = InstanceState.RUNNING
        await self.alerts.start()
        # Join the members (our row says we are alive now: registering thousands of jobs can
        # take longer than the others' silence limit), then plan only this instance's share.
        await self.membership.refresh()
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
        memory.give_back()  # start-up's temporaries (slotcron.service.memory)

    async def _connect(self, stop: asyncio.Event | None, patient: bool) -> None:
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
                if not patient:
                    raise DatabaseUnreachable(where(self.settings.url), describe(exc)) from None
                if stop is not None and stop.is_set():
                    raise
                log.debug("start-up retry in %.1f s: %s", backoff.delay, describe(exc))
                await backoff.wait()
        self.outage.recovered()

    async def stop(self, signals: Signals | None = None) -> None:
        """Shut down in phases (:mod:`slotcron.service.shutdown`); a hurry asked of
        ``signals`` (default: this service's own) skips the drain."""
        await shut_down(self, (signals or self.signals).hurry)
