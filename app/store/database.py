"""The handle every store function takes: the engine and its dialect."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.store.dialects import Dialect
from app.store.engine import NOWAIT, READ_ONLY, make_engine


@dataclass
class Database:
    engine: AsyncEngine
    dialect: Dialect
    _writer: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)

    @classmethod
    def connect(cls, url: URL, pool_size: int = 10) -> Database:
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

    async def warm_up(self, connections: int) -> None:
        """Open pooled connections ahead of the first burst of claims."""

        async def touch() -> None:
            async with self.read() as conn:
                await conn.execute(text("SELECT 1"))

        await asyncio.gather(*(touch() for _ in range(connections)))

    @asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncConnection]:
        """A read-only transaction (on SQLite it takes no write lock)."""
        async with self.engine.connect() as conn:
            conn = await conn.execution_options(**{READ_ONLY: True})
            async with conn.begin():
                yield conn

    async def clock_sample(self) -> datetime | None:
        """The database's clock (for SQLite, its storage's), or None to use this machine's."""
        if self.dialect.now_sql is None:
            return self.dialect.storage_clock(self.engine.url)
        async with self.read() as conn:
            value = (await conn.execute(text(self.dialect.now_sql))).scalar_one()
        return self.dialect.parse_now(value)

    async def close(self) -> None:
        await self.engine.dispose()
