"""Firing runtime schedules: an instance holds in memory only the schedules due within its
horizon, whatever the number of schedules in the database.

A schedule is fired as a job (:class:`slotcron.engine.scheduled.ScheduledJob`, its schedule
found by name in :class:`slotcron.engine.scheduled.JobSchedules`).

- :class:`slotcron.engine.horizon.RuntimePlanner`: the heap of the schedules due within the
  horizon.
- :class:`Runtime`: the loader. Every ``horizon / 2`` one range read on the ``next_slot_at``
  index (paged) loads the schedules due within the horizon (overdue ones included: they go
  through their misfire policy). A write that touches a slot soon is taken in within a second:
  on PostgreSQL at once by its notification (the removed id is dropped, the updated id read
  again, an add sends a range read); elsewhere, or while the listener is lost, by polling the
  change token once a second (one primary-key read) and reading the horizon again when it moves.

A schedule's claim is a job's claim: the row lock, the high-water mark and the unique slot make
each slot once across the cluster; a claim that finds the row gone (removed) decides nothing.

A row that cannot be read (:func:`slotcron.jobs.schedule_rows.read_row`: broken by a writer
outside slotcron) is quarantined: logged once at WARNING with its id and why, never fired, counted
(:attr:`Runtime.quarantined`), and read again at each refresh until a write mends it or removes
it. Every other schedule fires as if it were not there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from slotcron.engine.horizon import RuntimePlanner
from slotcron.engine.scheduled import JobSchedules, ScheduledJob, scheduled_job
from slotcron.engine.shares import Shares
from slotcron.jobs.misfire import MAX_GRACE
from slotcron.jobs.registry import Job
from slotcron.jobs.schedule_rows import read_row
from slotcron.jobs.schedules import UnreadableSpec
from slotcron.lifeline.outage import DB_ERRORS
from slotcron.lifeline.roles import Collaborators, Role
from slotcron.store import due as due_store
from slotcron.store.dialects import Listening
from slotcron.store.schedules import CHANGES_ROW, CHANNEL

__all__ = ["JobSchedules", "Runtime", "RuntimePlanner", "ScheduledJob", "scheduled_job"]

log = logging.getLogger("slotcron.schedules")

POLL_SECONDS = 1.0
"""How often an instance without notifications looks at the change token."""
DEFER_REFRESH_SECONDS = 15.0
"""How long a horizon refresh waits, at most, for a burst being claimed: reading again the
100,000 schedules of a burst while it is claimed took the CPU its claims needed."""
DEFER_POLL_SECONDS = 0.25
"""How often a deferred refresh looks whether the burst is claimed."""
UNKNOWN_EVERY_SECONDS = 300.0
"""How often an instance looks for schedules of tasks no live instance registers."""


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
        shares: Shares | None = None,
    ) -> None:
        super().__init__(shared)
        self.tasks = {t.name: t for t in tasks if t.enabled}
        self.planner = planner
        self.shares = shares or planner.shares
        self._taking: set[str] = set()
        """Schedules of other members whose overdue slot is taken over here (read by id)."""
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

    async def run(self) -> None:
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
        taking = set(self._taking)  # a slot taken over during the round waits for the next
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
        # A slot not taken over by now is looked for again by the takeover.
        self._taking -= taking
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
        if name not in self._taking and not self.shares.owns_now(name):
            planner.drop(name)  # another member plans it
            return False
        version = (row.updated_at, row.fingerprint or "")
        if held is not None and (held.version, held.mark) == version:
            return name in self._taking and planner.popped.get(name) != row.next_slot_at
        slot: datetime = row.next_slot_at
        if slot >= now + self.horizon:
            planner.drop(name)
            return False
        popped = planner.popped.get(name)
        # A popped slot not yet closed in its row: its claim has not committed yet (the slot
        # is being decided).
        return not (held is None and popped is not None and slot <= popped)

    def _apply(self, name: str, row: Any, now: datetime) -> None:
        """Bring what is held of schedule ``name`` in line with its row (None: removed); or,
        for a schedule another member owns whose slot is taken over, fire that slot once."""
        taking = name in self._taking
        stale = self._stale(name, row, now)
        self._taking.discard(name)
        if not stale:
            return
        job = self._job(row, self.tasks[row.task])
        if job is None:
            self.planner.drop(name)
            return
        if taking and not self.shares.owns_now(name):
            if row.next_slot_at > now:  # its owner claimed it meanwhile
                return
            self.schedules.hold(job)
            self.planner.take(job, row.next_slot_at)
        else:
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

    def may_take(self, name: str, task: str) -> bool:
        """Whether an overdue slot of schedule ``name`` is to be taken over here: its task is
        registered here and another member owns it."""
        return task in self.tasks and not self.shares.owns_now(name)

    def take_over(self, names: list[str]) -> None:
        """Read these schedules by id and fire their overdue slot here once
        (:mod:`slotcron.engine.takeover`)."""
        if names:
            self._taking.update(names)
            self.reread(names)

    def reshare(self) -> None:
        """The members changed: read the horizon again (the schedules this instance owns now
        are loaded, those it owns no more dropped)."""
        self._refresh_due = True
        self._wake.set()

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
