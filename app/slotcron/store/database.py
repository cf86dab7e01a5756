"""The handle every store function takes: the engine and its dialect."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import ColumnElement, bindparam, func, text
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.util import greenlet_spawn

from slotcron.database_url import sqlite_file
from slotcron.errors import ConfigError
from slotcron.store.dialects import NOWAIT, READ_ONLY, STATEMENT_TIMEOUT, Dialect
from slotcron.store.engine import make_engine
from slotcron.store.tables import UTCDateTime

log = logging.getLogger("slotcron.database")

IDLE_CONNECTION_SECONDS = 30.0
"""A pooled connection unused this long is closed (one is always kept)."""
IDLE_BEHIND_POOLER_SECONDS = 5.0
"""The same behind a pooler, where an idle connection pins one of its few server connections
(in session mode): five instances starting together held 28 for the first 30 s, and renewals
waited in the pooler's queue until they were closed."""


def now_in_sql(dialect: Dialect, server_clock: bool, name: str = "p_now") -> ColumnElement[Any]:
    """The time to judge leases by, in SQL: the database's own clock where the scheduler runs
    by it (``server_clock``) and the database has one, else the bound parameter ``name`` (the
    scheduler's clock: SQLite's storage clock, or a test's manual clock)."""
    param = bindparam(name, type_=UTCDateTime())
    server = dialect.server_now() if server_clock else None
    # COALESCE keeps the parameter in the statement (never used: the clock is never NULL), so
    # every caller binds it whichever clock decides.
    return param if server is None else func.coalesce(server, param)


def _create_private(path: Path) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    try:
        os.close(os.open(path, flags, 0o600))
    except FileExistsError:
        pass
    except OSError as exc:
        raise ConfigError(
            "SCHEDULER_DATABASE_URL", f"cannot create the SQLite file {str(path)!r}: {exc.strerror}"
        ) from None


