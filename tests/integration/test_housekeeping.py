"""The leader's tick while nothing happens: what it asks, and in how many statements."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

from slotcron.clock import ManualClock
from slotcron.lifeline.leader import Leader
from slotcron.lifeline.roles import Collaborators
from slotcron.store import housekeeping, leadership
from slotcron.store.database import Database
from slotcron.store.tables import LEADER_ROW, executions, leader
from sqlalchemy import event, insert, select

NOW = datetime.now(UTC).replace(microsecond=0)
LEASE = 60.0


@contextmanager
def statements(db: Database) -> Iterator[list[str]]:
    """The statements ``db`` sends inside the block, as the driver is handed them (but for
    SQLite's BEGIN IMMEDIATE, which we send ourselves where the other drivers say BEGIN)."""
    sent: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if not statement.startswith("BEGIN"):
            sent.append(statement)

    event.listen(db.engine.sync_engine, "before_cursor_execute", seen)
    try:
        yield sent
    finally:
        event.remove(db.engine.sync_engine, "before_cursor_execute", seen)


def look(db: Database, instance_id: str, now: datetime) -> Any:
    return housekeeping.renew_and_look(
        db,
        instance_id=instance_id,
        now=now,
        lease=LEASE,
        silent_before=now - timedelta(seconds=LEASE),
        overdue_before=now - timedelta(hours=1),
    )


async def lease_until(db: Database) -> datetime:
    async with db.read() as conn:
        until = (
            await conn.execute(select(leader.c.lease_until).where(leader.c.name == LEADER_ROW))
        ).scalar_one()
    return db.dialect.parse_now(until)


async def add_running(db: Database, slot: int, *, started: bool) -> None:
    async with db.transaction() as conn:
        await conn.execute(
            insert(executions).values(
                job_name="job",
                scheduled_at=NOW + timedelta(seconds=slot),
                trigger="interval",
                status="RUNNING",
                attempt=1,
                instance_id="a",
                created_at=NOW,
                started_at=NOW if started else None,
                lease_until=NOW + timedelta(seconds=LEASE),
                lease_ms=int(LEASE * 1000),
            )
        )


async def test_the_holder_renews_and_is_told_what_there_is_to_do(db: Database) -> None:
    assert await leadership.take(db, instance_id="a", now=NOW, lease=LEASE)
    later = NOW + timedelta(seconds=20)
    todo = await look(db, "a", later)
    assert todo == housekeeping.Pending(0, 0, 0, 0)
    assert await lease_until(db) == later + timedelta(seconds=LEASE)


async def test_a_lease_taken_over_is_not_renewed_and_its_look_is_none(db: Database) -> None:
    assert await leadership.take(db, instance_id="a", now=NOW, lease=LEASE)
    taken = NOW + timedelta(seconds=LEASE + 1)
    assert await leadership.take(db, instance_id="b", now=taken, lease=LEASE)
    assert await look(db, "a", taken + timedelta(seconds=1)) is None
    # b's lease is b's: a's attempt left it as b set it.
    assert await lease_until(db) == taken + timedelta(seconds=LEASE)
    assert (await leadership.current(db))[0] == "b"


async def test_runs_not_yet_started_are_counted_those_started_are_not(db: Database) -> None:
    assert await leadership.take(db, instance_id="a", now=NOW, lease=LEASE)
    await add_running(db, 0, started=True)
    todo = await look(db, "a", NOW)
    assert todo is not None and todo.unstarted_runs == 0
    await add_running(db, 1, started=False)
    await add_running(db, 2, started=False)
    todo = await look(db, "a", NOW)
    assert todo is not None and todo.unstarted_runs == 2 and todo.lapsed_runs == 0


async def test_an_idle_leaders_tick_is_one_statement_where_the_database_allows(
    db: Database,
) -> None:
    clock = ManualClock(NOW)
    lead = Leader(Collaborators(db=db, clock=clock, instance_id="a"), lease=LEASE, period=20)
    await lead.tick()  # takes the lease, and prunes as a new leader does
    assert lead.leading
    clock_now = NOW + timedelta(seconds=20)
    await clock.set(clock_now)  # the next tick, with nothing to do
    with statements(db) as sent:
        await lead.tick()
    assert lead.leading
    # PostgreSQL: the renewal and the look are one statement; elsewhere two. No look for
    # unstarted leases when there is no unstarted run.
    assert len(sent) == (1 if db.dialect.modifying_cte else 2), sent
    assert await lease_until(db) == clock_now + timedelta(seconds=LEASE)
    await add_running(db, 0, started=False)
    await clock.advance(20)
    with statements(db) as sent:
        await lead.tick()
    # Now there is one: when its lease lapses is asked too, and the leader looks then.
    assert len(sent) == (2 if db.dialect.modifying_cte else 3), sent
    assert lead._next_look == NOW + timedelta(seconds=LEASE)
