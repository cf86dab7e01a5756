"""The heartbeat: one batched renewal of every lease this instance holds.

A confirmed renewal moves each run's deadline to (when it was sent + the lease - a margin); a
run the database no longer counts as ours (its lease lapsed: a renewal never revives one; or
another instance recorded it) is fenced at once. A renewal that fails or hangs changes nothing:
time fences the runs it could not renew (:mod:`slotcron.lifeline.fencing`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from slotcron.clock import DatabaseClock
from slotcron.lifeline.inflight import CancelReason, Runs, trusted_until
from slotcron.lifeline.outage import DB_ERRORS, resume_cancellation
from slotcron.lifeline.roles import Collaborators, Role
from slotcron.store import runs as run_store
from slotcron.store.runs import IncarnationLost

log = logging.getLogger("slotcron.heartbeat")

CLOCK_SYNC_SECONDS = 300.0
READ_ONLY_RETRY_SECONDS = 1.0
"""How often a renewal is tried while the database refuses writes as read-only."""
RENEWAL_TIMEOUT_MIN = 1.0
"""Seconds a renewal may take at the least before it is given up."""


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
        self.incarnation: str | None = None
        """This process's hold on the instance id (set once it holds it): a renewal checks the
        instance row still names it."""
        self.id_taken = False
        """True once another process took the instance id over."""
        self.on_id_taken: Callable[[], None] = lambda: None
        self.judging_elsewhere: Callable[[], bool] = lambda: False
        """True while another part judges whether the runs are still ours (the reconnection
        check after an outage, which can say why): runs the renewal did not find are left to it
        meanwhile (time fences them if it cannot judge)."""
        """Called once, when the instance id is found held by another process (the service
        shuts down then, and exits 1)."""
        self.on_reshare: Callable[[], None] | None = None
        """Called when the renewal found the instance row's ``reshare`` flag set (an instance
        joined this one's members: :mod:`slotcron.lifeline.membership`); None: not watched."""

    async def run(self) -> None:
        while True:
            # With no run in flight only the instance row is renewed, and every other period
            # is enough (it is judged silent after a whole lease): a run claimed meanwhile has
            # a lease of at least four periods, and is renewed within two.
            await self.clock.sleep(self._interval())
            await self.beat()
            if isinstance(self.clock, DatabaseClock) and (
                self.clock.wall_stepped() or time.monotonic() - self._last_sync > CLOCK_SYNC_SECONDS
            ):
                self._last_sync = time.monotonic()
                try:
                    await self.clock.sync(samples=4)
                except DB_ERRORS as exc:
                    resume_cancellation(exc)

    def _interval(self) -> float:
        if self.db.read_only:
            # The renewal is the write that finds the database writable again (ready again).
            return min(self.period, READ_ONLY_RETRY_SECONDS)
        return self.period if len(self.runs) else 2 * self.period

    async def beat(self) -> None:
        if self.id_taken:
            # Nothing is ours to renew any more; a run claimed since is fenced too.
            self.lose_id()
            return
        now = self.clock.now()
        # Trust starts when the renewal is sent, not when its answer comes back.
        sent = self.clock.monotonic()
        # Judge only the runs counted now: one whose claim commits while we await the renewal
        # is not in the database's answer, and is not "taken from us" for that.
        counted = list(self.runs)
        counts = self.runs.lease_counts()
        try:
            # A renewal that hangs is given up (and tried again next period on another
            # connection); the runs it could not renew are fenced by time
            # (app/slotcron/lifeline/fencing.py).
            async with asyncio.timeout(max(self.period, RENEWAL_TIMEOUT_MIN)):
                still_ours = await run_store.renew(
                    self.db,
                    instance_id=self.instance_id,
                    now=now,
                    lease_counts=counts,
                    instance_state=self.instance_state(),
                    incarnation=self.incarnation,
                    ours=[handle.claim.key for handle in counted],
                    on_reshare=self.on_reshare,
                )
        except IncarnationLost:
            self.outage.recovered()
            self.lose_id()
            return
        except DB_ERRORS as exc:
            self.outage.failed(exc, "renewing leases")
            return
        self.outage.recovered()
        self.db.wrote()
        elsewhere = self.judging_elsewhere()
        for handle in counted:
            if handle.done.is_set():
                continue  # ended while we renewed
            if still_ours is None or handle.id in still_ours:
                handle.deadline = max(handle.deadline, trusted_until(sent, handle.lease_ms))
            elif elsewhere:
                continue
            else:
                log.warning(
                    "execution %s of %s is no longer ours (its lease lapsed, or it was recorded "
                    "elsewhere); cancelling it",
                    handle.id,
                    handle.job.name,
                )
                self.runs.cancel(handle, CancelReason.FENCED)

    def lose_id(self) -> None:
        """Another process holds our instance id: this one was paused or cut off long enough
        to be judged dead, and its runs may already be ABANDONED and retried elsewhere. Every
        run of ours is fenced, now and at every later beat (renewals stay refused), and the
        service is told once, to stop claiming and shut down. Called on the event loop (the
        watchdog's thread hands its finding over with ``call_soon_threadsafe``)."""
        if not self.id_taken:
            self.id_taken = True
            log.error(
                "instance id %s is now held by another process (a newer incarnation took it "
                "over while this one was paused or cut off past its lease): fencing this "
                "process's %d runs, claiming nothing more, and shutting down to exit with "
                "status 1. Restart it (under a fresh incarnation), or give each process its own id",
                self.instance_id,
                len(self.runs),
            )
            self.on_id_taken()
        for handle in self.runs:
            if not handle.done.is_set():
                self.runs.cancel(handle, CancelReason.FENCED)


class Shedder(Role):
    """Closes the pooled connections nobody used for a while (:meth:`Database.shed_idle`), on
    its own timer: a heartbeat waiting in a pooler's queue for a connection must not keep the
    idle ones, whose closing frees the pooler's server connections, from being closed."""

    name = "connection shedder"

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.db.idle_for / 2)
            try:
                await self.db.shed_idle()
            except DB_ERRORS as exc:
                resume_cancellation(exc)
