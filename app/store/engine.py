"""The async engine, configured per dialect."""

from __future__ import annotations

from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from app.store.dialects import Dialect, SQLite, dialect_for

NOWAIT = "slotcron_nowait"
"""Connection execution option: on SQLite, begin without waiting for the write lock."""
READ_ONLY = "slotcron_read_only"
"""Connection execution option: on SQLite, a deferred BEGIN that takes no write lock."""


def make_engine(url: URL, pool_size: int = 10) -> tuple[AsyncEngine, Dialect]:
    dialect = dialect_for(url)
    engine = create_async_engine(url, **dialect.engine_options(url, pool_size))
    if isinstance(dialect, SQLite):
        _configure_sqlite(engine, dialect)
    return engine, dialect


def _configure_sqlite(engine: AsyncEngine, dialect: SQLite) -> None:
    # The SQLAlchemy recipe for SQLite: take transaction control from the driver so we can say
    # BEGIN IMMEDIATE ourselves (pysqlite's own BEGIN is deferred and upgrades too late).
    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: Any) -> None:
        options = conn.get_execution_options()
        wait = 0 if options.get(NOWAIT) else dialect.busy_ms
        info = conn.connection.info
        if info.get("busy_ms") != wait:  # one pragma per change, not per transaction
            conn.exec_driver_sql(f"PRAGMA busy_timeout = {wait}")
            info["busy_ms"] = wait
        conn.exec_driver_sql("BEGIN" if options.get(READ_ONLY) else "BEGIN IMMEDIATE")
