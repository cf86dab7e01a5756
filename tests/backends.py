"""The real databases the tests run on, and fresh databases made for each test.

PostgreSQL and MariaDB are used when reachable (URLs overridable with
SLOTCRON_TEST_POSTGRES_URL / SLOTCRON_TEST_MARIADB_URL); unreachable ones are skipped with a
plain message, except under CI=true, where a missing backend fails the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import sqlite3
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


# The schema is migrated once per backend per test process, into a template; each test's
# database is a copy of it (PostgreSQL: CREATE DATABASE ... TEMPLATE; MariaDB: CREATE TABLE
# LIKE plus the seeded rows; SQLite: a copy of the file). The migrations themselves are
# tested from empty databases in tests/integration/test_migrations.py.
_templates: dict[str, str] = {}


async def _migrate(url: str) -> None:
    from slotcron.config import Settings
    from slotcron.store import migrate
    from slotcron.store.database import Database

    db = Database.connect(Settings(database_url=url).url, 2)
    try:
        await migrate.upgrade(db.engine, db.dialect)
    finally:
        await db.close()


def _template(name: str, tmp_root: Path) -> str:
    if name not in _templates:
        if name == "sqlite":
            url = f"sqlite+aiosqlite:///{tmp_root / f'slotcron-template-{os.getpid()}.db'}"
        else:
            db = f"slotcron_tpl{os.getpid()}"
            base = make_url(POSTGRES_URL if name == "postgresql" else MARIADB_URL)
            asyncio.run(_admin(name, f"DROP DATABASE IF EXISTS {db}"))
            asyncio.run(_admin(name, f"CREATE DATABASE {db}"))
            url = base.set(database=db).render_as_string(hide_password=False)
        asyncio.run(_migrate(url))
        _templates[name] = url
    return _templates[name]


async def _copy_mariadb(template: str, db: str) -> None:
    conn = await aiomysql.connect(**_my_connect_args(make_url(MARIADB_URL)))
    try:
        async with conn.cursor() as cur:
            await cur.execute(f"DROP DATABASE IF EXISTS {db}")
            await cur.execute(f"CREATE DATABASE {db}")
            await cur.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
                (template,),
            )
            tables = [row[0] for row in await cur.fetchall()]
            for table in tables:
                await cur.execute(f"CREATE TABLE {db}.{table} LIKE {template}.{table}")
                await cur.execute(f"INSERT INTO {db}.{table} SELECT * FROM {template}.{table}")
    finally:
        conn.close()


def migrated_database(name: str, tmp_path: Path) -> str:
    """A fresh database of backend ``name`` with the schema at head; returns its URL."""
    template = _template(name, tmp_path.parent)
    if name == "sqlite":
        path = tmp_path / "slotcron-test.db"
        source, target = sqlite3.connect(make_url(template).database or ""), sqlite3.connect(path)
        try:
            source.backup(target)
        finally:
            source.close()
            target.close()
        return f"sqlite+aiosqlite:///{path}"
    db = f"slotcron_t{os.getpid()}_{next(_counter)}"
    base = make_url(POSTGRES_URL if name == "postgresql" else MARIADB_URL)
    if name == "postgresql":
        asyncio.run(_admin(name, f"CREATE DATABASE {db} TEMPLATE {make_url(template).database}"))
    else:
        asyncio.run(_copy_mariadb(make_url(template).database or "", db))
    return base.set(database=db).render_as_string(hide_password=False)


def drop_templates() -> None:
    for name, url in list(_templates.items()):
        if name == "sqlite":
            Path(make_url(url).database or "").unlink(missing_ok=True)
        else:
            with contextlib.suppress(Exception):  # the server went away: nothing left to drop
                drop_database(name, url)
        del _templates[name]
