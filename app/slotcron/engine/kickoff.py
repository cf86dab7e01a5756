"""Kick-off: the moment a claimed run may start its body, decided by the database.

A run claimed ahead of its slot (a burst), taken from the queue, or delayed by jitter has no
``started_at`` yet. Its body starts only once :func:`slotcron.store.starts.start_runs` has stamped
it,
at its time: until then another instance can have it handed back (its instance died, stopped or
was fenced), and a pause committed before its time is honoured (``SKIPPED``).

A burst's runs are kicked off together: one start marker per chunk at the slot, whatever the
number of runs (:meth:`Kickoff.at`, :mod:`slotcron.store.markers`); any other run, on its own
(:meth:`Kickoff.one`), by stamping its row.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from slotcron.lifeline.outage import DB_ERRORS, Backoff
from slotcron.lifeline.roles import Collaborators
from slotcron.status import Status
from slotcron.store import markers, starts
from slotcron.store.claims import Claim
from slotcron.store.held import Held, hold, holds

log = logging.getLogger("slotcron.runner")

EARLY_RETRY = 0.001
"""Seconds before a run the database's clock found early (its slot not come) is tried again."""
HOLD_AHEAD = timedelta(milliseconds=5)
"""How long before a burst's slot its marker's connection is taken (:mod:`slotcron.store.held`):
taking it and setting it up are a round trip each (0.5 ms measured)."""


