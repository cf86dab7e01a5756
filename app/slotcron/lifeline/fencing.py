"""Fencing by time: a run past its deadline is cancelled on its own instance.

Whether the renewal failed, hung, or the whole process was paused, a run whose last confirmed
renewal is older than its lease (less a margin) stops here first, before any other instance can
judge its lease lapsed and run the slot again (docs/explanation/guarantees.md, guarantee 7).
The database's answers only ever *extend* a deadline (:mod:`slotcron.lifeline.heartbeat`);
nothing but time shortens it.
"""

from __future__ import annotations

import logging

from slotcron.lifeline.inflight import CancelReason, Runs, margin
from slotcron.lifeline.roles import Collaborators, Role

log = logging.getLogger("slotcron.heartbeat")

TICK = 0.05
"""The shortest wait between two looks at the deadlines (none while idle)."""
REST = 0.25
"""The longest: a run claimed meanwhile is looked at within this."""


class Fencing(Role):
    name = "fencing"

    def __init__(self, shared: Collaborators, *, runs: Runs) -> None:
        super().__init__(shared)
        self.runs = runs
        self._earliest = float("inf")

    async def run(self) -> None:
        while True:
            await self.runs.wait_busy()
            self.fence_expired()
            # Deadlines only move later: look again at the earliest one, but within REST at
            # most (a run claimed meanwhile may have an earlier one).
            wait = self._earliest - self.clock.monotonic()
            await self.clock.sleep(min(max(wait, TICK), REST))

    def fence_expired(self) -> int:
        """Cancel every run past its deadline; return how many."""
        now = self.clock.monotonic()
        # Deadlines only move later: none has passed while the earliest one seen (or added
        # since) has not. A look at every run costs ~1 us each, and a burst holds 100,000.
        self._earliest = min(self._earliest, self.runs.earliest_added())
        if now < self._earliest:
            return 0
        fenced = 0
        self._earliest = float("inf")
        for handle in self.runs:
            if handle.cancel_reason is None and not handle.finishing:
                self._earliest = min(self._earliest, handle.deadline)
            if handle.deadline <= now and handle.cancel_reason is None and not handle.finishing:
                log.warning(
                    "execution %s of %s is fenced: its lease was last confirmed %.1f s ago "
                    "(lease %.1f s); cancelling it before another instance can take the slot",
                    handle.id,
                    handle.job.name,
                    now - handle.deadline + handle.lease_ms / 1000 - margin(handle.lease_ms),
                    handle.lease_ms / 1000,
                )
                self.runs.cancel(handle, CancelReason.FENCED)
                fenced += 1
        return fenced
