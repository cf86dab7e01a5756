"""The leader: one instance at a time does cluster housekeeping.

Leadership is an optimisation of who does housekeeping, never a condition for firing: every
instance claims slots whether it leads or not. The leader marks runs whose lease lapsed
ABANDONED (queuing their retry when attempts remain), or hands them back to the queue when their
body never started (another live instance then runs the slot), has slots that nobody decided in time
(an outage, every instance down) put through their job's misfire policy, records silent
instances stopped, and prunes history past retention.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from datetime import datetime, timedelta

from slotcron.jobs.misfire import MAX_GRACE
from slotcron.lifeline.outage import DB_ERRORS
from slotcron.lifeline.roles import Collaborators, Role
from slotcron.store import housekeeping, leadership, lifeline, registrations, retention

log = logging.getLogger("slotcron.leader")

LAPSE_MARGIN = 0.02
"""Seconds after a lease's end that the leader looks: it is judged lapsed by then."""
PRUNE_EVERY_SECONDS = 3600.0
MARKERS_KEPT = timedelta(minutes=10)
"""A chunk's start marker outlives its last run in flight by at least this long."""
"""History is pruned by the hour (and at once by a new leader), not at every tick."""


class Leader(Role):
    name = "leader"

    def __init__(
        self,
        shared: Collaborators,
        *,
        lease: float,
        period: float,
        reconcile: Callable[[str, datetime], bool] = lambda _name, _expected: False,
        retention_days: float = 30,
        on_queued: Callable[[datetime], None] = lambda _when: None,
    ) -> None:
        super().__init__(shared)
        self.on_queued = on_queued
        self._next_look: datetime | None = None
        self.retention = timedelta(days=retention_days)
        self.reconcile = reconcile
        self._unknown: set[str] = set()
        self.lease = lease
        self.period = period
        self.leading = False
        self._pruned_at: float | None = None

    async def stopped(self) -> None:
        """Resign, so another instance takes over without waiting out the lease."""
        if self.leading:
            with contextlib.suppress(*DB_ERRORS):
                await leadership.resign(self.db, instance_id=self.instance_id)
                log.info("resigned leadership")
            self.leading = False

    async def run(self) -> None:
        while True:
            self._next_look = None
            try:
                await self.tick()
            except DB_ERRORS as exc:
                self.outage.failed(exc, "doing cluster housekeeping")
            else:
                self.outage.recovered()
            await self.clock.sleep(self._sleep())

    def _sleep(self) -> float:
        """Until the next tick: a period, or less when a lease this tick saw lapses sooner
        (leadership held by another, or an unstarted run's): a slot whose claimer died before
        its start is handed back as soon as its lease lapses, not up to a period later."""
        if self._next_look is None:
            return self.period
        wait = (self._next_look - self.clock.now()).total_seconds() + LAPSE_MARGIN
        return min(self.period, max(wait, LAPSE_MARGIN))

    async def tick(self) -> None:
        now = self.clock.now()
        until: datetime | None = None
        # Claims give up at most MAX_GRACE after a slot: an expected slot older than that was
        # left undecided by everyone.
        silent_before = now - timedelta(seconds=self.lease)
        overdue_before = now - MAX_GRACE
        todo: housekeeping.Pending | None = None
        if self.leading:
            # The renewal and the look at what to do: one statement where the database allows.
            todo = await housekeeping.renew_and_look(
                self.db,
                instance_id=self.instance_id,
                now=now,
                lease=self.lease,
                silent_before=silent_before,
                overdue_before=overdue_before,
            )
            leading = todo is not None
        else:
            # One read a tick while someone else leads; a write only when the lease lapsed
            # (or was resigned) and is there to take.
            holder, until = await leadership.current(self.db)
            leading = (holder == self.instance_id or until is None or until < now) and (
                await leadership.take(
                    self.db, instance_id=self.instance_id, now=now, lease=self.lease
                )
            )
        if not leading:
            self._next_look = until
        if leading != self.leading:
            log.info("%s leadership", "took" if leading else "lost")
            self.leading = leading
            self._pruned_at = None  # a new leader prunes at once
        if not leading:
            return
        if todo is None:
            todo = await housekeeping.pending(
                self.db, now=now, silent_before=silent_before, overdue_before=overdue_before
            )
        if todo.lapsed_runs:
            await self._abandon_lapsed(now)
        if todo.unstarted_runs:
            self._next_look = await lifeline.next_unstarted_lapse(self.db)
        if todo.silent_instances:
            silent = await registrations.mark_silent_instances(self.db, before=silent_before)
            if silent:
                log.warning(
                    "instances silent for over a lease, recorded stopped: %s", ", ".join(silent)
                )
        if todo.overdue_jobs:
            await self._reconcile_overdue(now)
        if self._pruned_at is None or time.monotonic() - self._pruned_at > PRUNE_EVERY_SECONDS:
            self._pruned_at = time.monotonic()
            pruned = await retention.prune(self.db, before=now - self.retention)
            await retention.prune_markers(self.db, before=now - MARKERS_KEPT)
            if pruned:
                log.info("pruned %d executions older than %s", pruned, self.retention)
                self._pruned_at = None  # more may be left: go on at the next tick

    async def _abandon_lapsed(self, now: datetime) -> None:
        found = await lifeline.abandon_lapsed(self.db, now=now)
        back = [run for run in found if run.handed_back]
        if back:
            self.on_queued(now)
            log.warning(
                "%d runs whose claiming instance let its lease lapse before their start were "
                "handed back to the queue (same slot, same attempt): %s",
                len(back),
                ", ".join(f"{run.job_name}#{run.execution_id}" for run in back[:10])
                + (" ..." if len(back) > 10 else ""),
            )
        self.events.abandoned(found)

    async def _reconcile_overdue(self, now: datetime) -> None:
        for name, expected in await registrations.overdue_jobs(self.db, before=now - MAX_GRACE):
            if not self.reconcile(name, expected) and name not in self._unknown:
                self._unknown.add(name)
                log.warning(
                    "%s has slots undecided since %s, but this instance does not have the job: "
                    "an instance that has it will decide them at its next claim",
                    name,
                    expected.isoformat(),
                )
