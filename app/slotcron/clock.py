"""Time is a dependency: the scheduler asks a clock, never ``datetime.now()``.

In production the clock is the database's (guarantee 5): each instance measures its offset to
the database clock, round-trip compensated, and refreshes it every five minutes. Between two
measurements time is carried by the monotonic clock, never by the wall clock: a wall clock that
steps (NTP, a VM resumed) moves nothing, and is detected (:meth:`DatabaseClock.wall_stepped`) so
that the offset is measured again at once. Tests use :class:`ManualClock` to move time instead
of sleeping.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """Aware UTC."""
        ...

    async def sleep_until(self, when: datetime, *, precise: bool = False) -> None:
        """Return at ``when`` or later, never earlier (by this clock). ``precise``: within a
        fraction of a millisecond of it, for a moment many runs wait on (a burst's kick-off)."""
        ...

    async def sleep(self, seconds: float) -> None: ...

    def monotonic(self) -> float:
        """Seconds on a clock that never steps (the deadlines that fence runs)."""
        ...

    def said_at(self, moment: float) -> datetime:
        """What this clock said at ``moment``, a reading of :func:`time.monotonic` (taken where
        a datetime would cost too much: a burst's starts)."""
        ...


FINAL_APPROACH = 0.001
"""Seconds before a precise wake-up (``sleep_until(precise=True)``) from which the clock yields
to the loop instead of setting a timer."""


class SystemClock:
    """This machine's clock plus a measured offset to the reference (the database)."""

    def __init__(self, offset: timedelta = timedelta(0)) -> None:
        self.offset = offset

    def now(self) -> datetime:
        return datetime.now(UTC) + self.offset

    def monotonic(self) -> float:
        return time.monotonic()

    def said_at(self, moment: float) -> datetime:
        return self.now() - timedelta(seconds=time.monotonic() - moment)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(seconds, 0))

    async def sleep_until(self, when: datetime, *, precise: bool = False) -> None:
        # Re-check after each wake: the offset may change while we sleep, and the event loop
        # may wake a timer a hair early. Firing early is the one thing we must never do.
        while True:
            remaining = (when - self.now()).total_seconds()
            if remaining <= 0:
                return
            if precise and remaining <= FINAL_APPROACH:
                # The loop's timers are a millisecond coarse (up to 1 ms late, measured with
                # uvloop here): the last stretch is spent yielding to the loop, which runs
                # everything else meanwhile, at the cost of that stretch's CPU.
                await asyncio.sleep(0)
                continue
            await asyncio.sleep(remaining - FINAL_APPROACH if precise else remaining)


def file_clock(path: str) -> datetime:
    """The kernel's clock, read off the mtime of ``path`` after writing one byte to it.

    The file is opened without following a symlink (a link planted there cannot make us write
    elsewhere) and without truncating it, is created private (0600) if missing, and holds one
    byte for ever: the write is at offset 0, so it never grows. The stamp is floored to the
    microsecond, so a reader may be a hair late, never early."""
    flags = os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags, 0o600)
    try:
        os.pwrite(fd, b"\n", 0)
        stamp = os.fstat(fd).st_mtime_ns
    finally:
        os.close(fd)
    return datetime.fromtimestamp(stamp // 1000 / 1_000_000, UTC)


Sampler = Callable[[], Awaitable[datetime | None]]


class DatabaseClock(SystemClock):
    """A :class:`SystemClock` whose offset is measured against the database's clock."""

    SAMPLES = 8

    STEP = 0.5
    """Seconds by which the wall clock must jump against the monotonic one to count as a step."""

    def __init__(self, sample: Sampler) -> None:
        super().__init__()
        self._sample = sample
        self.round_trip = timedelta(0)
        # The local time line: the wall clock read once, carried on by the monotonic clock.
        self._base = datetime.now(UTC)
        self._base_mono = time.monotonic()
        self._wall_gap = time.time() - time.monotonic()

    def _local(self, mono: float | None = None) -> datetime:
        at = time.monotonic() if mono is None else mono
        return self._base + timedelta(seconds=at - self._base_mono)

    def now(self) -> datetime:
        return self._local() + self.offset

    def said_at(self, moment: float) -> datetime:
        return self._local(moment) + self.offset

    def wall_stepped(self) -> bool:
        """True (once per step) when the wall clock jumped against the monotonic one since the
        last look: a reference that is itself a wall clock (SQLite's storage) may have stepped
        with it, so the offset is to be measured again."""
        gap = time.time() - time.monotonic()
        stepped = abs(gap - self._wall_gap) > self.STEP
        self._wall_gap = gap
        return stepped

    async def sync(self, samples: int = SAMPLES) -> timedelta:
        """Measure the offset to the reference clock, never overestimating our lateness.

        The reference was read at some local instant before its answer arrived (``after``),
        so ``reference - after`` is a lower bound of the true offset. The largest lower bound
        over several samples is the tightest estimate that can never make us fire early; a
        sample slowed by load only loosens its own bound. The error is at most the shortest
        round trip (well under a millisecond on a local network)."""
        bound: timedelta | None = None
        shortest = float("inf")
        for _ in range(samples):
            t0 = time.perf_counter()
            reference = await self._sample()
            after = self._local()
            shortest = min(shortest, time.perf_counter() - t0)
            if reference is None:
                # No reference: this machine's wall clock, as it reads now.
                self.offset = datetime.now(UTC) - after
                return self.offset
            lower = reference - after
            bound = lower if bound is None else max(bound, lower)
        assert bound is not None
        self.round_trip = timedelta(seconds=shortest)
        self.offset = bound
        return self.offset


class ManualClock:
    """A clock that moves only when told to; sleepers wake when it passes their deadline."""

    def __init__(self, start: datetime) -> None:
        self._now = start
        self._moved = asyncio.Condition()
        self._sleepers: list[tuple[str, datetime]] = []

    def asleep(self, task_name: str) -> list[datetime]:
        """When each task of that name asleep on this clock wakes, earliest first: a test moves
        the clock to one of them, and no further, to let exactly that sleeper go."""
        return sorted(when for name, when in self._sleepers if name == task_name)

    def now(self) -> datetime:
        return self._now

    def monotonic(self) -> float:
        return self._now.timestamp()

    def said_at(self, moment: float) -> datetime:
        return self._now  # it moves only when told to: what it says now, it said then

    async def sleep(self, seconds: float) -> None:
        await self.sleep_until(self._now + timedelta(seconds=seconds))

    async def sleep_until(self, when: datetime, *, precise: bool = False) -> None:
        task = asyncio.current_task()
        sleeper = (task.get_name() if task else "", when)
        self._sleepers.append(sleeper)
        try:
            async with self._moved:
                await self._moved.wait_for(lambda: self._now >= when)
        finally:
            self._sleepers.remove(sleeper)

    async def advance(self, seconds: float) -> None:
        await self.set(self._now + timedelta(seconds=seconds))

    async def set(self, when: datetime) -> None:
        async with self._moved:
            self._now = when
            self._moved.notify_all()
        # Let woken tasks run up to their next await.
        for _ in range(5):
            await asyncio.sleep(0)
