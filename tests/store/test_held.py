"""slotcron.store.held: the connection a burst's marker is written on at its slot, taken ahead,
its statement run by the driver on a generic plan; given back as it was found, or dropped."""

from __future__ import annotations

import asyncio
import time

import pytest
from slotcron.store import held, markers
from slotcron.store.database import Database
from sqlalchemy import event, text

from tests.store.common import EARLY, LEASE, SLOT, claim_ahead, markers_of, register


async def plan_mode(db: Database) -> str:
    async with db.alone(write=False) as conn:
        return str((await conn.execute(text("SHOW plan_cache_mode"))).scalar_one())


async def mark_held(
    db: Database, key: str, ids: list[int], taken: held.Held | None
) -> markers.Marked:
    """The chunk's marker at SLOT, as its kick-off inserts it (on ``taken`` when given)."""
    return await markers.mark(
        db,
        key,
        ids=ids,
        slot=SLOT,
        lease_until=EARLY + LEASE,
        instance_id="me",
        now=SLOT,
        held=taken,
    )


async def learnt(db: Database) -> None:
    """What a warm-up does on each connection: the marker's statement rehearsed."""
    async with db.engine.connect() as conn:
        transaction = await conn.begin()
        try:
            await markers.rehearse(db, conn)
        finally:
            await transaction.rollback()


async def test_only_postgresql_holds_a_connection(db: Database, backend: str) -> None:
    assert held.holds(db) is (backend == "postgresql")
    taken = await held.hold(db)
    assert (taken is not None) is (backend == "postgresql")
    if taken is not None:
        await taken.release()


@pytest.fixture
def pg(db: Database, backend: str) -> Database:
    if backend != "postgresql":
        pytest.skip("a connection is held on PostgreSQL only")
    return db


async def test_a_held_connection_runs_the_marker_by_the_driver_and_goes_back_as_found(
    pg: Database,
) -> None:
    db = Database.connect(pg.engine.url, 1)  # one connection: the one held comes back
    try:
        await learnt(db)
        await register(db, "a", "b")
        key, runs = await claim_ahead(db, "a", "b")
        assert await plan_mode(db) == "auto"

        taken = await held.hold(db)
        assert taken is not None
        mode = await taken.conn.execute(text("SHOW plan_cache_mode"))
        assert mode.scalar_one() == "force_generic_plan"
        through_sqlalchemy: list[str] = []
        seen = lambda *args: through_sqlalchemy.append(args[2])  # noqa: E731
        event.listen(db.engine.sync_engine, "before_cursor_execute", seen)
        try:
            marked = await mark_held(db, key, list(runs.values()), taken)
        finally:
            event.remove(db.engine.sync_engine, "before_cursor_execute", seen)
        assert (marked.started, marked.only, marked.skipped) == (True, None, {})
        assert through_sqlalchemy == [], "run by the driver, not through SQLAlchemy"
        assert taken.clean
        await taken.release()

        assert await markers_of(db) == [(key, "me", SLOT, False)]
        assert await plan_mode(db) == "auto", "given back with its setting reset"
    finally:
        await db.close()


async def test_a_held_connection_that_fails_is_dropped_and_the_marker_goes_its_usual_way(
    pg: Database,
) -> None:
    db = Database.connect(pg.engine.url, 2)
    try:
        await learnt(db)
        await register(db, "a")
        key, runs = await claim_ahead(db, "a")
        taken = await held.hold(db)
        assert taken is not None
        pid = (await taken.conn.execute(text("SELECT pg_backend_pid()"))).scalar_one()
        async with pg.alone(write=True) as conn:  # the server ends that session
            await conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})

        marked = await mark_held(db, key, list(runs.values()), taken)
        assert marked.started, "written on a connection of its own"
        assert not taken.clean
        await taken.release()  # dropped: its session is gone, nothing raised

        assert await markers_of(db) == [(key, "me", SLOT, False)]
        for _ in range(2):  # every connection the pool hands out now is in its usual mode
            assert await plan_mode(db) == "auto"
    finally:
        await db.close()


async def test_generic_plans_sets_the_mode_for_the_block_only(db: Database, backend: str) -> None:
    async with db.engine.connect() as conn:
        async with held.generic_plans(db, conn):
            if backend == "postgresql":
                inside = await conn.execute(text("SHOW plan_cache_mode"))
                assert inside.scalar_one() == "force_generic_plan"
        if backend == "postgresql":
            after = await conn.execute(text("SHOW plan_cache_mode"))
            assert after.scalar_one() == "auto"


async def test_execute_says_none_for_a_statement_it_has_not_learnt(pg: Database) -> None:
    taken = await held.hold(pg)
    assert taken is not None
    try:
        assert await held.execute(taken, text("SELECT 1"), {}) is None
        assert taken.clean
    finally:
        await taken.release()


async def test_learn_is_a_no_op_where_nothing_is_held(db: Database, backend: str) -> None:
    if backend == "postgresql":
        pytest.skip("learnt on PostgreSQL: see the tests above")
    async with db.engine.connect() as conn:
        await held.learn(db, conn, text("SELECT 1"), {})
    assert held._forms.get(id(text("SELECT 1"))) is None


async def test_a_marker_found_in_already_goes_on_with_the_held_connection_given_back(
    pg: Database,
) -> None:
    """The marker's answer was lost, or the chunk was claimed after its slot's marker: the
    held connection's statement finds it ours, and what follows takes a connection of its
    own. With a pool of one, that is the held one, given back first."""
    db = Database.connect(pg.engine.url, 1)
    try:
        await learnt(db)
        await register(db, "a", "b")
        key, runs = await claim_ahead(db, "a", "b")
        ids = list(runs.values())

        assert (await mark_held(db, key, ids, None)).started
        taken = await held.hold(db)
        assert taken is not None
        again = await asyncio.wait_for(mark_held(db, key, ids, taken), 5)
        assert (again.started, again.only) == (True, set(ids))
        assert taken.released
    finally:
        await db.close()


async def test_no_connection_is_held_when_the_pool_has_none_to_give(pg: Database) -> None:
    db = Database.connect(pg.engine.url, 1)
    try:
        async with db.alone(write=False):  # the pool's only connection, busy
            began = time.monotonic()
            assert await held.hold(db) is None
            assert time.monotonic() - began < held.TAKE_TIMEOUT + 1
        taken = await held.hold(db)  # free again: held
        assert taken is not None
        await taken.release()
    finally:
        await db.close()
