"""A connection taken ahead of a moment whose statement must not wait for anything but the
database: a burst's start marker at its slot (:mod:`slotcron.engine.kickoff`).

At the slot every microsecond is start lag of every body of the burst. Taking a pooled
connection costs half a millisecond, giving it back as much, and PostgreSQL plans the marker's
statement anew on each execution (a custom plan: 1.5-1.9 ms of its 5-7 ms at a 1,000-run
burst's slot, measured on this project's 2-core machine). So the connection is taken a few
milliseconds ahead, set to run the statement on its generic plan (planned once per connection,
at warm-up: :func:`generic_plans`), and given back once the bodies have started.

On the held connection the statement goes straight to the driver (asyncpg), in the form a
warm-up learnt from SQLAlchemy (:func:`learn`): its execution through SQLAlchemy's adapter
cost 1 ms more than the driver's (2.5 ms against 1.4 ms, measured). Anything the driver raises
there sends the statement down its usual path, on a connection of its own, where errors are
judged as everywhere else.

Only where the session is ours between statements: PostgreSQL directly or behind a session
pooler. Behind a transaction pooler a session setting would be left on whichever server ran
it, and nothing is held (:attr:`slotcron.store.dialects.Dialect.keeps_prepared`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import asyncpg
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

from slotcron.store.database import Database

_GENERIC = text("SET plan_cache_mode = force_generic_plan")
_AUTO = text("RESET plan_cache_mode")
_FAILED = (DBAPIError, OSError, TimeoutError)
_DRIVER_FAILED = (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError)


@dataclass(frozen=True)
class _Form:
    """A statement as the driver receives it: its text, and its arguments as learnt (each
    named parameter's position among them)."""

    sql: str
    args: tuple[Any, ...]
    positions: dict[str, int]

    def bind(self, params: dict[str, Any]) -> list[Any]:
        args = list(self.args)
        for name, position in self.positions.items():
            args[position] = params[name]
        return args


_forms: dict[int, _Form] = {}
"""What :func:`learn` learnt, by statement (each lives as long as the process: cached)."""


def holds(db: Database) -> bool:
    """Whether :func:`hold` takes a connection on ``db`` (PostgreSQL, the session ours)."""
    return db.dialect.free_autocommit and db.dialect.keeps_prepared


@dataclass
class Held:
    """A connection held for one statement at a coming moment; :meth:`release` gives it back
    (with its planning setting as it found it), or drops it when anything went wrong."""

    conn: AsyncConnection
    _stack: AsyncExitStack
    driver: Any = None
    """The driver's connection under :attr:`conn` (asyncpg's)."""
    clean: bool = True
    """False once a statement on it failed: it is dropped, not given back."""

    async def release(self) -> None:
        reset = False
        try:
            if self.clean:
                await self.conn.execute(_AUTO)
                reset = True
        except _FAILED:
            pass
        finally:
            try:
                if not reset:  # failed, or interrupted: never back in the pool set as it is
                    await self.conn.invalidate()
            except _FAILED:
                pass
            finally:
                await self._stack.aclose()


async def hold(db: Database) -> Held | None:
    """A connection on ``db`` in autocommit, set to run its statements on generic plans; None
    where nothing is held (see :func:`holds`) or the database did not answer (the statement
    then takes its own connection, and handles the outage as it does)."""
    if not holds(db):
        return None
    stack = AsyncExitStack()
    try:
        conn = await stack.enter_async_context(db.alone(write=True))
        await conn.execute(_GENERIC)
        driver: Any = (await conn.get_raw_connection()).driver_connection
    except _FAILED:
        await stack.aclose()
        return None
    except BaseException:
        await stack.aclose()
        raise
    return Held(conn, stack, driver)


async def execute(held: Held, statement: Any, params: dict[str, Any]) -> list[Any] | None:
    """``statement``'s rows (attributes by column name), run by the driver on the held
    connection; None when it was not (no form learnt for it, or the driver raised: the
    connection is then given up, and the caller runs the statement its usual way)."""
    form = _forms.get(id(statement))
    if form is None or held.driver is None:
        return None
    held.clean = False  # until its answer came
    try:
        records = await held.driver.fetch(form.sql, *form.bind(params))
    except _DRIVER_FAILED:
        return None
    held.clean = True
    return [SimpleNamespace(**dict(record)) for record in records]


async def learn(
    db: Database, conn: AsyncConnection, statement: Any, sentinels: dict[str, Any]
) -> None:
    """Run ``statement`` on ``conn`` as a held connection will (its plan generic), with
    ``sentinels``: a value per named parameter that nothing else in the statement's arguments
    equals, and that makes it write nothing. What the driver received is learnt (its text,
    where each parameter goes), and run once by the driver itself, which prepares it there."""
    if not holds(db):
        return
    async with generic_plans(db, conn):
        result = await conn.execute(statement, sentinels)
        context = result.context
        sql, args = context.statement, tuple(context.parameters[0])
        positions = {
            name: next(i for i, arg in enumerate(args) if arg == value and type(arg) is type(value))
            for name, value in sentinels.items()
        }
        form = _Form(sql, args, positions)
        driver: Any = (await conn.get_raw_connection()).driver_connection
        await driver.fetch(form.sql, *form.bind(sentinels))
    _forms[id(statement)] = form


@asynccontextmanager
async def generic_plans(db: Database, conn: AsyncConnection) -> AsyncIterator[None]:
    """Statements run inside are planned generically on ``conn`` (where :func:`holds`): a
    warm-up runs the held statements so, and their connection keeps the plan."""
    if not holds(db):
        yield
        return
    await conn.execute(_GENERIC)
    try:
        yield
    finally:
        await conn.execute(_AUTO)
