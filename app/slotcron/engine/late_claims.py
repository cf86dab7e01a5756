"""Late claims decided together: an instance that falls behind does not fall further behind.

A claim that committed past its slot's grace, or a run claimed ahead that found no capacity
before its grace ended, is not started as if on time
(:meth:`slotcron.engine.firing.Firing.on_time`).
Decided one transaction and one log line each, thousands of them a second were most of what an
overloaded instance did (the more it fell behind, the more it had to write): the loop was the
bottleneck, and every late claim made it more so. Here the claims found late while a write is
under way are written together by the next one (:func:`slotcron.store.late_claims.claimed_late`,
one UPDATE per reason), and each write says in one line how many it decided and how late.

A write is made in a task of its own: a caller cancelled while waiting cancels only its wait.
A database error reaches every caller of that write, each of which handles it as before (its
run not started, its lease left to lapse: the leader decides it).
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta
from typing import NamedTuple

from slotcron.clock import Clock
from slotcron.store import late_claims as late_store
from slotcron.store.claims import Claim
from slotcron.store.database import Database

log = logging.getLogger("slotcron.scheduler")

BATCH_LIMIT = 1000
SAID_ONE_BY_ONE = 5
"""Late claims in one write past which they are said in one line, not a line each."""

LATE = "claimed late"
"""A claim that committed past its slot's grace."""
NO_CAPACITY = "no capacity"
"""A run claimed ahead that found no run permit free before its slot's grace ended."""


class _Pending(NamedTuple):
    claim: Claim
    reason: str | None
    """Recorded MISSED with this reason; None: made a catch-up."""
    kind: str
    done: asyncio.Future[bool]


class LateClaims:
    """The late-claim writer of one instance."""

    def __init__(self, db: Database, clock: Clock, instance_id: str) -> None:
        self.db = db
        self.clock = clock
        self.instance_id = instance_id
        self._pending: list[_Pending] = []
        self._writer: asyncio.Task[None] | None = None
        self._late_at: datetime | None = None

    def note(self) -> None:
        """This instance decided a slot of its own late (here, or in a batch of late slots)."""
        self._late_at = self.clock.now()

    def behind(self, within: timedelta) -> bool:
        """Whether this instance decided a slot late within ``within``: it is behind, and
        taking over another member's slots would put it further behind
        (:mod:`slotcron.engine.takeover`)."""
        return self._late_at is not None and self.clock.now() - self._late_at < within

    async def decide(self, claim: Claim, missed_reason: str | None, kind: str = LATE) -> bool:
        """Record ``claim`` MISSED with ``missed_reason``, or make it a ``catchup`` run without
        one; ``kind`` (:data:`LATE`, :data:`NO_CAPACITY`) says how it came to be, for the log.
        False when the record was no longer ours. Raises what the database raised."""
        self.note()
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._pending.append(_Pending(claim, missed_reason, kind, done))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_all(), name="slotcron-late-claims")
            self._writer.add_done_callback(self._ended)
        return await done  # a cancelled waiter cancels only its own wait

    async def _write_all(self) -> None:
        batch: list[_Pending] = []
        try:
            await asyncio.sleep(0)  # the claims found late in the same turn of the loop join in
            while self._pending:
                batch = self._pending[:BATCH_LIMIT]
                del self._pending[:BATCH_LIMIT]
                try:
                    await self._write(batch)
                except Exception as exc:
                    _fail(batch, exc)
        except BaseException as exc:  # cancelled: the claims of this write (the others: _ended)
            _fail(batch, exc)
            raise

    def _ended(self, writer: asyncio.Task[None]) -> None:
        """A writer cancelled (at shutdown, before it began or within a write) makes no write
        for the claims still waiting: they are failed, not left waiting for good."""
        if writer.cancelled() and writer is self._writer:
            _fail(self._pending, asyncio.CancelledError())
            self._pending.clear()

    async def _write(self, batch: list[_Pending]) -> None:
        now = self.clock.now()
        ours = await late_store.claimed_late(
            self.db,
            [(p.claim.key, p.reason) for p in batch],
            instance_id=self.instance_id,
            now=now,
        )
        for kind in {p.kind for p in batch}:
            _say([p for p in batch if p.kind == kind and p.claim.execution_id in ours], now, kind)
        for p in batch:
            if not p.done.done():
                p.done.set_result(p.claim.execution_id in ours)


def _fail(batch: list[_Pending], exc: BaseException) -> None:
    for p in batch:
        if not p.done.done():
            p.done.set_exception(exc)


def _say(batch: list[_Pending], now: datetime, kind: str) -> None:
    """Say what was decided (a claim no longer ours is the fencing's to say)."""
    if not batch:
        return
    if len(batch) <= SAID_ONE_BY_ONE:
        for claim, reason, _, _ in batch:
            if kind == NO_CAPACITY:
                log.warning(
                    "%s slot %s MISSED: %s", claim.job_name, claim.scheduled_at.isoformat(), reason
                )
                continue
            log.warning(
                "%s slot %s was claimed %.1f s after its time, past its grace: %s",
                claim.job_name,
                claim.scheduled_at.isoformat(),
                (now - claim.scheduled_at).total_seconds(),
                "recorded MISSED" if reason else "run as a catch-up",
            )
        return
    jobs = len({p.claim.job_name for p in batch})
    if kind == NO_CAPACITY:
        log.warning("%d slots of %d jobs MISSED: %s", len(batch), jobs, batch[0].reason)
        return
    lateness = [(now - p.claim.scheduled_at).total_seconds() for p in batch]
    missed = sum(1 for p in batch if p.reason is not None)
    log.warning(
        "%d slots of %d jobs were claimed %.1f-%.1f s after their time, past their grace: "
        "%d recorded MISSED, %d run as catch-ups (`slotcron history` lists each)",
        len(batch),
        jobs,
        min(lateness),
        max(lateness),
        missed,
        len(batch) - missed,
    )
