"""The leader: one instance at a time does cluster housekeeping.

Leadership is an optimisation of who does housekeeping, never a condition for firing: every
instance claims slots whether it leads or not. The leader marks runs whose lease lapsed
ABANDONED (queuing their retry when attempts remain), has slots that nobody decided in time
(an outage, every instance down) put through their job's misfire policy, records silent
instances stopped, and prunes history past retention.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from app.clock import Clock
from app.outage import DB_ERRORS, Outage
from app.scheduler import MAX_GRACE
from app.store import leadership, lifeline, registrations, retention
from app.store.database import Database

log = logging.getLogger("slotcron.leader")


class Leader:
    def __init__(
        self,
        *,
        db: Database,
        clock: Clock,
        instance_id: str,
        lease: float,
        period: float,
        outage: Outage,
        reconcile: Callable[[str, datetime], bool] = lambda _name, _expected: False,
        retention_days: float = 30,
    ) -> None:
        self.outage = outage
        self.retention = timedelta(days=retention_days)
        self.reconcile = reconcile
        self._unknown: set[str] = set()
        self.db = db
        self.clock = clock
        self.instance_id = instance_id
        self.lease = lease
        self.period = period
        self.leading = False
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="slotcron-leader")

    async def stop(self) -> None:
        """Stop, and resign so another instance takes over without waiting out the lease."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.leading:
            with contextlib.suppress(*DB_ERRORS):
                await leadership.resign(self.db, instance_id=self.instance_id)
                log.info("resigned leadership")
            self.leading = False

    async def _loop(self) -> None:
        while True:
            try:
                await self.tick()
            except DB_ERRORS as exc:
                self.outage.failed(exc, "doing cluster housekeeping")
            else:
                self.outage.recovered()
            await self.clock.sleep(self.period)

    async def tick(self) -> None:
        now = self.clock.now()
        leading = await leadership.acquire_or_renew(
            self.db, instance_id=self.instance_id, now=now, lease=self.lease
        )
        if leading != self.leading:
            log.info("%s leadership", "took" if leading else "lost")
            self.leading = leading
        if not leading:
            return
        for run in await lifeline.abandon_lapsed(self.db, now=now):
            log.warning(
                "execution %s of %s (slot %s) ABANDONED: instance %s let its lease lapse at %s%s",
                run.execution_id,
                run.job_name,
                run.scheduled_at.isoformat(),
                run.instance_id,
                run.lease_until.isoformat(),
                f"; retry queued as {run.retry_id}" if run.retry_id else "",
            )
        pruned = await retention.prune(self.db, before=now - self.retention)
        if pruned:
            log.info("pruned %d executions older than %s", pruned, self.retention)
        silent = await registrations.mark_silent_instances(
            self.db, before=now - timedelta(seconds=self.lease)
        )
        if silent:
            log.warning(
                "instances silent for over a lease, recorded stopped: %s", ", ".join(silent)
            )
        # Claims give up at most MAX_GRACE after a slot: an expected slot older than that was
        # left undecided by everyone.
        for name, expected in await registrations.overdue_jobs(self.db, before=now - MAX_GRACE):
            if not self.reconcile(name, expected) and name not in self._unknown:
                self._unknown.add(name)
                log.warning(
                    "%s has slots undecided since %s, but this instance does not have the job: "
                    "an instance that has it will decide them at its next claim",
                    name,
                    expected.isoformat(),
                )
