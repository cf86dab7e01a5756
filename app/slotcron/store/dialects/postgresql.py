"""PostgreSQL: session limits set on connecting (or with each BEGIN behind a transaction
pooler), arrays bound whole, LISTEN/NOTIFY, an advisory lock for migrations."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
from sqlalchemy import (
    ColumnElement,
    any_,
    bindparam,
    event,
    func,
    literal_column,
    select,
    text,
    tuple_,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql import Select
from sqlalchemy.types import TypeEngine

from slotcron.store.dialects.base import (
    CONNECT_TIMEOUT,
    NOTIFY_PROBE,
    NOTIFY_PROBE_SECONDS,
    STATEMENT_TIMEOUT,
    Dialect,
    Listening,
    SessionLimits,
    cacheable_insert_new,
    log,
)


class PostgreSQL(Dialect):
    name = "postgresql"
    conflict_insert = staticmethod(postgresql.insert)
    insert_new_class = cacheable_insert_new(postgresql.Insert, postgresql.dml.OnConflictDoNothing)
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
