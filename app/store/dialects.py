"""Every difference between PostgreSQL, MariaDB/MySQL and SQLite, behind one small object.

No ``if dialect == ...`` lives outside this module.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import asyncpg
from sqlalchemy import ColumnElement, Table, any_, bindparam, event, literal_column, text
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql.dml import Insert
from sqlalchemy.types import TypeEngine

from app.clock import file_clock

DRIVER_ERRORS: tuple[type[BaseException], ...] = (asyncpg.PostgresError, asyncpg.InterfaceError)
"""Errors a driver raises unwrapped (asyncpg's while connecting; SQLAlchemy wraps the rest)."""

# MySQL/MariaDB: access denied (1044, 1045), unknown database (1049).
_REFUSED_MYSQL = frozenset({1044, 1045, 1049})


def refused_login(exc: BaseException) -> bool:
    """True when the database answered but refused us (credentials, unknown database): a
    configuration error to report, not an outage to wait out. PostgreSQL says so with a
    SQLSTATE of class 28 or 3D000, MySQL/MariaDB with an error number."""
    orig = getattr(exc, "orig", None) or exc
    code = getattr(orig, "sqlstate", None)
    if isinstance(code, str) and (code.startswith("28") or code == "3D000"):
        return True
    args: tuple[object, ...] = tuple(getattr(orig, "args", ()))
    return len(args) > 0 and args[0] in _REFUSED_MYSQL


CONNECT_TIMEOUT = 10.0
"""Seconds to open a connection, on every driver that takes it."""
POOL_TIMEOUT = 10.0
"""Seconds to wait for a pooled connection."""
STATEMENT_TIMEOUT = 30.0
"""Seconds one statement (asyncpg's command timeout) or one whole transaction (every backend:
:class:`app.store.database.Database`) may take before it is abandoned as an outage."""

NOWAIT = "slotcron_nowait"
"""Connection execution option: on SQLite, begin without waiting for the write lock."""
READ_ONLY = "slotcron_read_only"
"""Connection execution option: on SQLite, a deferred BEGIN that takes no write lock."""


class Dialect:
    """What slotcron needs to know about one database family."""

    name = "base"
    # True where the database has one writer at a time: our own writers then queue in-process
    # rather than spin on the database's lock (which is left to writers of other processes).
    single_writer = False
    # The database's clock, sampled for guarantee 5; None: the database has no clock of its own.
    now_sql: str | None = None
    # True where a statement in autocommit costs one round trip and switching to it none.
    free_autocommit = False
    # True where UPDATE ... RETURNING exists (not MySQL/MariaDB).
    update_returning = True

    def engine_options(self, url: URL, pool_size: int) -> dict[str, Any]:
        # SCHEDULER_POOL_SIZE is the instance's whole allowance of connections: no overflow.
        return {
            "pool_size": pool_size,
            "max_overflow": 0,
            # No pre-ping: it costs a round trip per checkout, and every caller already retries
            # a lost connection (a disconnect invalidates the whole pool).
            "pool_recycle": 1800,
            # Waiting for a pooled connection is bounded too: a timeout is an outage.
            "pool_timeout": POOL_TIMEOUT,
        }

    def configure(self, engine: AsyncEngine) -> None:
        """Set up a new engine's connections for this database (SQLite only)."""

    def is_lock_unavailable(self, exc: BaseException) -> bool:
        """True when ``exc`` says the NOWAIT row lock (or a deadlock victim's) was refused."""
        return False

    def among(
        self, column: ColumnElement[Any], name: str, element: TypeEngine[Any]
    ) -> ColumnElement[bool]:
        """``column IN (:name)`` for a list bound at execution. Expanded here; PostgreSQL binds
        one array, so the statement text (and its prepared plan) does not change with the
        list's length."""
        return column.in_(bindparam(name, expanding=True))

    # PostgreSQL's and SQLite's insert, whose ON CONFLICT ... DO UPDATE the two share.
    conflict_insert: Callable[[Table], Any] | None = None

    def upsert(
        self,
        table: Table,
        rows: Sequence[Mapping[str, Any]],
        keys: Sequence[str],
        update: Sequence[str],
    ) -> Insert:
        """Insert ``rows``; where one's ``keys`` exist, update its ``update`` columns."""
        if self.conflict_insert is None:
            raise NotImplementedError
        stmt = self.conflict_insert(table).values(list(rows))
        result: Insert = stmt.on_conflict_do_update(
            index_elements=list(keys), set_={c: stmt.excluded[c] for c in update}
        )
        return result

    @asynccontextmanager
    async def migration_lock(self, conn: AsyncConnection) -> AsyncIterator[None]:
        """Serialise concurrent ``migrate`` runs from several instances starting at once."""
        yield

    def storage_clock(self, url: URL) -> datetime | None:
        """A clock for databases without one of their own; None: use this machine's."""
        return None

    async def notify(self, conn: AsyncConnection, channel: str, payload: str) -> None:
        """Tell listeners on ``channel`` once ``conn``'s transaction commits (no-op where the
        database cannot: its listeners poll)."""

    async def listen(
        self, engine: AsyncEngine, channel: str, on_message: Callable[[str], None]
    ) -> Listening | None:
        """Hold a pooled connection listening on ``channel``; None where the database has no
        notifications."""
        return None

    def server_now(self) -> ColumnElement[Any] | None:
        """The database's own clock as a SQL expression, read when the statement runs; None
        where the database has no clock of its own (SQLite: its storage clock is sampled)."""
        return literal_column(self.now_sql.removeprefix("SELECT ")) if self.now_sql else None

    def parse_now(self, value: Any) -> datetime:
        if isinstance(value, datetime):
            return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
        raise TypeError(f"unexpected clock value {value!r}")


class Listening:
    """A pooled connection held for notifications, until closed or lost."""

    def __init__(self, conn: AsyncConnection, driver: Any, channel: str, callback: Any) -> None:
        self._conn = conn
        self._driver = driver
        self._channel = channel
        self._callback = callback

    @property
    def alive(self) -> bool:
        return not self._driver.is_closed()

    async def close(self) -> None:
        if self.alive:
            with contextlib.suppress(Exception):
                await self._driver.remove_listener(self._channel, self._callback)
        with contextlib.suppress(Exception):
            await self._conn.close()


class PostgreSQL(Dialect):
    name = "postgresql"
    conflict_insert = staticmethod(postgresql.insert)
    free_autocommit = True  # asyncpg: autocommit is simply not sending BEGIN
    now_sql = "SELECT clock_timestamp()"
    _LOCK_CODES = frozenset({"55P03", "40P01", "40001"})

    def engine_options(self, url: URL, pool_size: int) -> dict[str, Any]:
        options = super().engine_options(url, pool_size)
        # Named in pg_stat_activity, so a DBA sees whose connections these are.
        options["connect_args"] = {
            "server_settings": {"application_name": "slotcron"},
            "timeout": CONNECT_TIMEOUT,
            "command_timeout": STATEMENT_TIMEOUT,
        }
        return options

    def is_lock_unavailable(self, exc: BaseException) -> bool:
        code = getattr(getattr(exc, "orig", None), "sqlstate", None) or getattr(
            getattr(exc, "orig", None), "pgcode", None
        )
        return code in self._LOCK_CODES

    def among(
        self, column: ColumnElement[Any], name: str, element: TypeEngine[Any]
    ) -> ColumnElement[bool]:
        return column == any_(bindparam(name, type_=postgresql.ARRAY(element)))

    def server_now(self) -> ColumnElement[Any] | None:
        # statement_timestamp() is STABLE (clock_timestamp() is VOLATILE): compared with it, a
        # lease can still bound an index scan, and it is this statement's own start time.
        return literal_column("statement_timestamp()")

    async def notify(self, conn: AsyncConnection, channel: str, payload: str) -> None:
        await conn.execute(
            text("SELECT pg_notify(:channel, :payload)"), {"channel": channel, "payload": payload}
        )

    async def listen(
        self, engine: AsyncEngine, channel: str, on_message: Callable[[str], None]
    ) -> Listening | None:
        conn = await engine.connect()
        try:
            driver: Any = (await conn.get_raw_connection()).driver_connection

            def callback(_conn: Any, _pid: int, _channel: str, payload: str) -> None:
                on_message(payload)

            await driver.add_listener(channel, callback)
            # A lost connection is news too: the listener polls and listens again.
            driver.add_termination_listener(lambda _conn: on_message(""))
        except BaseException:
            await conn.close()
            raise
        return Listening(conn, driver, channel, callback)

    @asynccontextmanager
    async def migration_lock(self, conn: AsyncConnection) -> AsyncIterator[None]:
        # Released by the migration's commit.
        await conn.execute(text("SELECT pg_advisory_xact_lock(7301991)"))
        yield


class MySQL(Dialect):
    """MariaDB 10.6+ and MySQL 8: ``FOR UPDATE NOWAIT`` and ``SKIP LOCKED``, ``DATETIME(6)``
    read as UTC."""

    name = "mysql"
    now_sql = "SELECT UTC_TIMESTAMP(6)"
    update_returning = False
    # 3572: MySQL's NOWAIT refusal; 1205: MariaDB's (lock wait timeout); 1213: deadlock victim.
    _LOCK_CODES = frozenset({3572, 1205, 1213})

    def engine_options(self, url: URL, pool_size: int) -> dict[str, Any]:
        options = super().engine_options(url, pool_size)
        # Read committed: the overlap check must see runs committed after this transaction began.
        options["isolation_level"] = "READ COMMITTED"
        options["connect_args"] = {
            "init_command": "SET time_zone = '+00:00'",
            "connect_timeout": CONNECT_TIMEOUT,
        }
        return options

    def is_lock_unavailable(self, exc: BaseException) -> bool:
        args: tuple[object, ...] = tuple(getattr(getattr(exc, "orig", None), "args", ()))
        return len(args) > 0 and args[0] in self._LOCK_CODES

    def upsert(
        self,
        table: Table,
        rows: Sequence[Mapping[str, Any]],
        keys: Sequence[str],
        update: Sequence[str],
    ) -> Insert:
        stmt = mysql.insert(table).values(list(rows))
        return stmt.on_duplicate_key_update({c: stmt.inserted[c] for c in update})

    @asynccontextmanager
    async def migration_lock(self, conn: AsyncConnection) -> AsyncIterator[None]:
        # A named lock belongs to the session, not the transaction: release it explicitly, or
        # the pooled connection keeps it and the next instance waits out the timeout.
        granted = (await conn.execute(text("SELECT GET_LOCK('slotcron_migrate', 120)"))).scalar()
        if granted != 1:
            raise TimeoutError("another instance held the migration lock for 120 s")
        try:
            yield
        finally:
            await conn.execute(text("SELECT RELEASE_LOCK('slotcron_migrate')"))


class SQLite(Dialect):
    """No row locks: ``BEGIN IMMEDIATE`` with no busy wait is the claim's NOWAIT.

    Other transactions wait up to :attr:`busy_ms` for the write lock. WAL lets readers go on
    while one writer holds it. Several processes on one machine can share the file.
    """

    name = "sqlite"
    conflict_insert = staticmethod(sqlite.insert)
    busy_ms = 5000
    single_writer = True

    def engine_options(self, url: URL, pool_size: int) -> dict[str, Any]:
        return {"pool_size": pool_size, "max_overflow": 0}

    def configure(self, engine: AsyncEngine) -> None:
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


def dialect_for(url: URL) -> Dialect:
    backend = url.get_backend_name()
    if backend == "postgresql":
        return PostgreSQL()
    if backend in ("mysql", "mariadb"):
        return MySQL()
    if backend == "sqlite":
        return SQLite()
    raise ValueError(f"unsupported database backend {backend!r}")
