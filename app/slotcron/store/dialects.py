"""Every difference between PostgreSQL, MariaDB/MySQL and SQLite, behind one small object.

No ``if dialect == ...`` lives outside this module.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import asyncpg
from sqlalchemy import (
    ColumnElement,
    Table,
    any_,
    bindparam,
    event,
    func,
    insert,
    literal_column,
    select,
    text,
    tuple_,
)
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql import Select
from sqlalchemy.sql.dml import Insert
from sqlalchemy.types import TypeEngine

from slotcron.clock import file_clock
from slotcron.store.pool import SheddingPool

log = logging.getLogger("slotcron.database")

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
:class:`slotcron.store.database.Database`) may take before it is abandoned as an outage."""

SESSION_TIMEOUT_MIN = 1.0
"""The least a session may idle in a transaction or wait for a lock (MariaDB counts whole
seconds)."""
SESSION_TIMEOUT_MAX = 20.0
"""The most: no transaction of ours idles or waits this long when the database is healthy."""


@dataclass(frozen=True)
class SessionLimits:
    """What the database server itself enforces on each of our sessions.

    A peer whose database path hangs mid-transaction (a frozen network, a paused process) keeps
    its row locks for as long as the server keeps its session, and every healthy instance's
    renewal or outcome write on those rows waits behind it: past a lease, healthy runs are
    judged dead. So the server ends a session idle inside a transaction after
    ``idle_in_transaction`` s (its locks go with it), and no statement waits for a lock longer
    than ``lock_wait`` s: both a third of the lease, so a lock is never held across a lease.
    Client-side deadlines cannot do this: the hung side's client is the one that cannot act.
    """

    idle_in_transaction: float
    lock_wait: float
    statement: float = STATEMENT_TIMEOUT

    @classmethod
    def for_lease(cls, lease_seconds: float | None) -> SessionLimits:
        """A third of the lease, between :data:`SESSION_TIMEOUT_MIN` and
        :data:`SESSION_TIMEOUT_MAX`; ``None`` (no lease: the command line, the HTTP reader, a
        migration) the maximum."""
        third = SESSION_TIMEOUT_MAX if lease_seconds is None else lease_seconds / 3
        bound = min(max(third, SESSION_TIMEOUT_MIN), SESSION_TIMEOUT_MAX)
        return cls(idle_in_transaction=bound, lock_wait=bound)

    def milliseconds(self, seconds: float) -> str:
        return str(round(seconds * 1000))

    def whole_seconds(self, seconds: float) -> int:
        """Floored (never past the bound), at least 1 (0 means "no limit" to MariaDB)."""
        return max(1, math.floor(seconds))


MIGRATION_LOCK_SECONDS = 120.0
"""Seconds a migration waits for another instance's to finish."""
BUSY_MAX_SECONDS = 5.0
"""The most a SQLite transaction waits for another's write lock."""

NOTIFY_PROBE = "slotcron-probe:"
"""The payloads a listener sends itself to find out whether notifications reach it."""
NOTIFY_PROBE_SECONDS = 2.0
"""How long a new listener waits for its own probe before it falls back to polling."""

NOWAIT = "slotcron_nowait"
"""Connection execution option: on SQLite, begin without waiting for the write lock."""
READ_ONLY = "slotcron_read_only"
"""Connection execution option: on SQLite, a deferred BEGIN that takes no write lock."""


def _cacheable_insert_new(insert_class: type[Insert], do_nothing: type[Any]) -> type[Insert]:
    """``insert_class`` (PostgreSQL's or SQLite's INSERT) that always ends ``ON CONFLICT DO
    NOTHING``, and whose compiled SQL SQLAlchemy caches.

    SQLAlchemy 2.0 caches no dialect-specific INSERT (``inherit_cache = False``) nor its
    ON CONFLICT clause (no cache key): each execution compiles the statement anew, 5 ms for the
    start marker, paid by every body of a burst as start lag. A DO NOTHING with no conflict
    target has nothing to key, so the clause's class is its key; the INSERT keeps core's cache
    key, which covers the clause (``_post_values_clause``). ``tests/test_dialects.py`` checks
    both the SQL and that it is cached."""

    class DoNothing(do_nothing):  # type: ignore[misc]
        _traverse_internals: list[Any] = []  # no target, no WHERE: the class is the key

    class InsertNew(insert_class):  # type: ignore[misc, valid-type]
        inherit_cache = True  # core INSERT's cache key, which includes the clause below

        def __init__(self, table: Table) -> None:
            super().__init__(table)
            self._post_values_clause = DoNothing()

    return InsertNew


