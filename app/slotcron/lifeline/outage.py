"""Database trouble is logged once when it starts and once when it ends, never per slot."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from slotcron.masking import mask
from slotcron.store.dialects import DRIVER_ERRORS
from slotcron.store.dialects import refused_login as refused_login

log = logging.getLogger("slotcron.outage")

T = TypeVar("T")

# What a lost or refused connection looks like through each driver.
DB_ERRORS: tuple[type[BaseException], ...] = (
    OperationalError,
    InterfaceError,
    DBAPIError,
    OSError,
    ConnectionError,
    TimeoutError,  # a deadline of ours (app/slotcron/store/database.py) or a driver's
    PoolTimeout,  # no pooled connection in time
    *DRIVER_ERRORS,
)


class Outage:
    """Tracks whether the database is reachable, so each outage is logged once."""

    def __init__(self) -> None:
        self.since: float | None = None
        self.failures = 0
        self.errors = 0  # every failed call since start-up (``failures`` counts this outage's)
        self.on_recovered: Callable[[], None] = lambda: None
        """Called once when an outage ends (the database may be another server now)."""

    @property
    def ongoing(self) -> bool:
        return self.since is not None

    def failed(self, exc: BaseException, doing: str) -> None:
        """Count a failed database call; the first of an outage is logged. Raises
        ``CancelledError`` instead when the calling task is being cancelled: see
        :func:`resume_cancellation`."""
        resume_cancellation(exc)
        self.failures += 1
        self.errors += 1
        if self.since is None:
            self.since = time.monotonic()
            log.warning(
                "database unreachable while %s: %s; running jobs go on, claims resume when it "
                "is back",
                doing,
                describe(exc),
            )

    async def until_done(self, doing: str, call: Callable[[], Awaitable[T]]) -> T:
        """``call()`` until it succeeds, waiting out database trouble with a :class:`Backoff`:
        for writes that must happen (an outcome), however long the outage lasts."""
        backoff = Backoff()
        while True:
            try:
                result = await call()
            except DB_ERRORS as exc:
                self.failed(exc, doing)
                await backoff.wait()
                continue
            self.recovered()
            return result

    def recovered(self) -> None:
        if self.since is not None:
            log.warning(
                "database reachable again after %.1f s (%d failed calls)",
                time.monotonic() - self.since,
                self.failures,
            )
            self.since = None
            self.failures = 0
            self.on_recovered()


class Backoff:
    """The waits between retries through an outage: ``first`` seconds, doubling up to ``cap``.
    With ``jitter`` (0.5: each wait times 0.5 to 1.5), instances that failed together do not
    all retry in step."""

    def __init__(self, first: float = 0.05, cap: float = 2.0, jitter: float = 0.0) -> None:
        self.delay = first
        self.cap = cap
        self.jitter = jitter

    async def wait(self) -> None:
        spread = random.uniform(1 - self.jitter, 1 + self.jitter) if self.jitter else 1.0
        await asyncio.sleep(self.delay * spread)
        self.delay = min(self.delay * 2, self.cap)


def describe(exc: BaseException) -> str:
    """One line about a database error, with no secret in it (slotcron.masking): masked before it is
    cut, so a cut cannot leave half a URL's password showing."""
    orig = getattr(exc, "orig", None) or exc
    text = f"{type(orig).__name__}: {orig}".splitlines()[0]
    return mask(text)[:300]


def resume_cancellation(exc: BaseException) -> None:
    """Call wherever a database error is caught and the loop goes on (:meth:`Outage.failed`
    does). A database call cancelled midway (a stop cancelling a role's loop) can come back as
    the driver's own error: taken for an outage, the loop slept on, still cancelling, and the
    stop waited for it forever (a MariaDB leader, seen in a full run). A task being cancelled
    gets its cancellation back. (``asyncio.timeout`` takes back the cancellations it makes, so
    a deadline of ours stays an outage.)"""
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no running loop
        return
    if task is not None and task.cancelling():
        raise asyncio.CancelledError from exc
