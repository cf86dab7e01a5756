"""An idle instance gives back the pooled connections it does not use (issue 25): behind a
session pooler each one pins one of the pooler's few server connections."""

from __future__ import annotations

import asyncio

import pytest
from slotcron.config import Settings
from slotcron.store.database import Database
from sqlalchemy import text

SERVERS = pytest.mark.parametrize("backend", ["postgresql", "mariadb"], indirect=True)


@SERVERS
async def test_connections_idle_past_the_bound_are_closed_but_the_last_used_one(
    db_url: str,
) -> None:
    db = Database.connect(Settings(database_url=db_url).url, 5)
    try:

        async def touch() -> None:
            async with db.read() as conn:
                await conn.execute(text("SELECT 1"))
                await asyncio.sleep(0.05)  # all five at once

        await asyncio.gather(*(touch() for _ in range(5)))
        pool = db.engine.sync_engine.pool
        assert pool.checkedin() == 5  # type: ignore[attr-defined]
        assert await db.shed_idle(idle_for=60) == 0  # none idle that long yet
        await asyncio.sleep(0.2)
        assert await db.shed_idle(idle_for=0.1) == 4
        assert pool.checkedin() == 1  # type: ignore[attr-defined]
        # The pool opens connections again as they are asked for, up to its size.
        await asyncio.gather(*(touch() for _ in range(5)))
        assert pool.checkedin() == 5  # type: ignore[attr-defined]
    finally:
        await db.close()


@SERVERS
async def test_behind_a_pooler_connections_are_closed_sooner(db_url: str) -> None:
    url = Settings(database_url=db_url).url
    direct = Database.connect(url, 2)
    try:
        assert direct.idle_for == 30.0
    finally:
        await direct.close()
    if url.get_backend_name() == "postgresql":
        pooled = Database.connect(url, 2, pooler="session")
        try:
            assert pooled.idle_for == 5.0
        finally:
            await pooled.close()
