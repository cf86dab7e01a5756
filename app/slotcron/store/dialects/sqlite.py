"""SQLite: one writer at a time, the kernel's file times for a clock."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import event
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from slotcron.clock import file_clock
from slotcron.store.dialects.base import (
    BUSY_MAX_SECONDS,
    NOWAIT,
    READ_ONLY,
    Dialect,
    SessionLimits,
    cacheable_insert_new,
)


class SQLite(Dialect):
    """No row locks: ``BEGIN IMMEDIATE`` with no busy wait is the claim's NOWAIT.

    Other transactions wait up to :attr:`busy_ms` for the write lock. WAL lets readers go on
    while one writer holds it. Several processes on one machine can share the file.
    """

    name = "sqlite"
    conflict_insert = staticmethod(sqlite.insert)
    insert_new_class = cacheable_insert_new(sqlite.Insert, sqlite.dml.OnConflictDoNothing)
    single_writer = True

    def __init__(self, limits: SessionLimits | None = None) -> None:
        super().__init__(limits)
        # No server to end a hung peer's transaction: waiting for its write lock is bounded
        # like a lock wait elsewhere, and never past the 5 s SQLite waited before.
        self.busy_ms = round(min(self.limits.lock_wait, BUSY_MAX_SECONDS) * 1000)

    def engine_options(self, url: URL, pool_size: int) -> dict[str, Any]:
        return {"pool_size": pool_size, "max_overflow": 0}

    def configure(self, engine: AsyncEngine) -> None:
        super().configure(engine)

        # The SQLAlchemy recipe for SQLite: take transaction control from the driver so we can
        # say BEGIN IMMEDIATE ourselves (pysqlite's own BEGIN is deferred and upgrades too late).
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
            wait = 0 if options.get(NOWAIT) else self.busy_ms
            info = conn.connection.info
            if info.get("busy_ms") != wait:  # one pragma per change, not per transaction
                conn.exec_driver_sql(f"PRAGMA busy_timeout = {wait}")
                info["busy_ms"] = wait
            conn.exec_driver_sql("BEGIN" if options.get(READ_ONLY) else "BEGIN IMMEDIATE")

    def storage_clock(self, url: URL) -> datetime | None:
        """The kernel's clock, read off the mtime of a file beside the database.

        SQLite has no server clock, and every instance sharing the file runs on this machine:
        the kernel stamping a write is the one clock they all share, even when a process's own
        view of time is off (libfaketime, a wrong TZ-less container clock). The stamp is
        floored to the kernel tick, so an instance may fire a few ms late, never early.
        """
        database = url.database
        if not database or database == ":memory:" or database.startswith("file:"):
            return None
        return file_clock(f"{database}-clock")

    def is_lock_unavailable(self, exc: BaseException) -> bool:
        message = str(getattr(exc, "orig", exc)).lower()
        return "database is locked" in message or "database is busy" in message
