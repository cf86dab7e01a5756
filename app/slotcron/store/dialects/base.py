"""What slotcron needs of a database family, and the limits every session of ours runs under.

The families themselves are :mod:`.postgresql`, :mod:`.mysql` and :mod:`.sqlite`; no
``if dialect == ...`` lives outside this package.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import asyncpg
from sqlalchemy import ColumnElement, Table, bindparam, event, literal_column, tuple_
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql.dml import Insert
from sqlalchemy.types import TypeEngine

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


def cacheable_insert_new(insert_class: type[Insert], do_nothing: type[Any]) -> type[Insert]:
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
    # Their INSERT ... ON CONFLICT DO NOTHING, cacheable (see cacheable_insert_new).
    insert_new_class: type[Insert] | None = None

    def upsert(self, table: Table, keys: Sequence[str], update: Sequence[str]) -> Insert:
        """An INSERT of the rows it is executed with (one dict each, all with the same keys);
        where one's ``keys`` exist, it updates that row's ``update`` columns.

        The rows are the execution's parameters, not the statement's values: its SQL is made
        for one row and sent with every row's values (SQLAlchemy's executemany). A statement
        holding the rows as values is compiled anew for each list, all its columns times its
        rows, which took most of a 5,000 jobs' start-up (4.8 s)."""
        if self.conflict_insert is None:
            raise NotImplementedError
        stmt = self.conflict_insert(table)
        result: Insert = stmt.on_conflict_do_update(
            index_elements=list(keys), set_={c: stmt.excluded[c] for c in update}
        )
        return result

    def insert_new(self, table: Table) -> Insert:
        """An INSERT that leaves a row whose key exists alone (and inserts nothing for it).
        Its compiled form is cached like any core statement's (see cacheable_insert_new)."""
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
