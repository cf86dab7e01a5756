"""Handing back runs stopped before their body started, together.

A run claimed ahead of its slot whose body never started (shutdown came first, or it was fenced)
goes back to the queue for another instance (:func:`slotcron.store.lifeline.hand_back_mine`).
At a shutdown under load hundreds of them stop in the same moment, each in its own task: one
transaction each would hold the shutdown up for as many round trips. So their hand-backs are
written like outcomes (:mod:`slotcron.engine.outcomes`): the runs stopped in the same turn of
the loop go back in one write, and those stopped while it is under way in the next.

A write that fails or takes longer than :data:`HAND_BACK_TIMEOUT` hands back nothing: those
runs' leases lapse unrenewed and the leader hands them back (what happened to a lone run
before, too).
"""

from __future__ import annotations

import asyncio

from slotcron.clock import Clock
from slotcron.lifeline.outage import DB_ERRORS
from slotcron.store import lifeline
from slotcron.store.database import Database

HAND_BACK_TIMEOUT = 2.0
"""Seconds one write of hand-backs may take; past it, the leader hands those runs back."""


class HandBacks:
    """The hand-backs of one instance's runner."""

    def __init__(self, db: Database, clock: Clock, instance_id: str) -> None:
        self.db = db
        self.clock = clock
        self.instance_id = instance_id
        self._pending: dict[int, asyncio.Future[bool]] = {}
        self._writer: asyncio.Task[None] | None = None
        self.writes = 0
        """Writes made so far (what a test counts: one for runs stopped together)."""

    async def hand_back(self, execution_id: int) -> bool:
        """Hand back the run ``execution_id`` (this instance's, its body never started, its
        chunk's marker notwithstanding); whether it went back. A waiter cancelled meanwhile
        cancels only its own wait."""
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._pending[execution_id] = done
        if self._writer is None:
            self._writer = asyncio.create_task(self._write_all())
        return await done

    async def _write_all(self) -> None:
        batch: dict[int, asyncio.Future[bool]] = {}
        try:
            await asyncio.sleep(0)  # the runs stopped in this turn of the loop join the first
            while self._pending:
                batch, self._pending = self._pending, {}
                back = await self._write(list(batch))
                for execution_id, done in batch.items():
                    if not done.done():  # its run was cancelled while waiting
                        done.set_result(execution_id in back)
        finally:
            self._writer = None
            # Only if this task was cancelled: nobody waits for good.
            for done in (*batch.values(), *self._pending.values()):
                if not done.done():
                    done.cancel()
            self._pending = {}

    async def _write(self, execution_ids: list[int]) -> set[int]:
        self.writes += 1
        try:
            async with asyncio.timeout(HAND_BACK_TIMEOUT):
                return await lifeline.hand_back_mine(
                    self.db,
                    execution_ids,
                    instance_id=self.instance_id,
                    now=self.clock.now(),
                    marked_too=True,  # its chunk's marker may say started: these bodies did not
                )
        except TimeoutError:
            return set()
        except DB_ERRORS:
            return set()
