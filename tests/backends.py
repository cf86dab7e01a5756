"""The real databases the tests run on, and fresh databases made for each test.

PostgreSQL and MariaDB are used when reachable (URLs overridable with
SLOTCRON_TEST_POSTGRES_URL / SLOTCRON_TEST_MARIADB_URL); unreachable ones are skipped with a
plain message, except under CI=true, where a missing backend fails the run.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from dataclasses import dataclass, field
from pathlib import Path

import aiomysql
import asyncpg
from sqlalchemy.engine import URL, make_url

POSTGRES_URL = os.environ.get(
    "SLOTCRON_TEST_POSTGRES_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/test"
)
MARIADB_URL = os.environ.get(
    "SLOTCRON_TEST_MARIADB_URL", "mysql+aiomysql://root@127.0.0.1:3306/test"
)
NAMES = ("sqlite", "postgresql", "mariadb")
_counter = itertools.count()


@dataclass
class Availability:
    ok: dict[str, bool] = field(default_factory=dict)
    why: dict[str, str] = field(default_factory=dict)


AVAILABLE = Availability()


def _pg_connect_args(url: URL) -> dict[str, object]:
    return {
        "host": url.host or "127.0.0.1",
        "port": url.port or 5432,
        "user": url.username or "postgres",
        "password": url.password,
        "database": url.database or "postgres",
    }


def _my_connect_args(url: URL) -> dict[str, object]:
    return {
        "host": url.host or "127.0.0.1",
        "port": url.port or 3306,
        "user": url.username or "root",
        "password": url.password or "",
        "db": url.database or "test",
        "autocommit": True,
    }


async def _probe(name: str) -> None:
    if name == "postgresql":
        conn = await asyncio.wait_for(
            asyncpg.connect(**_pg_connect_args(make_url(POSTGRES_URL))), 5
        )
        await conn.close()
    elif name == "mariadb":
        conn = await asyncio.wait_for(
            aiomysql.connect(**_my_connect_args(make_url(MARIADB_URL))), 5
        )
        conn.close()


def probe_all() -> Availability:
    for name in NAMES:
        try:
            asyncio.run(_probe(name))
        except Exception as exc:  # any failure to connect means: not available
            AVAILABLE.ok[name] = False
            AVAILABLE.why[name] = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
        else:
            AVAILABLE.ok[name] = True
    return AVAILABLE


async def _admin(name: str, statement: str) -> None:
    if name == "postgresql":
        conn = await asyncpg.connect(**_pg_connect_args(make_url(POSTGRES_URL)))
        try:
            await conn.execute(statement)
        finally:
            await conn.close()
    else:
        conn = await aiomysql.connect(**_my_connect_args(make_url(MARIADB_URL)))
        try:
            async with conn.cursor() as cur:
                await cur.execute(statement)
        finally:
            conn.close()


def create_database(name: str, tmp_path: Path) -> str:
    """A fresh, empty database of backend ``name``; returns its URL (with password)."""
    if name == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'slotcron-test.db'}"
    db = f"slotcron_t{os.getpid()}_{next(_counter)}"
    base = make_url(POSTGRES_URL if name == "postgresql" else MARIADB_URL)
    asyncio.run(_admin(name, f"DROP DATABASE IF EXISTS {db}"))
    asyncio.run(_admin(name, f"CREATE DATABASE {db}"))
    return base.set(database=db).render_as_string(hide_password=False)


def drop_database(name: str, url: str) -> None:
    if name == "sqlite":
        return
    db = make_url(url).database
    if name == "postgresql":
        asyncio.run(_admin(name, f"DROP DATABASE IF EXISTS {db} WITH (FORCE)"))
    else:
        asyncio.run(_admin(name, f"DROP DATABASE IF EXISTS {db}"))
