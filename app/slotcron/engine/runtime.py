"""Firing runtime schedules: an instance holds in memory only the schedules due within its
horizon, whatever the number of schedules in the database.

- :class:`ScheduledJob`: a schedule as the firing path sees a job: named by the schedule's id,
  running its task's function with the schedule's params under ``ctx.params`` (a manual
  trigger's merged over them), with the task's options as stored in the row.
- :class:`JobSchedules`: every job's schedule by name for the firing path, code jobs' in a
  plain dict (their lookups stay a dict's), runtime schedules' while anything holds them.
- :class:`RuntimePlanner`: the planner's heap and wake-up
(:class:`slotcron.engine.planner.Planner`), for
  schedules: an entry whose schedule was removed or replaced since it was pushed is dropped
  when it comes up, and a schedule's next slot re-enters the heap only if it is within the
  horizon; otherwise it is forgotten until the loader finds it again.
- :class:`Runtime`: the loader. Every ``horizon / 2`` one range read on the ``next_slot_at``
  index (paged) loads the schedules due within the horizon (overdue ones included: they go
  through their misfire policy). A write that touches a slot soon is taken in within a second:
  on PostgreSQL at once by its notification (the removed id is dropped, the updated id read
  again, an add sends a range read); elsewhere, or while the listener is lost, by polling the
  change token once a second (one primary-key read) and reading the horizon again when it moves.

A schedule's claim is a job's claim: the row lock, the high-water mark and the unique slot make
each slot once across the cluster; a claim that finds the row gone (removed) decides nothing.

A row that cannot be read (:func:`slotcron.jobs.schedules.read_row`: broken by a writer outside
slotcron)
is quarantined: logged once at WARNING with its id and why, never fired, counted
(:attr:`Runtime.quarantined`), and read again at each refresh until a write mends it or removes
it. Every other schedule fires as if it were not there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from typing import Any

from slotcron.clock import Clock
from slotcron.engine.burst import LEAD_BASE, LEAD_MAX, Burst
from slotcron.engine.firing import Firing
from slotcron.engine.planner import Planner
from slotcron.jobs.context import JobContext
from slotcron.jobs.misfire import MAX_GRACE
from slotcron.jobs.registry import Job, JobFunc
from slotcron.jobs.schedules import ScheduleSpec, UnreadableSpec, read_row, stored_options
from slotcron.lifeline.outage import DB_ERRORS
from slotcron.lifeline.roles import Collaborators, Role
from slotcron.observe import alerts
from slotcron.schedule.slots import Schedule
from slotcron.store import due as due_store
from slotcron.store.dialects import Listening
from slotcron.store.schedules import CHANGES_ROW, CHANNEL

log = logging.getLogger("slotcron.schedules")

HORIZON = timedelta(seconds=60)
"""How far ahead an instance holds schedules in memory. Below the writers' announcement window
(:data:`slotcron.store.schedules.ANNOUNCE_WITHIN`): a write further ahead needs no word."""
POLL_SECONDS = 1.0
"""How often an instance without notifications looks at the change token."""
PREPARE_COST = 200e-6
"""Seconds per runtime schedule's slot due together, to claim it and prepare its run ahead
(a claim's share of its chunk, its run's task and context), until the burst measures its own.
Measured on 2-core machines, PostgreSQL on loopback, 100,000 at once: 150 us on one; 188 us
on another (2026-11-24), where a lead of 15 s left the last claims 5 s after the slot, and
20 s (this figure, at the horizon's third) finished them 2.4 s before it."""
DEFER_REFRESH_SECONDS = 15.0
"""How long a horizon refresh waits, at most, for a burst being claimed: reading again the
100,000 schedules of a burst while it is claimed took the CPU its claims needed."""
DEFER_POLL_SECONDS = 0.25
"""How often a deferred refresh looks whether the burst is claimed."""
UNKNOWN_EVERY_SECONDS = 300.0
"""How often an instance looks for schedules of tasks no live instance registers."""
_FIELDS = tuple(f.name for f in fields(Job))


@dataclass(frozen=True, eq=False)
class ScheduledJob(Job):
    """A runtime schedule as a job: ``name`` is its id. ``version`` is the row's ``updated_at``
    (a new one replaces what is held); ``plan`` its slots; ``mark`` the version its claims
    present (:func:`slotcron.store.schedules.version_mark`; "" for a row written before marks, which
    is refused once a write gives it one)."""

    plan: Schedule | None = None
    version: datetime | None = None
    task: str = ""
    mark: str = ""


def _with_params(task: Job, params: dict[str, Any]) -> JobFunc:
    """The task's function, seeing the schedule's ``params`` under a manual trigger's."""
    if not params and task.takes_context:
        return task.func  # nothing to merge: one coroutine less per run

    async def run(ctx: JobContext) -> None:
        ctx.params = {**params, **ctx.params}
        await (task.func(ctx) if task.takes_context else task.func())

    return run


_TEMPLATES: dict[int, tuple[Job, dict[str, Any]]] = {}
"""Per task (by identity), the field values its schedules' jobs start from."""


def _template(task: Job) -> dict[str, Any]:
    held = _TEMPLATES.get(id(task))
    if held is None or held[0] is not task:
        values = {name: getattr(task, name) for name in _FIELDS}
        values.update(plan=None, version=None, task="", mark="")
        # Every field a job is read by, since the job is filled in place (scheduled_job).
        assert values.keys() == {f.name for f in fields(ScheduledJob)}
        held = _TEMPLATES[id(task)] = (task, values)
    return held[1]


def scheduled_job(row: Any, task: Job, spec: ScheduleSpec | None = None) -> ScheduledJob:
    """The job of a schedule's row (:func:`slotcron.store.due.by_ids`), read as ``spec`` (default:
    :func:`slotcron.jobs.schedules.read_row`; ValueError if the row cannot be read), whose task is
    ``task``: the task's options as stored with the row (every instance runs it alike;
    ``alert`` among them), its own jitter when it has one."""
    if spec is None:
        spec = read_row(row)
    if isinstance(spec, UnreadableSpec):
        raise ValueError(f"schedule {spec.id!r} cannot be read: {spec.error}")
    values = dict(_template(task))
    values.update(stored_options(spec.id, row.options))
    if spec.jitter is not None:
        values["jitter"] = spec.jitter
    values.update(
        name=spec.id,
        func=_with_params(task, spec.params),
        kind=spec.kind,
        expression=spec.expression,
        timezone=spec.timezone,
        takes_context=True,
    )
    values.update(version=row.updated_at, task=spec.task, mark=row.fingerprint or "")
    # Filled in place, not through the frozen dataclass's __init__ (a guarded setattr per
    # field): every field is in ``values``, from a registered task and a row read through the
    # checks of a write; building the jobs was a third of loading 100,000 schedules.
    job = object.__new__(ScheduledJob)
    job.__dict__.update(values)
    # Its plan set on the new object, not by ``replace``: building a job twice was most of
    # loading 100,000 schedules. (Cron plans are shared by expression:
    # slotcron.schedule.slots.shared.)
    job.__dict__["plan"] = job.schedule()
    return job


class JobSchedules(dict[str, Schedule]):
    """Every job's schedule by name: code jobs' as dict entries (looked up at a dict's speed),
    runtime schedules' found on a miss, while anything (the heap, a claim, a run) holds their
    :class:`ScheduledJob`: nothing here keeps a schedule in memory."""

    def __init__(self, code: dict[str, Schedule]) -> None:
        super().__init__(code)
        self._held: weakref.WeakValueDictionary[str, ScheduledJob] = weakref.WeakValueDictionary()

    def hold(self, job: ScheduledJob) -> None:
        self._held[job.name] = job

    def held(self, name: str) -> ScheduledJob | None:
        return self._held.get(name)

    def __missing__(self, name: str) -> Schedule:
        job = self._held.get(name)
        if job is None or job.plan is None:
            raise KeyError(name)
        return job.plan


class AlertFlags(dict[str, bool]):
    """Whether each job's events go to the alert webhook, by name, as the alert sender reads it
    (``.get(name, True)``): code jobs' as entries; a runtime schedule's from its job while
    anything holds it (a run, a claim: whenever one of its events is sent), which carries its
    task's ``alert`` option. Nothing here grows with the number of schedules."""

    def __init__(self, code: dict[str, bool], schedules: JobSchedules) -> None:
        super().__init__(code)
        self._schedules = schedules

    def get(self, name: str, default: Any = None) -> Any:
        if name in self:
            return self[name]
        job = self._schedules.held(name)
        return job.alert if job is not None else default


class RuntimePlanner(Planner):
    """The planner for runtime schedules: its own heap, holding the schedules due within the
    horizon (:attr:`current`, one version of each)."""

    name = "schedules planner"

    def __init__(
        self,
        schedules: JobSchedules,
        *,
        clock: Clock,
        firing: Firing,
        burst: Burst,
        horizon: timedelta = HORIZON,
    ) -> None:
        super().__init__([], schedules, clock=clock, firing=firing, burst=burst)
        self.horizon = horizon
        self.current: dict[str, ScheduledJob] = {}
        self.popped: dict[str, datetime] = {}
        """Each schedule's last slot taken from the heap: a row still showing it (its claim not
        yet committed) is not loaded again."""

    def admit(self, job: ScheduledJob, slot: datetime) -> None:
        """Hold ``job`` (new, or a new version of a schedule held) from ``slot``."""
        self.current[job.name] = job
        self._push_and_wake(job, slot)

    def drop(self, name: str) -> None:
        """Forget a schedule: its entry in the heap goes stale, and is dropped when it comes up."""
        self.current.pop(name, None)

    def _keeps(self, job: Job, slot: datetime) -> bool:
        if self.current.get(job.name) is not job:
            return False
        self.popped[job.name] = slot
        return True

    def _push(self, job: Job, slot: datetime) -> None:
        if self.current.get(job.name) is not job:
            return  # removed or replaced meanwhile
        if slot >= self.clock.now() + self.horizon:
            del self.current[job.name]  # the loader finds it again when it comes near
            return
        super()._push(job, slot)

    def _lead(self) -> timedelta:
        """Slots due together are claimed ahead as a job's are, but past
        :data:`slotcron.engine.burst.LEAD_MAX` by what claiming and preparing a schedule's run
        costs each
        (:data:`PREPARE_COST`, or the burst's measure when higher): a schedule's slots are
        known a horizon ahead, and a burst of 100,000 takes seconds to claim. At most a third
        of the horizon (and half a period: the burst's own rule)."""
        lead = super()._lead()
        if lead < timedelta(seconds=LEAD_MAX) or not self._heap:
            return lead
        slot, _, job = self._heap[0]
        period = self._schedules[job.name].next_after(slot) - slot
        each = max(PREPARE_COST, self.burst.claim_cost)
        wanted = timedelta(seconds=LEAD_BASE + self._at_slot[slot] * each)
        return min(wanted, self.horizon / 3, period / 2)

    def forget_popped(self, before: datetime) -> None:
        for name in [n for n, slot in self.popped.items() if slot < before]:
            del self.popped[name]


class Runtime(Role):
    """The loader of runtime schedules (see the module's docstring)."""

    name = "schedules"

    def __init__(
        self,
        shared: Collaborators,
        *,
        tasks: Sequence[Job],
        planner: RuntimePlanner,
        schedules: JobSchedules,
        pool_size: int = 10,
        lease: float = 60.0,
    ) -> None:
        super().__init__(shared)
        self.tasks = {t.name: t for t in tasks if t.enabled}
        self.planner = planner
        self.schedules = schedules
        self.horizon = planner.horizon
        self.lease = lease
        self.refresh_every = self.horizon.total_seconds() / 2
        self._wake = asyncio.Event()
        self._reread: set[str] = set()
        self._refresh_due = True
        self._token: str | None = None
        self._listening: Listening | None = None
        # A listener takes a pooled connection: only where the pool can spare it (the queued
        # runs' listener takes another).
        self._may_listen = pool_size >= 3
        self._refreshed_at = 0.0
        self._deferred_since: float | None = None
        self._unknown_at: float | None = None
        self._reported: set[str] = set()
        self.loaded = 0
        """Schedules loaded into memory since start (for tests and benchmarks)."""
        self.unreadable: dict[str, str] = {}
        """Schedules due within the horizon whose row cannot be read, by id: why. Not fired."""
        self._warned: dict[str, str] = {}
        """What was logged of each unreadable row: each problem once, until the row is mended
        or removed."""

    @property
    def quarantined(self) -> int:
        """How many schedules due within the horizon are quarantined now (their rows cannot be
        read): the figure for a gauge."""
        return len(self.unreadable)

    @property
    def listening(self) -> bool:
        return self._listening is not None and self._listening.alive

    async def stopped(self) -> None:
        if self._listening is not None:
            await self._listening.close()
            self._listening = None

    def _alert_flags(self) -> None:
        """Let the alert sender see the ``alert`` option of schedules' tasks (``@task(alert=
        False)``): it knows code jobs' only (:class:`AlertFlags`)."""
        sender = alerts.of(self.instance_id)
        flags = getattr(sender, "alerting", None)
        if isinstance(flags, dict) and not isinstance(flags, AlertFlags):
            sender.alerting = AlertFlags(flags, self.schedules)  # type: ignore[attr-defined]

    async def run(self) -> None:
        self._alert_flags()
        while not self.tasks:  # nothing to fire here: only report what no instance fires
            try:
                await self._report_unknown()
            except DB_ERRORS as exc:
                self.outage.failed(exc, "looking for schedules no instance fires")
            await asyncio.sleep(UNKNOWN_EVERY_SECONDS)
        while True:
            if self._may_listen and await self._listen():
                self._refresh_due = True  # something may have changed unheard
            timeout = self.refresh_every - (time.monotonic() - self._refreshed_at)
            if not self.listening:
                timeout = min(timeout, POLL_SECONDS)
            if not self._refresh_due and not self._reread:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(timeout, 0)):
                        await self._wake.wait()
            self._wake.clear()
            try:
                await self.step()
            except DB_ERRORS as exc:
                self.outage.failed(exc, "loading the schedules due soon")
                await asyncio.sleep(POLL_SECONDS)
            else:
                self.outage.recovered()

    async def step(self) -> None:
        """One round: read again what changed, or the whole horizon when it is time."""
        if not self.listening and not self._refresh_due:
            token = await due_store.change_token(self.db, CHANGES_ROW)
            if token != self._token:
                self._token = token
                self._refresh_due = True
        if time.monotonic() - self._refreshed_at >= self.refresh_every and not self._refresh_due:
            # Only the timer asks (no write was heard of): a burst being claimed goes first.
            if self._defer_refresh():
                await asyncio.sleep(DEFER_POLL_SECONDS)
            else:
                self._refresh_due = True
        if self._refresh_due:
            self._deferred_since = None
            self._refresh_due = False
            self._reread.clear()
            await self.refresh()
        elif self._reread:
            ids, self._reread = sorted(self._reread), set()
            rows = await due_store.by_ids(self.db, ids)
            now = self.clock.now()
            for name in ids:
                self._apply(name, rows.get(name), now)
        await self._report_unknown()

    def _defer_refresh(self) -> bool:
        """Whether the periodic refresh waits: while a burst is being claimed, for at most
        :data:`DEFER_REFRESH_SECONDS` (a refresh asked for by a write never waits)."""
        if not self.planner.burst.claiming:
            return False
        now = time.monotonic()
        if self._deferred_since is None:
            self._deferred_since = now
        return now - self._deferred_since < DEFER_REFRESH_SECONDS

    async def refresh(self) -> None:
        """Load every schedule due within the horizon that is not held yet (or held in an older
        version); read again by id those held that the range did not return (removed, or
        moved out of the horizon)."""
        if self._token is None and not self.listening:
            self._token = await due_store.change_token(self.db, CHANGES_ROW)
        self._refreshed_at = time.monotonic()
        now = self.clock.now()
        seen: set[str] = set()
        async for rows in due_store.due_before(self.db, list(self.tasks), now + self.horizon):
            wanted = []
            for row in rows:
                seen.add(row.name)
                if self._stale(row.name, row, now):
                    wanted.append(row.name)
            # New, or changed: their whole rows, a thousand at a time (a page holds 20,000,
            # and building their jobs in one go would hold the loop for half a second).
            for start in range(0, len(wanted), due_store.CHUNK):
                some = wanted[start : start + due_store.CHUNK]
                full = await due_store.by_ids(self.db, some)
                for name in some:
                    self._apply(name, full.get(name), now)
        missing = [name for name in self.planner.current if name not in seen]
        if missing:
            rows_by_id = await due_store.by_ids(self.db, missing)
            for name in missing:
                self._apply(name, rows_by_id.get(name), now)
        for name in [n for n in self.unreadable if n not in seen]:
            del self.unreadable[name]  # removed, or moved past the horizon by a write
        self.planner.forget_popped(now - 2 * self.horizon - MAX_GRACE)

    def _stale(self, name: str, row: Any, now: datetime) -> bool:
        """Whether what is held of schedule ``name`` must be built again from its row (None:
        removed; else at least ``task``, ``updated_at``, ``next_slot_at`` and ``fingerprint``):
        dropped here if the row says it is no longer to be held."""
        planner = self.planner
        held = planner.current.get(name)
        if row is None or row.task not in self.tasks or row.next_slot_at is None:
            planner.drop(name)
            self.unreadable.pop(name, None)
            self._warned.pop(name, None)
            return False
        version = (row.updated_at, row.fingerprint or "")
        if held is not None and (held.version, held.mark) == version:
            return False
        slot: datetime = row.next_slot_at
        if slot >= now + self.horizon:
            planner.drop(name)
            return False
        popped = planner.popped.get(name)
        # A popped slot not yet closed in its row: its claim has not committed yet (the slot
        # is being decided).
        return not (held is None and popped is not None and slot <= popped)

    def _apply(self, name: str, row: Any, now: datetime) -> None:
        """Bring what is held of schedule ``name`` in line with its row (None: removed)."""
        if not self._stale(name, row, now):
            return
        job = self._job(row, self.tasks[row.task])
        if job is None:
            self.planner.drop(name)
            return
        self.schedules.hold(job)
        self.planner.admit(job, row.next_slot_at)
        self.loaded += 1

    def _job(self, row: Any, task: Job) -> ScheduledJob | None:
        """The job of a schedule's row, or None when the row cannot be read: quarantined (logged
        once, counted), while every other schedule goes on."""
        spec = read_row(row)
        if isinstance(spec, UnreadableSpec):
            if self._warned.get(spec.id) != spec.error:
                self._warned[spec.id] = spec.error
                log.warning(
                    "schedule %r cannot be read and is not fired until a write mends it or "
                    "removes it (the other schedules fire as usual): %s",
                    spec.id,
                    spec.error,
                    extra={"job": spec.id, "quarantined": spec.error},
                )
            self.unreadable[spec.id] = spec.error
            return None
        self.unreadable.pop(spec.id, None)
        if self._warned.pop(spec.id, None) is not None:
            log.info("schedule %r can be read again: it fires from its next slot", spec.id)
        return scheduled_job(row, task, spec)

    def reread(self, names: list[str]) -> None:
        """Read these schedules again by id: a claim of one was refused for presenting a version
        another write has replaced (its announcement not heard yet, or lost)."""
        self._reread.update(names)
        self._wake.set()

    async def resolve(self, name: str) -> Job | None:
        """The job of schedule ``name`` if its task is registered here (a queued run of a
        schedule not held in memory: a manual trigger, a retry); None otherwise."""
        job = self.schedules.held(name)
        if job is not None:
            return job
        row = (await due_store.by_ids(self.db, [name])).get(name)
        task = self.tasks.get(row.task) if row is not None else None
        if task is None:
            return None
        job = self._job(row, task)
        if job is not None:
            self.schedules.hold(job)
        return job

    def _notified(self, payload: str) -> None:
        """A schedule write committed (PostgreSQL): ``add <slot>``, ``update <id> <slot>``,
        ``remove <id>``; an empty payload means the listening connection was lost."""
        what, _, rest = payload.partition(" ")
        if what == "remove":
            self.planner.drop(rest)
        elif what == "update":
            self._reread.add(rest.rpartition(" ")[0])
        elif what == "add":
            with contextlib.suppress(ValueError):
                if datetime.fromisoformat(rest) >= self.clock.now() + self.horizon:
                    return  # found by a range read before it is due
            self._refresh_due = True
        else:
            self._refresh_due = True
        self._wake.set()

    async def _listen(self) -> bool:
        """Listen for schedule writes if possible; True when a new listener started."""
        if self.listening:
            return False
        if self._listening is not None:
            await self._listening.close()
            self._listening = None
            log.info("lost the connection listening for schedule writes: polling until it is back")
        try:
            self._listening = await self.db.dialect.listen(self.db.engine, CHANNEL, self._notified)
        except DB_ERRORS:
            return False
        return self._listening is not None

    async def _report_unknown(self) -> None:
        """Warn once per task about schedules whose task no live instance registers: their slots
        wait, and are decided by their misfire policy once an instance that has the task
        starts."""
        if self._unknown_at is not None and (
            time.monotonic() - self._unknown_at < UNKNOWN_EVERY_SECONDS
        ):
            return
        self._unknown_at = time.monotonic()
        others = [
            t
            for t in await due_store.tasks_with_schedules(self.db)
            if t not in self.tasks and t not in self._reported
        ]
        if not others:
            return
        since = self.clock.now() - timedelta(seconds=self.lease)
        live = await due_store.live_tasks(self.db, others, alive_since=since)
        for task in others:
            if task not in live:
                self._reported.add(task)
                log.warning(
                    "schedules of task %r are not fired: no live instance registers it (this "
                    "one does not); their slots wait, and are decided by the task's misfire "
                    "policy once an instance that registers it starts",
                    task,
                )
