"""Writing outcomes: each run's one finishing write, group-committed.

Runs ending while a write is under way are recorded together by the next one: a lone run is
written at once, a thousand ending together cost a few statements. A write is retried through
an outage (a finished run is never left ``RUNNING`` by us), and is conditional
(``status = 'RUNNING' AND instance_id = :me``), so a run fenced or recorded ``ABANDONED``
meanwhile is never overwritten. A failed run with attempts left is written on its own, with
its retry queued in the same transaction. What was written is announced by the runner
(:mod:`slotcron.observe.events`: the run log writes its line).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection
from datetime import datetime

from slotcron.lifeline.roles import Collaborators, Role
from slotcron.status import Status
from slotcron.store import runs as run_store
from slotcron.store.claims import Claim, RunKey

BATCH_LIMIT = 1000

_Pending = tuple[RunKey, Status, str | None, asyncio.Future[bool]]


class Outcomes(Role):
    """The outcome writer of one instance."""

    name = "outcome writer"

    def __init__(self, shared: Collaborators) -> None:
        super().__init__(shared)
        self._pending: list[_Pending] = []
        self._wake = asyncio.Event()
        self.on_recorded: Callable[[Claim, str, str | None, datetime | None], None] = lambda *_: (
            None
        )
        """Told of each outcome written (the reconnection check keeps the recent ones)."""
        self.counted: Collection[str] = ()
        """Jobs with ``max_runs``: their completed runs are counted as they are recorded."""

    async def record(
        self,
        claim: Claim,
        status: Status,
        error: str | None,
        retry_backoff: float | None,
        started_at: datetime | None = None,
    ) -> bool:
        """Write a run's outcome (and, with ``retry_backoff``, queue its next attempt). False
        when the record was no longer ours to write."""
        if retry_backoff is None:
            recorded = await self._group_commit(claim.key, status, error)
        else:
            recorded = await self._finish_and_retry(claim, status, error, retry_backoff)
        if recorded and retry_backoff is None:
            # Kept a while, to be written again if a failover loses it
            # (slotcron.lifeline.reconnection). A run
            # whose retry was queued with it is not: the retry row would be lost with it too.
            self.on_recorded(claim, status, error, started_at)
        return recorded

    async def _group_commit(self, run: RunKey, status: Status, error: str | None) -> bool:
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._pending.append((run, status, error, done))
        self._wake.set()
        return await done  # a cancelled waiter cancels only its own wait: see run()

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                batch = self._pending[:BATCH_LIMIT]
                del self._pending[:BATCH_LIMIT]
                try:
                    recorded = await self._write(batch)
                except BaseException as exc:
                    for *_, done in batch:
                        if not done.done():
                            done.set_exception(exc)
                    raise
                for run, _, _, done in batch:
                    if not done.done():  # its run was cancelled while waiting
                        done.set_result(run[0] in recorded)

    async def _write(self, batch: list[_Pending]) -> set[int]:
        outcomes = [(i, status, error) for i, status, error, _ in batch]
        return await self.outage.until_done(
            f"recording the end of {len(batch)} runs",
            lambda: run_store.finish_many(
                self.db,
                outcomes,
                instance_id=self.instance_id,
                now=self.clock.now(),
                counted=self.counted,
            ),
        )

    async def _finish_and_retry(
        self, claim: Claim, status: Status, error: str | None, retry_backoff: float
    ) -> bool:
        return await self.outage.until_done(
            f"recording the end of execution {claim.execution_id}",
            lambda: run_store.finish(
                self.db,
                run=claim.key,
                instance_id=self.instance_id,
                status=status,
                now=self.clock.now(),
                error=error,
                retry_backoff=retry_backoff,
                counted=self.counted,
            ),
        )
