"""The instance's capacity (``SCHEDULER_MAX_CONCURRENCY``), as permits of two kinds.

- :attr:`Permits.run`: one per run whose body may run now (or whose claim, made at its slot,
  starts it at once). Taken before such a claim, or, for a run claimed ahead of its slot, when
  its slot has come; given back when the run ends, or at once when the slot turns out not to run
  here. Waiters are served by urgency: the earliest deadline (the slot's grace) first, so a
  job whose slot is due now is never kept waiting behind thousands of others that can wait.
- :attr:`Permits.ahead`: one per run claimed ahead of its slot, until the slot comes. A burst
  claims ahead at most this many, and they hold no run permit meanwhile: a job due before
  their slot finds the run permits free (100,000 runtime schedules claimed 20 s ahead held
  every run permit until their slot, and a one-second job lost 20 of its 60 slots a minute).

Every take and give goes through this object.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager


class RunPermits:
    """``capacity`` permits, granted earliest deadline first (FIFO among equal deadlines)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._free = capacity
        self._waiters: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    @property
    def free(self) -> int:
        return self._free

    @property
    def waiting(self) -> int:
        return sum(1 for *_, waiter in self._waiters if not waiter.done())

    async def take(self, deadline: float = math.inf) -> None:
        """One permit; ``deadline`` (seconds, the scheduler clock's timestamp of the slot's
        grace) orders the waiters: the most urgent is served first."""
        if self._free > 0:
            self._free -= 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (deadline, next(self._order), waiter))
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.give_back()  # granted as it was cancelled: the permit goes on
            else:
                waiter.cancel()  # left in the heap, skipped when reached
            raise

    def try_take(self) -> bool:
        """One permit if one is free now, without waiting (a free permit means nobody waits)."""
        if self._free > 0:
            self._free -= 1
            return True
        return False

    async def take_up_to(self, wanted: int, deadline: float = math.inf) -> int:
        """Wait for one permit, then take as many more as are free at once, up to ``wanted``;
        return how many were taken."""
        await self.take(deadline)
        more = min(wanted - 1, self._free)
        self._free -= more
        return 1 + more

    def give_back(self, permits: int = 1) -> None:
        if not self._waiters:  # nearly always: nobody to wake
            self._free += permits
            return
        for _ in range(permits):
            while self._waiters:
                *_, waiter = heapq.heappop(self._waiters)
                if not waiter.done():
                    waiter.set_result(None)
                    break
            else:
                self._free += 1

    @asynccontextmanager
    async def one(self, deadline: float = math.inf) -> AsyncIterator[None]:
        """Hold one permit for the block."""
        await self.take(deadline)
        try:
            yield
        finally:
            self.give_back()


class AheadPermits(RunPermits):
    """``capacity`` permits for runs claimed ahead of their slot, first come first served (a
    wave takes as many as are free in one step, not one await each)."""

    async def take_up_to(self, wanted: int, deadline: float = math.inf) -> int:
        """As :meth:`RunPermits.take_up_to`, in arrival order (``deadline`` is not used)."""
        return await super().take_up_to(wanted)


Tokens = RunPermits | AheadPermits
"""Either kind: what a burst's wave was claimed under, and gives back as its slots settle."""


class Permits:
    """The instance's capacity: :attr:`run` permits and :attr:`ahead` permits, each
    ``capacity`` strong."""

    def __init__(self, capacity: int) -> None:
        self.run = RunPermits(capacity)
        self.ahead = AheadPermits(capacity)

    # The run permits' interface, for the many callers that hold one around a claim and run.

    async def take_up_to(self, wanted: int, deadline: float = math.inf) -> int:
        return await self.run.take_up_to(wanted, deadline)

    def give_back(self, permits: int = 1) -> None:
        self.run.give_back(permits)

    def one(self, deadline: float = math.inf) -> AbstractAsyncContextManager[None]:
        return self.run.one(deadline)
