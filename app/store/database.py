"""The handle every store function takes: the engine and its dialect."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.config import sqlite_file
from app.errors import ConfigError
from app.store.dialects import Dialect
from app.store.engine import NOWAIT, READ_ONLY, make_engine


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

    @classmethod
    def connect(cls, url: URL, pool_size: int = 10, *, create: bool = True) -> Database:
        """An engine for ``url``. A SQLite file is created private (0600; SQLite gives its
        ``-wal`` and ``-shm`` files the same mode) when missing, or with ``create=False`` (the
        commands that only read or queue) refused with :class:`ConfigError`, leaving no file
        behind."""
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
        engine, dialect = make_engine(url, pool_size)
        return cls(engine, dialect)

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
        async with self.engine.connect() as conn:
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
            if rehearse is None or self.dialect.single_writer:
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
        async with self.engine.connect() as conn:
            yield await conn.execution_options(isolation_level="AUTOCOMMIT")

    @asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncConnection]:
        """A read-only transaction (on SQLite it takes no write lock)."""
        async with self.engine.connect() as conn:
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
        """The database's clock (for SQLite, its storage's), or None to use this machine's."""
        if self.dialect.now_sql is None:
            return self.dialect.storage_clock(self.engine.url)
        async with self.read() as conn:
            value = (await conn.execute(text(self.dialect.now_sql))).scalar_one()
        return self.dialect.parse_now(value)

    async def close(self) -> None:
        await self.engine.dispose()
