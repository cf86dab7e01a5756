"""MariaDB 10.6+ and MySQL 8."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from sqlalchemy import Table, insert, text
from sqlalchemy.dialects import mysql
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.dml import Insert

from slotcron.store.dialects.base import CONNECT_TIMEOUT, MIGRATION_LOCK_SECONDS, Dialect


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

    def upsert(self, table: Table, keys: Sequence[str], update: Sequence[str]) -> Insert:
        stmt = mysql.insert(table)
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
