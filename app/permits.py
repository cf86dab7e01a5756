"""The instance's capacity (``SCHEDULER_MAX_CONCURRENCY``), as permits.

A permit is taken before a slot is claimed for a run here, and given back when that run ends,
or at once when the slot turns out not to run here (taken elsewhere, skipped, missed, held by
another claimer, or the claim was cancelled). Every take and give goes through this object.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class Permits:
    def __init__(self, capacity: int) -> None:
        self._semaphore = asyncio.Semaphore(capacity)

    async def take_up_to(self, wanted: int) -> int:
        """Wait for one permit, then take as many more as are free at once, up to ``wanted``;
        return how many were taken."""
        await self._semaphore.acquire()
        taken = 1
        while taken < wanted and not self._semaphore.locked():
            await self._semaphore.acquire()  # free: returns at once
            taken += 1
        return taken

    def give_back(self, permits: int = 1) -> None:
        for _ in range(permits):
            self._semaphore.release()

    @asynccontextmanager
    async def one(self) -> AsyncIterator[None]:
        """Hold one permit for the block."""
        async with self._semaphore:
            yield
