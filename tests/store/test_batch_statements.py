"""slotcron.store.batch_statements: the batch claim's statements, built once per dialect, run
as they are by :func:`slotcron.store.batch.claim_many`."""

from __future__ import annotations

from datetime import timedelta

from slotcron.store import batch_statements
from slotcron.store.database import Database
from slotcron.store.tables import executions

from tests.store.common import LEASE, LEASE_MS, NEXT, NOW, SLOT, job_row, register, table_rows


async def test_the_statements_are_built_once_and_lock_read_insert_and_advance(
    db: Database,
) -> None:
    await register(db, "a", "b", "A")
    sql = batch_statements.batch_statements(db.dialect)
    assert batch_statements.batch_statements(db.dialect) is sql
    assert batch_statements.batch_statements(db.dialect, True) is not sql
    assert (sql.custom_plans is not None) == (db.dialect.name == "postgresql")
    params = batch_statements.run_params(
        ["a", "A"],
        slot=SLOT,
        trigger="cron",
        instance_id="me",
        now=NOW,
        started=NOW,
        start_key=None,
        lease_ms=LEASE_MS,
    )
    assert (params["p_lease_until"], params["p_names"], params["p_slot"]) == (
        NOW + LEASE,
        ["a", "A"],
        SLOT,
    )
    async with db.transaction() as conn:
        locked = {r.name: r for r in await conn.execute(sql.lock, {"p_names": ["a", "A"]})}
        assert set(locked) == {"a", "A"} and locked["a"].fencing_token == 0
        inserted = {r.job_name: r for r in await conn.execute(sql.insert_runs, params)}
        assert {n: r.fencing_token for n, r in inserted.items()} == {"a": 1, "A": 1}
        await conn.execute(
            sql.advance_runs, {"p_names": ["a", "A"], "p_slot": SLOT, "p_next": NEXT}
        )
        await conn.execute(sql.advance, {"p_names": ["b"], "p_slot": SLOT, "p_next": NEXT})
        holders = await conn.execute(
            sql.holders, {"p_names": ["a", "b"], "p_now": NOW + timedelta(seconds=1)}
        )
        assert [(h.job_name, h.instance_id) for h in holders] == [("a", "me")]
        high = dict(
            (await conn.execute(sql.high_water, {"p_names": ["a", "b", "c"]})).tuples().all()
        )
        assert high == {"a": SLOT, "b": SLOT}
    rows = await table_rows(db, executions, order=executions.c.job_name)
    assert [(r["job_name"], r["status"], r["lease_until"], r["started_at"]) for r in rows] == [
        ("A", "RUNNING", NOW + LEASE, NOW),
        ("a", "RUNNING", NOW + LEASE, NOW),
    ]
    for name, token in (("a", 1), ("A", 1), ("b", 0)):
        job = await job_row(db, name)
        assert (job["last_slot_at"], job["next_slot_at"], job["fencing_token"]) == (
            SLOT,
            NEXT,
            token,
        )


async def test_open_among_statement_finds_the_slots_not_closed(db: Database) -> None:
    await register(db, "open", "closed", "Closed")
    async with db.transaction() as conn:
        await conn.execute(
            batch_statements.batch_statements(db.dialect).advance,
            {"p_names": ["closed"], "p_slot": SLOT, "p_next": NEXT},
        )
    statement = batch_statements.open_among_statement(db.dialect)
    assert batch_statements.open_among_statement(db.dialect) is statement
    async with db.read() as conn:
        found = await conn.execute(
            statement, {"p_names": ["open", "closed", "Closed", "gone"], "p_slot": SLOT}
        )
        assert sorted(found.scalars()) == ["Closed", "open"]
        later = await conn.execute(statement, {"p_names": ["closed"], "p_slot": NEXT})
        assert list(later.scalars()) == ["closed"]
