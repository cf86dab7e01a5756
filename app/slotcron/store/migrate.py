"""Applying the Alembic history, from slotcron itself (``migrate``, auto-migrate).

Alembic is imported only when the schema is not at :data:`HEAD`: a service starting on a
migrated database never loads it (11 MB of a long-lived process's memory)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import inspect, text
from sqlalchemy.engine import URL, Connection
from sqlalchemy.ext.asyncio import AsyncEngine

from slotcron import migrations
from slotcron.store.dialects import Dialect

if TYPE_CHECKING:
    from alembic.config import Config

SCRIPT_LOCATION = str(Path(migrations.__file__).parent)

HEAD = "0011"
"""The newest revision in ``slotcron/migrations/versions`` (a test holds it to Alembic's own
answer)."""


def alembic_config() -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", SCRIPT_LOCATION)
    return config


def head_revision() -> str | None:
    """Alembic's own answer, from the scripts (tests compare it with :data:`HEAD`)."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config()).get_current_head()


async def current_revision(engine: AsyncEngine) -> str | None:
    """The revision the database is at (None when empty), read without Alembic."""

    def read(connection: Connection) -> str | None:
        if not inspect(connection).has_table("alembic_version"):
            return None
        return connection.execute(text("SELECT version_num FROM alembic_version")).scalar()

    async with engine.connect() as conn:
        return await conn.run_sync(read)


async def upgrade(engine: AsyncEngine, dialect: Dialect) -> tuple[str | None, str | None]:
    """Bring the schema to head; return ``(before, after)``. A no-op when already at head."""
    current = await current_revision(engine)
    if current == HEAD:
        return current, current
    from alembic import command
    from alembic.runtime.migration import MigrationContext

    config = alembic_config()

    def run(connection: Connection) -> str | None:
        before = MigrationContext.configure(connection).get_current_revision()
        config.attributes["connection"] = connection
        command.upgrade(config, "head")
        return before

    async with engine.connect() as conn, dialect.migration_lock(conn):
        before = await conn.run_sync(run)
        await conn.commit()
    return before, HEAD


def upgrade_sql(url: URL) -> str:
    """The SQL that ``upgrade`` would run on an empty database of this URL's dialect."""
    from alembic import command

    buffer = io.StringIO()
    config = alembic_config()
    config.output_buffer = buffer
    config.attributes["url"] = url.set(password=None).render_as_string(hide_password=True)
    command.upgrade(config, "head", sql=True)
    return buffer.getvalue()
