"""Alembic environment: async, one history for PostgreSQL, MariaDB/MySQL and SQLite.

slotcron runs migrations on a connection it passes in ``config.attributes["connection"]``
(``slotcron migrate`` and auto-migrate); the ``alembic`` command line works too, taking the URL
from ``SCHEDULER_DATABASE_URL``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from alembic import context
from sqlalchemy.engine import Connection

from slotcron.store.tables import metadata

config = context.config


def _configure(**kwargs: Any) -> None:
    context.configure(
        target_metadata=metadata,
        compare_type=True,
        render_as_batch=True,  # SQLite alters tables by copying them
        **kwargs,
    )


def run_offline() -> None:
    url = config.attributes.get("url") or config.get_main_option("sqlalchemy.url")
    _configure(url=url, literal_binds=True, dialect_opts={"paramstyle": "named"})
    with context.begin_transaction():
        context.run_migrations()


def _run_on(connection: Connection) -> None:
    _configure(connection=connection)
    with context.begin_transaction():
        context.run_migrations()


async def _run_standalone() -> None:
    from slotcron.config import load_settings
    from slotcron.store.engine import make_engine

    settings = load_settings()
    engine, _ = make_engine(settings.url, pool_size=1, pooler=settings.database_pooler)
    async with engine.connect() as conn:
        await conn.run_sync(_run_on)
        await conn.commit()
    await engine.dispose()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run_on(connection)
    else:
        asyncio.run(_run_standalone())


if context.is_offline_mode():
    run_offline()
else:
    run_online()