@dataclass
class Database:
    engine: AsyncEngine
    dialect: Dialect
    _writer: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)
    server_clock: bool = False
    """True when the scheduler's clock is this database's: judgements about other instances'
    leases are then made by the database's own ``now()`` inside SQL, so that no instance's
    view of time (stepped, paused, skewed) can decide another's run lapsed. False with a test's
    manual clock, whose time the database does not know."""

    lease_seconds: float | None = None
    read_only_since: float | None = field(default=None, repr=False)
    """When (monotonic) a write was last refused because the database is read-only (a standby,
    a demoted primary, ``default_transaction_read_only``); None once a write succeeds."""

    def now_in_sql(self, name: str = "p_now") -> ColumnElement[Any]:
        """The time to judge leases by, in SQL: see :func:`now_in_sql`."""
        return now_in_sql(self.dialect, self.server_clock, name)

    def __post_init__(self) -> None:
        self.dialect.on_read_only = self._refused_as_read_only

    @classmethod
    def connect(
        cls,
        url: URL,
        pool_size: int = 10,
        *,
        create: bool = True,
        lease_seconds: float | None = None,
        pooler: str = "none",
    ) -> Database:
        """An engine for ``url``. A SQLite file is created private (0600; SQLite gives its
        ``-wal`` and ``-shm`` files the same mode) when missing, or with ``create=False`` (the
        commands that only read or queue) refused with :class:`ConfigError`, leaving no file
        behind. ``lease_seconds``: the instance's lease, which bounds how long the server lets a
        session of ours hold locks while hung (:class:`slotcron.store.dialects.SessionLimits`).
        ``pooler``: what sits between us and PostgreSQL (``SCHEDULER_DATABASE_POOLER``)."""
        path = sqlite_file(url)
        if path is not None:
            if create:
                _create_private(path)
            elif not path.exists():
                raise ConfigError(
                    "SCHEDULER_DATABASE_URL",
                    f"no database at {str(path)!r}: start `slotcron run` or `slotcron migrate` "
                    "with this URL first",
                )
        engine, dialect = make_engine(url, pool_size, lease_seconds, pooler)
        return cls(engine, dialect, lease_seconds=lease_seconds)

    def sibling(self, pool_size: int) -> Database:
        """Another engine on the same database, set up the same way (its own pool: for a
        thread with a loop of its own)."""
        database = Database.connect(
            self.engine.url,
            pool_size,
            create=False,
            lease_seconds=self.lease_seconds,
            pooler=self.dialect.pooler,
        )
        database.server_clock = self.server_clock
        return database

    @property
    def read_only(self) -> bool:
        return self.read_only_since is not None

    def _refused_as_read_only(self) -> None:
        if self.read_only_since is None:
            log.warning(
                "the database refused a write: it is read-only (a standby, or a primary "
                "demoted by a failover). Not ready; reconnecting until a server takes writes"
            )
        self.read_only_since = time.monotonic()

    def wrote(self) -> None:
        """A write of ours committed: the database takes writes (again)."""
        if self.read_only_since is not None:
            self.read_only_since = None
            log.warning("the database takes writes again")

    @property
    def idle_for(self) -> float:
        """How long a pooled connection may go unused before :meth:`shed_idle` closes it."""
        if self.dialect.pooler != "none":
            return IDLE_BEHIND_POOLER_SECONDS
        return IDLE_CONNECTION_SECONDS

    async def shed_idle(self, idle_for: float | None = None) -> int:
        """Close the pooled connections nobody used for ``idle_for`` seconds (default
        :attr:`idle_for`), but one: an idle instance holds few server connections (behind a
        session pooler, each is one of the pool's few). Returns how many were closed."""
        idle_for = self.idle_for if idle_for is None else idle_for
        pool = self.engine.sync_engine.pool
        shed = getattr(pool, "shed_idle", None)
        if shed is None:
            return 0
        closed: int = await greenlet_spawn(shed, idle_for)
        return closed

    @asynccontextmanager
    async def transaction(self, *, nowait: bool = False) -> AsyncIterator[AsyncConnection]:
        """One transaction on its own pooled connection. ``nowait``: never wait for a write lock
        on SQLite (the other dialects say NOWAIT on the row itself)."""
        if self.dialect.single_writer:
            async with self._writer, self._transaction(nowait) as conn:
                yield conn
        else:
            async with self._transaction(nowait) as conn:
                yield conn

    @asynccontextmanager
    async def _transaction(self, nowait: bool) -> AsyncIterator[AsyncConnection]:
        # Every transaction has a deadline: a database path that hangs (no answer, no error)
        # is an outage like a refused connection, never a caller stuck for good.
        async with asyncio.timeout(STATEMENT_TIMEOUT), self.engine.connect() as conn:
            if nowait:
                conn = await conn.execution_options(**{NOWAIT: True})
            async with conn.begin():
                yield conn

    async def warm_up(
        self,
        connections: int,
        rehearse: Callable[[AsyncConnection], Awaitable[None]] | None = None,
    ) -> None:
        """Open pooled connections ahead of the first burst of claims. ``rehearse`` runs the
        hot statements on each of them in a transaction rolled back, so the first burst finds
        them prepared (asyncpg prepares per connection) instead of paying for it at the slot."""

        async def touch() -> None:
            if rehearse is None or self.dialect.single_writer or not self.dialect.keeps_prepared:
                async with self.read() as conn:
                    await conn.execute(text("SELECT 1"))
                return
            async with self.engine.connect() as conn:
                transaction = await conn.begin()
                try:
                    await rehearse(conn)
                finally:
                    await transaction.rollback()

        await asyncio.gather(*(touch() for _ in range(connections)))

    @asynccontextmanager
    async def alone(self, *, write: bool) -> AsyncIterator[AsyncConnection]:
        """A connection for one statement that needs no transaction around it: on PostgreSQL
        it runs in autocommit, one round trip with no BEGIN or COMMIT (an idle instance's cost
        is counted in these). Elsewhere a transaction as usual: MariaDB's driver would spend
        two statements switching autocommit on and off, and SQLite has no server to spare."""
        if not self.dialect.free_autocommit:
            async with self.transaction() if write else self.read() as conn:
                yield conn
            return
        async with asyncio.timeout(STATEMENT_TIMEOUT), self.engine.connect() as conn:
            yield await conn.execution_options(isolation_level="AUTOCOMMIT")

    @asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncConnection]:
        """A read-only transaction (on SQLite it takes no write lock)."""
        async with asyncio.timeout(STATEMENT_TIMEOUT), self.engine.connect() as conn:
            conn = await conn.execution_options(**{READ_ONLY: True})
            async with conn.begin():
                yield conn

    async def ping(self) -> None:
        """One round trip to the database (readiness); raises what the driver raises."""
        async with self.read() as conn:
            await conn.execute(text("SELECT 1"))

    async def now(self) -> datetime:
        """The time by the database's clock (SQLite: its storage's), one sample: what a command
        line tool judges leases and queues by."""
        return await self.clock_sample() or datetime.now(UTC)

    async def clock_sample(self) -> datetime | None:
        """The database's clock (for SQLite, its storage's), or None to use this machine's:
        as it reads when this returns, at the latest (what it said, carried on from the moment
        its answer came by this machine's monotonic clock). A sample is a lower bound of the
        database's time (:meth:`slotcron.clock.DatabaseClock.sync`): what the statement took
        after the database read its clock is its error, so no COMMIT or giving back of the
        connection is counted in (they made this instance's clock 0.5 ms late, and every
        burst's start with it)."""
        if self.dialect.now_sql is None:
            return self.dialect.storage_clock(self.engine.url)
        async with self.alone(write=False) as conn:
            value = (await conn.execute(text(self.dialect.now_sql))).scalar_one()
            answered = time.monotonic()
        return self.dialect.parse_now(value) + timedelta(seconds=time.monotonic() - answered)

    async def close(self) -> None:
        await self.engine.dispose()
