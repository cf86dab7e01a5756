"""The heartbeat: one batched renewal of every lease this instance holds, and self-fencing.

A run whose lease this instance could not renew before it lapsed is cancelled locally: by then
the cluster may have declared it ABANDONED and run the slot again elsewhere.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from datetime import timedelta

from app.clock import DatabaseClock
from app.inflight import CancelReason, Runs
from app.outage import DB_ERRORS
from app.roles import Collaborators, Role
from app.store import runs as run_store

log = logging.getLogger("slotcron.heartbeat")

CLOCK_SYNC_SECONDS = 300.0


class Heartbeat(Role):
    name = "heartbeat"

    def __init__(
        self,
        shared: Collaborators,
        *,
        runs: Runs,
        period: float,
        instance_state: Callable[[], str],
    ) -> None:
        super().__init__(shared)
        self.runs = runs
        self.period = period
        self.instance_state = instance_state
        self._last_sync = time.monotonic()

    async def run(self) -> None:
        while True:
            # With no run in flight only the instance row is renewed, and every other period
            # is enough (it is judged silent after a whole lease): a run claimed meanwhile has
            # a lease of at least four periods, and is renewed within two.
            await self.clock.sleep(self.period if len(self.runs) else 2 * self.period)
            await self.beat()
            if (
                isinstance(self.clock, DatabaseClock)
                and time.monotonic() - self._last_sync > CLOCK_SYNC_SECONDS
            ):
                self._last_sync = time.monotonic()
                with contextlib.suppress(*DB_ERRORS):
                    await self.clock.sync(samples=4)

    async def beat(self) -> None:
        now = self.clock.now()
        # Judge only the runs counted now: one whose claim commits while we await the renewal
        # is not in the database's answer, and is not "taken from us" for that.
        counted = list(self.runs)
        counts = self.runs.lease_counts()
        try:
            still_ours = await run_store.renew(
                self.db,
                instance_id=self.instance_id,
                now=now,
                lease_counts=counts,
                instance_state=self.instance_state(),
            )
        except DB_ERRORS as exc:
            self.outage.failed(exc, "renewing leases")
            # Fence what will lapse before the next chance to renew, not only what already has.
            self.fence_lapsed(margin=self.period)
            return
        self.outage.recovered()
        for handle in counted:
            if handle.done.is_set():
                continue  # ended while we renewed
            if still_ours is None or handle.id in still_ours:
                handle.deadline = max(
                    handle.deadline, now + timedelta(milliseconds=handle.lease_ms)
                )
            else:
                log.warning(
                    "execution %s of %s is no longer ours (recorded elsewhere); cancelling it",
                    handle.id,
                    handle.job.name,
                )
                self.runs.cancel(handle, CancelReason.FENCED)

    def fence_lapsed(self, margin: float = 0.0) -> None:
        """Cancel every run whose lease lapses within ``margin`` seconds without renewal."""
        horizon = self.clock.now() + timedelta(seconds=margin)
        for handle in self.runs:
            if handle.deadline <= horizon and handle.cancel_reason is None:
                log.warning(
                    "lease of execution %s (%s) lapses at %s and cannot be renewed; cancelling it",
                    handle.id,
                    handle.job.name,
                    handle.deadline.isoformat(),
                )
                self.runs.cancel(handle, CancelReason.FENCED)
