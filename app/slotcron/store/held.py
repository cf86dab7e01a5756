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

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from slotcron.store.database import Database
from slotcron.store.dialects.base import STATEMENT_TIMEOUT

log = logging.getLogger("slotcron.store")

_GENERIC = text("SET plan_cache_mode = force_generic_plan")
_AUTO = text("RESET plan_cache_mode")
TAKE_TIMEOUT = 1.0
"""Seconds taking and setting up the connection, or resetting it, may last; past them it is not
held (the statement takes its own connection at its time, as without one), or dropped."""


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
    driver: Any
    """The driver's connection under :attr:`conn` (asyncpg's)."""
    clean: bool = True
    """False once a statement on it failed: it is dropped, not given back."""
    released: bool = False

    async def release(self) -> None:
        """Back to the pool reset, or dropped (anything failed, timed out or was interrupted:
        never back in the pool set as it is); once."""
        if self.released:
            return
        self.released = True
        reset = False
        try:
            if self.clean:
                async with asyncio.timeout(TAKE_TIMEOUT):
                    await self.conn.execute(_AUTO)
                reset = True
        except Exception:  # dropped below, whatever it was
            reset = False
        finally:
            if not reset:
                await _drop(self.conn)
            else:
                with suppress(Exception):  # its pool judges it on the way back
                    await self.conn.close()


async def _drop(conn: AsyncConnection) -> None:
    """Close ``conn`` for good (its session is not to be reused), whatever state it is in."""
    with suppress(Exception):  # never started, or already gone: closed below
        await conn.invalidate()
    with suppress(Exception):  # nothing more to give back
        await conn.close()


async def hold(db: Database) -> Held | None:
    """A connection on ``db`` in autocommit, set to run its statements on generic plans; None
    where nothing is held (see :func:`holds`), or when none could be had and set up within
    :data:`TAKE_TIMEOUT` (a busy pool, an outage): the statement then takes its own connection
    at its time, and meets the outage there, as without one."""
    if not holds(db):
        return None
    conn = db.engine.connect()
    try:
        async with asyncio.timeout(TAKE_TIMEOUT):
            await conn.start()
            await conn.execution_options(isolation_level="AUTOCOMMIT")
            await conn.execute(_GENERIC)
            driver: Any = (await conn.get_raw_connection()).driver_connection
    except Exception:
        await _drop(conn)
        return None
    except BaseException:
        await _drop(conn)
        raise
    return Held(conn, driver)


async def execute(held: Held, statement: Any, params: dict[str, Any]) -> list[Any] | None:
    """``statement``'s rows (attributes by column name), run by the driver on the held
    connection; None when it was not: no form learnt for it, or the driver raised or took
    longer than a statement may (the connection is then dropped at once, and the caller runs
    the statement its usual way, on a connection of its own)."""
    form = _forms.get(id(statement))
    if form is None or held.released:
        return None
    held.clean = False  # until its answer came
    try:
        async with asyncio.timeout(STATEMENT_TIMEOUT):
            records = await held.driver.fetch(form.sql, *form.bind(params))
    except Exception:
        await held.release()
        return None
    held.clean = True
    return [SimpleNamespace(**dict(record)) for record in records]


async def learn(
    db: Database, conn: AsyncConnection, statement: Any, sentinels: dict[str, Any]
) -> None:
    """Run ``statement`` on ``conn`` as a held connection will (its plan generic), with
    ``sentinels``: a value per named parameter that nothing else in the statement's arguments
    equals, and that makes it write nothing. What the driver received is learnt (its text,
    where each parameter goes), and run once by the driver itself, which prepares it there.
    Where a parameter cannot be found, nothing is learnt: the statement goes its usual way."""
    if not holds(db):
        return
    async with generic_plans(db, conn):
        result = await conn.execute(statement, sentinels)
        context = result.context
        sql, args = context.statement, tuple(context.parameters[0])
        found = {
            name: next(
                (i for i, arg in enumerate(args) if arg == value and type(arg) is type(value)),
                None,
            )
            for name, value in sentinels.items()
        }
        positions = {name: i for name, i in found.items() if i is not None}
        if len(positions) < len(found):
            log.warning("the start marker's statement was not learnt: it goes its usual way")
            return
        form = _Form(sql, args, positions)
        driver: Any = (await conn.get_raw_connection()).driver_connection
        savepoint = await conn.begin_nested()
        try:
            await driver.fetch(form.sql, *form.bind(sentinels))
        except Exception:
            await savepoint.rollback()
            log.warning("the start marker's statement was not learnt: it goes its usual way")
            return
        await savepoint.commit()
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