class Kickoff:
    def __init__(self, shared: Collaborators) -> None:
        self.db = shared.db
        self.clock = shared.clock
        self.instance_id = shared.instance_id
        self.outage = shared.outage
        self.events = shared.events
        self.closing = False
        """Set by shutdown: no body starts any more; unstarted runs are handed back."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._waiting: dict[str, _Waiting] = {}
        """Runs claimed ahead, by start key, whose kick-off has not come yet."""

    def at(
        self, slot: datetime, claims: Collection[Claim], start_key: str
    ) -> dict[int, asyncio.Future[bool]]:
        """Start ``claims`` (runs claimed ahead of ``slot``, under ``start_key``) together once
        ``slot`` comes: one marker for them and every other chunk of the same key still
        waiting for it (a burst's chunks share their slot's key); each one's future says
        whether its body may start. A run whose future was cancelled meanwhile (handed back or
        stopped) is handed back by its runner, marker or not: its body never started."""
        loop = asyncio.get_running_loop()
        futures = {claim.execution_id: loop.create_future() for claim in claims}
        waiting = self._waiting.get(start_key)
        joined = waiting is not None  # another chunk of the burst: one marker for both
        if waiting is None:
            waiting = self._waiting[start_key] = _Waiting()
        # All the marker needs is made now, ahead of the slot: at the slot every microsecond
        # is every body's start lag.
        for claim in claims:
            waiting.claims[claim.execution_id] = claim
            waiting.lease_until = min(waiting.lease_until, claim.lease_until or slot)
        waiting.futures.update(futures)
        if joined:
            return futures

        async def kick() -> None:
            held: Held | None = None
            try:
                if holds(self.db):
                    await self.clock.sleep_until(slot - HOLD_AHEAD)
                    if not self.closing:
                        held = await hold(self.db)
                await self.clock.sleep_until(slot, precise=True)
                # From now on, a chunk of this key claimed late gets a kick-off of its own.
                self._done_waiting(start_key, waiting)
                await self._mark(slot, start_key, waiting, held)
            finally:
                self._done_waiting(start_key, waiting)
                for future in waiting.futures.values():
                    if not future.done():
                        future.set_result(False)
                if held is not None:  # last: whatever it raises, every run has its answer
                    await held.release()

        task = asyncio.create_task(kick(), name="slotcron-kickoff")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return futures

    def _done_waiting(self, start_key: str, waiting: _Waiting) -> None:
        if self._waiting.get(start_key) is waiting:
            del self._waiting[start_key]

    async def one(self, claim: Claim) -> bool:
        """Start one run, at its slot at the earliest (a slot handed back before its time is
        taken at once by another instance); whether its body may start."""
        if claim.scheduled_at > self.clock.now():
            await self.clock.sleep_until(claim.scheduled_at)
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        await self._start({claim.execution_id: claim}, {claim.execution_id: future})
        return future.done() and future.result()

    async def _mark(
        self, slot: datetime, start_key: str, waiting: _Waiting, held: Held | None
    ) -> None:
        """Insert the key's marker, and say to each run whether its body starts. ``held``: the
        connection taken ahead for it, used until a statement on it fails (then given up: the
        statements that follow take their own, as through any outage)."""
        claims, futures = waiting.claims, waiting.futures
        ids = list(claims)
        backoff = Backoff(jitter=0.5)
        while not self.closing and not all(future.done() for future in futures.values()):
            try:
                marked = await markers.mark(
                    self.db,
                    start_key,
                    ids=ids,
                    slot=slot,
                    lease_until=waiting.lease_until,
                    instance_id=self.instance_id,
                    now=self.clock.now(),
                    held=held,  # once given up, its statements go their usual way
                )
            except DB_ERRORS as exc:
                # Not started, still ours while the lease holds: try again (see _start).
                self.outage.failed(exc, f"starting {len(futures)} runs")
                await backoff.wait()
                continue
            self.outage.recovered()
            if marked.early:
                await asyncio.sleep(EARLY_RETRY)
                continue
            for execution_id, reason in marked.skipped.items():
                if execution_id in claims:
                    self._skipped(claims[execution_id], reason)
                    _settle(futures[execution_id], False)
            started = marked.started and not self.closing
            only = marked.only
            # No collection while the chunk's bodies start one after another (a collection of
            # the young generations took 0.1-0.7 ms: every later body's start lag); it is back
            # on once the last of them has started (queued after their wake-ups).
            collecting = started and gc.isenabled()
            if collecting:
                gc.disable()
            if started and only is None:  # nearly always: one loop of the least per run
                for future in futures.values():
                    if not future.done():  # cancelled: its run was stopped or fenced
                        future.set_result(True)
            else:
                for execution_id, future in futures.items():
                    _settle(future, started and (only is None or execution_id in only))
            if collecting:
                asyncio.get_running_loop().call_soon(gc.enable)
            if held is not None:
                await asyncio.sleep(0)  # the bodies start first; then the connection goes back
            return

    async def _start(
        self, claims: dict[int, Claim], futures: dict[int, asyncio.Future[bool]]
    ) -> None:
        backoff = Backoff(jitter=0.5)
        while True:
            waiting = [i for i, future in futures.items() if not future.done()]
            if not waiting or self.closing:
                return
            try:
                done = await starts.start_runs(
                    self.db, waiting, instance_id=self.instance_id, now=self.clock.now()
                )
            except DB_ERRORS as exc:
                # Not started, still ours while the lease holds: try again. A run whose lease
                # its instance can no longer vouch for is fenced by time, and its future goes.
                self.outage.failed(exc, f"starting {len(waiting)} runs")
                await backoff.wait()
                continue
            self.outage.recovered()
            for execution_id in done.started:
                _settle(futures[execution_id], True)
            for execution_id in done.gone:
                _settle(futures[execution_id], False)
            for execution_id, reason in done.skipped.items():
                self._skipped(claims[execution_id], reason)
                _settle(futures[execution_id], False)
            if done.early:
                await asyncio.sleep(EARLY_RETRY)

    def _skipped(self, claim: Claim, reason: str) -> None:
        """Its start found the job paused meanwhile: recorded SKIPPED, and announced."""
        self.events.slots_passed(replace(claim, status=Status.SKIPPED, reason=reason))


@dataclass
class _Waiting:
    """The runs of one start key waiting for their slot's kick-off."""

    claims: dict[int, Claim] = field(default_factory=dict)
    futures: dict[int, asyncio.Future[bool]] = field(default_factory=dict)
    lease_until: datetime = field(default_factory=lambda: datetime.max.replace(tzinfo=UTC))
    """The earliest lease of its runs as claimed (renewals only push them later)."""


def _settle(future: asyncio.Future[bool], value: bool) -> None:
    if not future.done():
        future.set_result(value)