POOLERS = ("none", "session", "transaction")
"""What may sit between slotcron and PostgreSQL (``SCHEDULER_DATABASE_POOLER``): nothing,
or PgBouncer in one of its pool modes."""


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
    # True where INSERT and UPDATE can be common table expressions of one statement.
    modifying_cte = False
    # True where a statement prepared once on a connection is kept there (worth rehearsing).
    keeps_prepared = True
    # True where a connection of the pool can be held to listen for notifications.
    listens = False

    def __init__(self, limits: SessionLimits | None = None, pooler: str = "none") -> None:
        self.limits = limits or SessionLimits.for_lease(None)
        self.pooler = pooler
        self.on_read_only: Callable[[], None] = lambda: None
        """Called when a write was refused as read-only (the Database listens)."""

    def engine_options(self, url: URL, pool_size: int) -> dict[str, Any]:
        # SCHEDULER_POOL_SIZE is the instance's whole allowance of connections: no overflow.
        return {
            "pool_size": pool_size,
            "max_overflow": 0,
            # No pre-ping: it costs a round trip per checkout, and every caller already retries
            # a lost connection (a disconnect invalidates the whole pool).
            "pool_recycle": 1800,
            # The connection returned last is handed out first: an idle instance's few
            # statements keep to one or two connections, whose prepared statements they reuse
            # (in turn through the whole pool, each would be prepared on every connection: a
            # round trip, and a transaction of the server's, more).
            "pool_use_lifo": True,
            # Waiting for a pooled connection is bounded too: a timeout is an outage.
            "pool_timeout": POOL_TIMEOUT,
            # Connections an idle instance does not use are closed (Database.shed_idle).
            "poolclass": SheddingPool,
        }

    def configure(self, engine: AsyncEngine) -> None:
        """Set up a new engine's connections for this database."""

        @event.listens_for(engine.sync_engine, "handle_error")
        def _on_error(context: Any) -> None:
            # A session the server ended (our own idle-in-transaction limit, a DBA's kill) is
            # gone: its connection is discarded, never handed out again. The rest of the pool
            # is sound (the server is up), so only this connection goes.
            if self.session_ended(context.original_exception):
                context.is_disconnect = True
                context.invalidate_pool_on_disconnect = False
            elif self.read_only_refusal(context.original_exception):
                # This server takes no writes (a standby, a demoted primary): every pooled
                # connection is on it. All are dropped, and the next ones are opened anew (a
                # multi-host URL with target_session_attrs=read-write then finds the primary).
                context.is_disconnect = True
                context.invalidate_pool_on_disconnect = True
                self.on_read_only()

    def session_ended(self, exc: BaseException) -> bool:
        """True when ``exc`` says the server ended this session (its connection is unusable)."""
        return False

    def read_only_refusal(self, exc: BaseException) -> bool:
        """True when ``exc`` says the server refused a write because it is read-only."""
        return False

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

    def among_rows(self, columns: Sequence[ColumnElement[Any]], name: str) -> ColumnElement[bool]:
        """``(c1, c2, ...) IN (rows)`` for rows bound at execution with :meth:`rows`: an exact
        match of several columns together, not of each column among a list of its own."""
        return tuple_(*columns).in_(bindparam(name, expanding=True))

    def rows(self, name: str, rows: Sequence[Sequence[Any]], width: int) -> dict[str, Any]:
        """The parameters that bind ``rows`` (each of ``width`` values) to :meth:`among_rows`'
        ``name``."""
        return {name: [tuple(row) for row in rows]}

    # PostgreSQL's and SQLite's insert, whose ON CONFLICT ... DO UPDATE the two share.
    conflict_insert: Callable[[Table], Any] | None = None
    # Their INSERT ... ON CONFLICT DO NOTHING, cacheable (see _cacheable_insert_new).
    insert_new_class: type[Insert] | None = None

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

    def insert_new(self, table: Table) -> Insert:
        """An INSERT that leaves a row whose key exists alone (and inserts nothing for it).
        Its compiled form is cached like any core statement's (see _cacheable_insert_new)."""
        if self.insert_new_class is None:
            raise NotImplementedError
        return self.insert_new_class(table)

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
    insert_new_class = _cacheable_insert_new(postgresql.Insert, postgresql.dml.OnConflictDoNothing)
    modifying_cte = True
    free_autocommit = True  # asyncpg: autocommit is simply not sending BEGIN
    now_sql = "SELECT clock_timestamp()"
    # 55P03 is also lock_timeout's: a lock waited for too long is a busy row, tried again.
    _LOCK_CODES = frozenset({"55P03", "40P01", "40001"})
    # Idle-in-transaction timeout, administrator command, crash shutdown.
    _ENDED_CODES = frozenset({"25P03", "57P01", "57P02", "57P05"})

    listens = True

    def __init__(self, limits: SessionLimits | None = None, pooler: str = "none") -> None:
        super().__init__(limits, pooler)
        if pooler == "transaction":
            # PgBouncer in transaction mode hands each transaction to any server connection:
            # nothing may live in the session. A statement outside a transaction is sent in two
            # round trips (prepare, then bind and execute), each of which may reach another
            # server: every statement goes inside a transaction, where the server is ours.
            self.free_autocommit = False
            self.keeps_prepared = False
            self.listens = False  # a LISTEN would be left on whichever server ran it

    def session_settings(self) -> dict[str, str]:
        """What the server enforces on each of our transactions (guarantee 7), and that a
        claim is acknowledged only once a synchronous standby has it, whatever the cluster's
        default (a failover must not lose an acknowledged claim)."""
        ms = self.limits.milliseconds
        return {
            "idle_in_transaction_session_timeout": ms(self.limits.idle_in_transaction),
            "lock_timeout": ms(self.limits.lock_wait),
            "statement_timeout": ms(self.limits.statement),
            "synchronous_commit": "on",
        }

    def engine_options(self, url: URL, pool_size: int) -> dict[str, Any]:
        options = super().engine_options(url, pool_size)
        connect_args: dict[str, Any] = {
            # Only what every pooler accepts goes into the start-up packet (PgBouncer refuses a
            # connection that carries anything else): named in pg_stat_activity, so a DBA sees
            # whose connections these are. The limits are set after it (see configure).
            "server_settings": {"application_name": "slotcron"},
            "timeout": CONNECT_TIMEOUT,
            "command_timeout": STATEMENT_TIMEOUT,
        }
        if self.pooler == "transaction":
            settings = self.session_settings()
            connect_args.update(
                # No statement is kept on a server connection: each is prepared unnamed, inside
                # its transaction, and replaced by the next (a named one would be another
                # client's on the next server, or missing there).
                statement_cache_size=0,
                prepared_statement_cache_size=0,
                prepared_statement_name_func=_unnamed,
                # The limits travel with each transaction's BEGIN, in its one round trip.
                connection_class=_connection_with_prologue(
                    " ".join(f"SET LOCAL {name} = '{value}';" for name, value in settings.items())
                ),
            )
        options["connect_args"] = connect_args
        return options

    def configure(self, engine: AsyncEngine) -> None:
        super().configure(engine)
        if self.pooler == "transaction":
            return
        # Directly or through a session pooler the session is ours for as long as the
        # connection: the limits are set once on it, in one round trip when it opens.
        settings = self.session_settings().items()
        session = " ".join(f"SET {name} = '{value}';" for name, value in settings)

        @event.listens_for(engine.sync_engine, "connect")
        def _on_connect(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.run_async(lambda conn: conn.execute(session))

    def is_lock_unavailable(self, exc: BaseException) -> bool:
        code = getattr(getattr(exc, "orig", None), "sqlstate", None) or getattr(
            getattr(exc, "orig", None), "pgcode", None
        )
        return code in self._LOCK_CODES

    def session_ended(self, exc: BaseException) -> bool:
        return getattr(exc, "sqlstate", None) in self._ENDED_CODES

    def read_only_refusal(self, exc: BaseException) -> bool:
        # 25006: read_only_sql_transaction (a hot standby, default_transaction_read_only).
        return getattr(exc, "sqlstate", None) == "25006"

    def among(
        self, column: ColumnElement[Any], name: str, element: TypeEngine[Any]
    ) -> ColumnElement[bool]:
        return column == any_(bindparam(name, type_=postgresql.ARRAY(element)))

    def among_rows(self, columns: Sequence[ColumnElement[Any]], name: str) -> ColumnElement[bool]:
        # One array per column, unnested together: the statement's text does not change with
        # the number of rows (one prepared plan: a nested loop of index lookups).
        arrays = [
            bindparam(f"{name}_{i}", type_=postgresql.ARRAY(column.type))
            for i, column in enumerate(columns)
        ]
        unnested: Select[Any] = select(literal_column("*")).select_from(func.unnest(*arrays))
        return tuple_(*columns).in_(unnested)

    def rows(self, name: str, rows: Sequence[Sequence[Any]], width: int) -> dict[str, Any]:
        return {f"{name}_{i}": [row[i] for row in rows] for i in range(width)}

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
        if not self.listens:
            return None
        conn = await engine.connect()
        probe = f"{NOTIFY_PROBE}{secrets.token_hex(8)}"
        heard = asyncio.Event()
        try:
            driver: Any = (await conn.get_raw_connection()).driver_connection

            def callback(_conn: Any, _pid: int, _channel: str, payload: str) -> None:
                if payload == probe:
                    heard.set()
                elif not payload.startswith(NOTIFY_PROBE):
                    on_message(payload)

            await driver.add_listener(channel, callback)
            # A lost connection is news too: the listener polls and listens again.
            driver.add_termination_listener(lambda _conn: on_message(""))
            # Heard only where this session really listens: behind a pooler that hands each
            # statement to any server (transaction mode, whatever we were told), it is not.
            await driver.execute("SELECT pg_notify($1, $2)", channel, probe)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(NOTIFY_PROBE_SECONDS):
                    await heard.wait()
        except BaseException:
            await conn.close()
            raise
        listening = Listening(conn, driver, channel, callback)
        if not heard.is_set():
            await listening.close()
            self.listens = False
            log.warning(
                "a notification sent on this connection did not come back within %g s (is a "
                "pooler in transaction mode in front? then set SCHEDULER_DATABASE_POOLER="
                "transaction): polling for queued runs and schedule writes instead",
                NOTIFY_PROBE_SECONDS,
            )
            return None
        return listening

    @asynccontextmanager
    async def migration_lock(self, conn: AsyncConnection) -> AsyncIterator[None]:
        # A migration may wait for its lock and for the tables' (bounded by the command
        # timeout) and work between statements: this transaction only, the session's limits
        # are lifted. Released by the migration's commit.
        await conn.execute(
            text(
                "SELECT set_config('lock_timeout', '0', true), "
                "set_config('idle_in_transaction_session_timeout', '0', true)"
            )
        )
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
    # 1927: the connection was killed; 4031: MySQL's inactivity disconnect.
    _ENDED_CODES = frozenset({1927, 4031})

    def engine_options(self, url: URL, pool_size: int) -> dict[str, Any]:
        options = super().engine_options(url, pool_size)
        # Read committed: the overlap check must see runs committed after this transaction began.
        options["isolation_level"] = "READ COMMITTED"
        limits, whole = self.limits, self.limits.whole_seconds
        options["connect_args"] = {
            # One statement on connecting. ``/*M! ... */`` is run by MariaDB only: MySQL has no
            # idle-transaction timeout (and its max_execution_time bounds only SELECTs).
            "init_command": (
                "SET time_zone = '+00:00' /*M!, "
                f"idle_transaction_timeout = {whole(limits.idle_in_transaction)}, "
                f"max_statement_time = {limits.statement:g} */, "
                f"innodb_lock_wait_timeout = {whole(limits.lock_wait)}"
            ),
            "connect_timeout": CONNECT_TIMEOUT,
        }
        return options

    def is_lock_unavailable(self, exc: BaseException) -> bool:
        args: tuple[object, ...] = tuple(getattr(getattr(exc, "orig", None), "args", ()))
        return len(args) > 0 and args[0] in self._LOCK_CODES

    def session_ended(self, exc: BaseException) -> bool:
        args: tuple[object, ...] = tuple(getattr(exc, "args", ()))
        return len(args) > 0 and args[0] in self._ENDED_CODES

    def read_only_refusal(self, exc: BaseException) -> bool:
        # 1290: the server runs with --read-only (or super_read_only); 1792: a read-only
        # transaction.
        args: tuple[object, ...] = tuple(getattr(exc, "args", ()))
        return len(args) > 0 and args[0] in (1290, 1792)

    def upsert(
        self,
        table: Table,
        rows: Sequence[Mapping[str, Any]],
        keys: Sequence[str],
        update: Sequence[str],
    ) -> Insert:
        stmt = mysql.insert(table).values(list(rows))
        return stmt.on_duplicate_key_update({c: stmt.inserted[c] for c in update})

    def insert_new(self, table: Table) -> Insert:
        # The core INSERT (cacheable; MySQL's own is not) with the prefix.
        return insert(table).prefix_with("IGNORE")

    @asynccontextmanager
    async def migration_lock(self, conn: AsyncConnection) -> AsyncIterator[None]:
        # A named lock belongs to the session, not the transaction: release it explicitly, or
        # the pooled connection keeps it and the next instance waits out the timeout.
        # Asked for a second at a time: one statement may not run past max_statement_time.
        deadline = asyncio.get_running_loop().time() + MIGRATION_LOCK_SECONDS
        while True:
            lock = text("SELECT GET_LOCK('slotcron_migrate', 1)")
            if (await conn.execute(lock)).scalar() == 1:
                break
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(
                    f"another instance held the migration lock for {MIGRATION_LOCK_SECONDS:g} s"
                )
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
    insert_new_class = _cacheable_insert_new(sqlite.Insert, sqlite.dml.OnConflictDoNothing)
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


def _unnamed() -> str:
    """asyncpg's name for an unnamed statement (see PostgreSQL.engine_options)."""
    return ""


def _connection_with_prologue(prologue: str) -> type[asyncpg.Connection]:
    """An asyncpg connection whose every BEGIN carries ``prologue`` in the same message.

    asyncpg sends a transaction's BEGIN as a simple query with no parameters, which may hold
    several statements: ``SET LOCAL`` statements appended to it cost no round trip."""

    class Connection(asyncpg.Connection):  # type: ignore[misc]
        async def execute(self, query: str, *args: Any, timeout: float | None = None) -> str:
            if not args and query.startswith("BEGIN"):
                query = f"{query} {prologue}"
            result: str = await super().execute(query, *args, timeout=timeout)
            return result

    return Connection


def dialect_for(url: URL, limits: SessionLimits | None = None, pooler: str = "none") -> Dialect:
    backend = url.get_backend_name()
    if backend == "postgresql":
        return PostgreSQL(limits, pooler)
    if backend in ("mysql", "mariadb"):
        return MySQL(limits)
    if backend == "sqlite":
        return SQLite(limits)
    raise ValueError(f"unsupported database backend {backend!r}")
