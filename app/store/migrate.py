"""Applying the Alembic history, from slotcron itself (``migrate``, auto-migrate)."""

from __future__ import annotations

import io
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import URL, Connection
from sqlalchemy.ext.asyncio import AsyncEngine

import migrations
from app.store.dialects import Dialect

SCRIPT_LOCATION = str(Path(migrations.__file__).parent)


def alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", SCRIPT_LOCATION)
    return config


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


async def current_revision(engine: AsyncEngine) -> str | None:
    def read(connection: Connection) -> str | None:
        return MigrationContext.configure(connection).get_current_revision()

    async with engine.connect() as conn:
        return await conn.run_sync(read)


async def upgrade(engine: AsyncEngine, dialect: Dialect) -> tuple[str | None, str | None]:
    """Bring the schema to head; return ``(before, after)``. A no-op when already at head."""
    config = alembic_config()

    def run(connection: Connection) -> str | None:
        before = MigrationContext.configure(connection).get_current_revision()
        config.attributes["connection"] = connection
        command.upgrade(config, "head")
        return before

    async with engine.connect() as conn, dialect.migration_lock(conn):
        before = await conn.run_sync(run)
        await conn.commit()
    return before, head_revision()


def upgrade_sql(url: URL) -> str:
    """The SQL that ``upgrade`` would run on an empty database of this URL's dialect."""
    buffer = io.StringIO()
    config = alembic_config()
    config.output_buffer = buffer
    config.attributes["url"] = url.set(password=None).render_as_string(hide_password=True)
    command.upgrade(config, "head", sql=True)
    return buffer.getvalue()
