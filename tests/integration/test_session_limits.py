"""The server's own limits on each session (issue 11): a session hung inside a transaction must
not hold its locks across a lease, and what a limit raises is an outage waited out, never a
crash. Real PostgreSQL and MariaDB servers; SQLite has no server (its busy wait is bounded)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from slotcron.config import Settings
from slotcron.lifeline.outage import DB_ERRORS, Outage
from slotcron.store.database import Database
from slotcron.store.dialects import SessionLimits, dialect_for
from sqlalchemy import text

LEASE = 3.0
SERVERS = pytest.mark.parametrize("backend", ["postgresql", "mariadb"], indirect=True)


@pytest.mark.parametrize(
    ("lease", "bound"),
    [(3.0, 1.0), (0.2, 1.0), (2.0, 1.0), (6.0, 2.0), (60.0, 20.0), (86400.0, 20.0), (None, 20.0)],
)
def test_limits_are_a_third_of_the_lease_between_one_and_twenty_seconds(
    lease: float | None, bound: float
) -> None:
    limits = SessionLimits.for_lease(lease)
    assert limits.idle_in_transaction == pytest.approx(bound)
    assert limits.lock_wait == pytest.approx(bound)


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_sqlite_waits_for_the_write_lock_a_third_of_the_lease_at_most_5_s(db_url: str) -> None:
    url = Settings(database_url=db_url).url
    assert getattr(dialect_for(url, SessionLimits.for_lease(LEASE)), "busy_ms", None) == 1000
    assert getattr(dialect_for(url, SessionLimits.for_lease(600)), "busy_ms", None) == 5000


@pytest.fixture
async def leased(db_url: str) -> AsyncIterator[Database]:
    """A database handle as an instance with a 3 s lease opens it, and a one-row table."""
    database = Database.connect(Settings(database_url=db_url).url, 3, lease_seconds=LEASE)
    async with database.transaction() as conn:
        await conn.execute(text("CREATE TABLE limits_probe (id INTEGER PRIMARY KEY, v INTEGER)"))
        await conn.execute(text("INSERT INTO limits_probe (id, v) VALUES (1, 0)"))
    yield database
    await database.close()


BUMP = text("UPDATE limits_probe SET v = v + 1 WHERE id = 1")


@SERVERS
async def test_the_server_enforces_the_limits_on_every_session(leased: Database) -> None:
    queries = {
        "postgresql": (
            "SELECT current_setting('idle_in_transaction_session_timeout'), "
            "current_setting('lock_timeout'), current_setting('statement_timeout')",
            ("1s", "1s", "30s"),
        ),
        "mysql": (
            "SELECT @@session.idle_transaction_timeout, @@session.innodb_lock_wait_timeout, "
            "@@session.max_statement_time, @@session.time_zone",
            (1, 1, 30.0, "+00:00"),
        ),
    }
    sql, expected = queries[leased.dialect.name]
    async with leased.read() as conn:
        assert tuple((await conn.execute(text(sql))).one()) == expected


@SERVERS
async def test_a_session_hung_in_a_transaction_loses_its_locks_within_a_third_of_the_lease(
    leased: Database,
) -> None:
    locked = asyncio.Event()
    hung_error: list[BaseException] = []

    async def hang_holding_the_row() -> None:
        try:
            async with leased.transaction() as conn:
                await conn.execute(BUMP)
                locked.set()
                await asyncio.sleep(LEASE)  # hung: nothing sent to the server for a lease
                await conn.execute(text("SELECT 1"))
        except DB_ERRORS as exc:
            hung_error.append(exc)

    hung = asyncio.create_task(hang_holding_the_row())
    await locked.wait()
    began = time.monotonic()

    async def bump() -> None:
        async with leased.transaction() as conn:
            await conn.execute(BUMP)

    # A write that must happen goes through until_done: a lock wait that times out is waited
    # out and tried again, and it commits once the server ended the hung session.
    outage = Outage()
    await outage.until_done("bumping", bump)
    took = time.monotonic() - began
    await hung
    assert took < LEASE * 2 / 3, f"the healthy write waited {took:.1f} s behind a hung session"
    assert hung_error, "the hung session's transaction went on after the server ended it"
    # The ended session's connection was discarded: every pooled connection works.
    async with asyncio.timeout(5):
        for _ in range(3):
            async with leased.read() as conn:
                assert (await conn.execute(text("SELECT v FROM limits_probe"))).scalar() == 1


@SERVERS
async def test_a_lock_wait_past_the_limit_is_an_outage_not_a_crash(leased: Database) -> None:
    # The holder is patient here (it idles while the waiter waits): only the wait is judged.
    patient = {
        "postgresql": "SET LOCAL idle_in_transaction_session_timeout = '10s'",
        "mysql": "SET SESSION idle_transaction_timeout = 10",
    }
    async with leased.transaction() as holder:
        await holder.execute(text(patient[leased.dialect.name]))
        await holder.execute(BUMP)
        began = time.monotonic()
        with pytest.raises(DB_ERRORS) as caught:
            async with leased.transaction() as waiter:
                await waiter.execute(BUMP)
        waited = time.monotonic() - began
    # Unbounded, it would wait for the holder's 10 s.
    assert 0.9 < waited < 5.0, f"the lock wait ended after {waited:.2f} s (limit 1 s)"
    assert leased.dialect.is_lock_unavailable(caught.value)
    assert not leased.dialect.session_ended(caught.value)
