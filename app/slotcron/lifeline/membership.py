"""Membership: which live instances share the planning of this instance's jobs.

Read from the instance rows at start-up, then every heartbeat period while the instance shares
its jobs, and within a second of a sign that the view is wrong: a claim lost to another instance
(a member this one does not know of tried the same slot), a slot taken over (a member it
believes alive did not claim it), or its ``reshare`` flag found set by its heartbeat (an
instance that joins sets it on the members' rows: :func:`slotcron.store.membership.join`).
After joining it reads again 1, 2, 4... seconds later for two heartbeat periods (members started
about the same time); then an instance alone reads nothing more: no statement while idle beyond
the heartbeat. A late read costs duplicate claim attempts or a slot taken over, never a slot run
twice. A member is live while it is ``running`` and its heartbeat is at most
:data:`SILENT_PERIODS` periods old (an idle instance heartbeats every other period). A read
that fails keeps the last view.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta

from slotcron.engine.shares import Shares
from slotcron.lifeline.outage import DB_ERRORS, resume_cancellation
from slotcron.lifeline.roles import Collaborators, Role
from slotcron.store import membership

log = logging.getLogger("slotcron.membership")

SILENT_PERIODS = 4.5
"""Heartbeat periods after which a silent member is no longer counted: an idle instance beats
every other period, and one renewal that failed or hung must not drop it (each change of view
costs a reshare; a member dead meanwhile has its slots taken over, slot by slot)."""
CHECK_SECONDS = 1.0
"""How often the signs are looked at (in memory: no statement)."""
SETTLE_FIRST = 1.0
"""Seconds after joining of the first read that finds the members started about the same time
(a deployment's instances, a blue/green overlap); then 2, 4, 8... seconds after, for two
heartbeat periods: the longest an idle member takes to find the ``reshare`` flag a later join
set. Instances started 0.5 s apart shared 100,000 schedules due 33 s later 0, 0 and 100,000:
the first one learnt of the others 31 s after they joined, when its burst was claimed."""


class Membership(Role):
    name = "membership"

    def __init__(
        self,
        shared: Collaborators,
        *,
        shares: Shares,
        jobs_digest: str,
        period: float,
        on_change: Callable[[], Awaitable[None]] | None = None,
        signs: Callable[[], int] = lambda: 0,
    ) -> None:
        super().__init__(shared)
        self.shares = shares
        self.jobs_digest = jobs_digest
        self.period = period
        self.on_change = on_change
        self.signs = signs
        """A count that grows with each sign of another member: claims lost, slots taken
        over."""
        self.reads = 0
        self.flags = 0
        """How many times the heartbeat found this instance's ``reshare`` flag set."""
        self._seen = signs()
        """The signs as of the last read."""
        self._joined = False
        """True once this instance joined the members (:func:`slotcron.store.membership.join`,
        at the first read, once it plans)."""
        self._pending = False
        """A change whose consequences could not be read (the database failed): done again at
        the next read, changed or not."""
        self._settle: list[float] = []
        """When (:func:`time.monotonic`) to read again after joining (:data:`SETTLE_FIRST`)."""

    @property
    def settling(self) -> bool:
        """Whether reads after joining are still to come (:data:`SETTLE_FIRST`)."""
        return bool(self._settle)

    def flagged(self) -> None:
        """The heartbeat found the ``reshare`` flag set: read within :data:`CHECK_SECONDS`."""
        self.flags += 1

    async def run(self) -> None:
        read_at = time.monotonic()
        while True:
            await self.clock.sleep(CHECK_SECONDS)
            signs = self.signs() + self.flags
            now = time.monotonic()
            periodic = not self.shares.alone and now - read_at >= self.period
            settling = False
            while self._settle and now >= self._settle[0]:  # one read for those past
                self._settle.pop(0)
                settling = True
            if periodic or settling or signs != self._seen or self._pending or not self._joined:
                # Kept on the instance: a sign that came while the loop restarted still counts.
                self._seen, read_at = signs, time.monotonic()
                await self.refresh()

    async def refresh(self) -> None:
        """Read the members; tell the planners when they changed."""
        alive_after = self.clock.now() - timedelta(seconds=self.period * SILENT_PERIODS)
        self.reads += 1
        try:
            if not self._joined:
                await membership.join(
                    self.db,
                    jobs_digest=self.jobs_digest,
                    instance_id=self.instance_id,
                    now=self.clock.now(),
                )
                self._settle = _settle_reads(time.monotonic(), 2 * self.period)
            self._joined = True
            found = await membership.members(
                self.db, jobs_digest=self.jobs_digest, alive_after=alive_after
            )
        except DB_ERRORS as exc:
            resume_cancellation(exc)
            return
        changed = self.shares.update(found)
        if changed:
            log.info(
                "%d instance%s share the planning of this instance's jobs: %s",
                len(self.shares.members),
                "" if len(self.shares.members) == 1 else "s",
                ", ".join(self.shares.members),
            )
        if (changed or self._pending) and self.on_change is not None:
            self._pending = True
            try:
                await self.on_change()
            except DB_ERRORS as exc:
                resume_cancellation(exc)
                return
            self._pending = False


def _settle_reads(joined: float, until: float) -> list[float]:
    """The moments after joining (at ``joined``) to read the members again: 1, 2, 4... seconds
    after, within ``until`` seconds."""
    reads, after = [], SETTLE_FIRST
    while after < until:
        reads.append(joined + after)
        after *= 2
    return reads
