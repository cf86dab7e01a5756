"""slotcron.store.batch: a burst decided in one transaction, by the rules of the single claim."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from slotcron.store import batch
from slotcron.store.batch import Decided
from slotcron.store.database import Database
from slotcron.store.tables import executions

from tests.store.common import (
    EARLY,
    LEASE,
    NEXT,
    NOW,
    SLOT,
    add_run,
    due,
    job_row,
    register,
    run_row,
    set_job,
    table_rows,
)


async def test_claim_many_decides_each_job_as_a_single_claim_would(db: Database) -> None:
    names = ["open", "paused", "overlap", "taken", "gap", "moved", "missed", "allow"]
    await register(db, *names)
    await set_job(db, "paused", paused=True, paused_reason="ops")
    await set_job(db, "taken", last_slot_at=SLOT)
    await set_job(db, "gap", next_slot_at=SLOT - timedelta(minutes=3))
    await set_job(db, "moved", fingerprint="in-force")
    holder = await add_run(db, "overlap", SLOT - timedelta(minutes=1), instance="b")
    await add_run(db, "allow", SLOT - timedelta(minutes=1), instance="b")
    items = [
        due("open"),
        due("paused"),
        due("overlap"),
        due("taken"),
        due("gap"),
        due("moved", fingerprint="older"),
        due("missed", missed_reason="misfire"),
        due("allow", forbid=False),
        due("nobody"),
    ]

    decided = await batch.claim_many(db, items, instance_id="a", now=NOW)

    statuses = {n: (c.status, c.reason) for n, c in decided.claims.items()}
    assert statuses == {
        "open": ("RUNNING", None),
        "allow": ("RUNNING", None),
        "paused": ("SKIPPED", "job is paused: ops"),
        "overlap": (
            "SKIPPED",
            f"overlap: execution {holder} is still running on b (overlap='forbid')",
        ),
        "missed": ("MISSED", "misfire"),
    }
    assert decided.taken == {"taken", "moved", "nobody"} and decided.superseded == {"moved"}
    assert [d.job_name for d in decided.undecided] == ["gap"]
    assert decided.expected == {"gap": SLOT - timedelta(minutes=3)}
    assert (decided.held, decided.deferred, decided.start_keys) == ([], [], {})
    run = decided.claims["open"]
    assert (run.fencing_token, run.lease_until, run.started) == (1, NOW + LEASE, True)
    row = await run_row(db, run.execution_id)
    assert (row["status"], row["instance_id"], row["started_at"], row["fencing_token"]) == (
        "RUNNING",
        "a",
        NOW,
        1,
    )
    for name in ("open", "paused", "overlap", "missed", "allow"):
        job = await job_row(db, name)
        assert (job["last_slot_at"], job["next_slot_at"]) == (SLOT, NEXT), name
    assert (await job_row(db, "gap"))["last_slot_at"] is None
    assert (await job_row(db, "paused"))["fencing_token"] == 0
    # Rows inserted: one per decided slot, and the two runs held beforehand.
    assert len(await table_rows(db, executions)) == 5 + 2


async def test_claim_many_ahead_of_the_slot_defers_and_keys_the_chunk(db: Database) -> None:
    await register(db, "a", "b", "held")
    await add_run(db, "held", SLOT - timedelta(minutes=1), instance="b")
    decided = await batch.claim_many(
        db, [due("a"), due("b"), due("held")], instance_id="me", now=EARLY
    )
    assert set(decided.claims) == {"a", "b"}
    assert [d.job_name for d in decided.deferred] == ["held"]
    key = decided.start_keys["a"]
    assert decided.start_keys == {"a": key, "b": key} and len(key) == 32
    for claim in decided.claims.values():
        assert not claim.started
        row = await run_row(db, claim.execution_id)
        assert (row["start_key"], row["started_at"], row["heartbeat_at"]) == (key, None, EARLY)
    assert (await job_row(db, "held"))["last_slot_at"] is None, "deferred: not decided"


async def test_batches_racing_over_the_same_jobs_decide_each_slot_once(db: Database) -> None:
    names = [f"job-{n}" for n in range(20)]
    await register(db, *names)
    outcomes = await asyncio.gather(
        *(
            batch.claim_many(db, [due(n) for n in names], instance_id=f"i{i}", now=NOW)
            for i in range(3)
        ),
        return_exceptions=True,
    )
    decided = [o for o in outcomes if isinstance(o, Decided)]
    claimed = [n for d in decided for n in d.claims]
    assert sorted(claimed) == sorted(set(claimed)), "no slot decided twice"
    # What was held or refused is retried as a claimer does, until every slot is decided.
    for _ in range(5):
        rest = await batch.open_among(db, [due(n) for n in names])
        if not rest:
            break
        more = await batch.claim_many(db, rest, instance_id="retry", now=NOW)
        claimed += list(more.claims)
    assert sorted(claimed) == sorted(names)
    rows = await table_rows(db, executions)
    assert sorted(r["job_name"] for r in rows) == sorted(names)


async def test_still_open_and_open_among_read_the_high_water_marks(db: Database) -> None:
    await register(db, "open", "closed", "later", "Open")
    await set_job(db, "closed", last_slot_at=SLOT)
    await set_job(db, "later", last_slot_at=SLOT - timedelta(minutes=1))
    items = [due("open"), due("closed"), due("later"), due("gone"), due("Open")]
    still = await batch.still_open(db, items)
    assert [i.job_name for i in still] == ["open", "later", "gone", "Open"]
    assert await batch.still_open(db, []) == []
    among = await batch.open_among(db, [*items, due("closed", NEXT)])
    assert [(i.job_name, i.slot) for i in among] == [
        ("open", SLOT),
        ("later", SLOT),
        ("Open", SLOT),
        ("closed", NEXT),
    ]
    assert await batch.open_among(db, []) == []


async def test_rehearse_runs_the_batch_statements_and_decides_nothing(db: Database) -> None:
    await register(db, "a")
    async with db.engine.connect() as conn:
        transaction = await conn.begin()
        await batch.rehearse(db, conn)
        await transaction.rollback()
    assert await table_rows(db, executions) == []
    assert (await job_row(db, "a"))["last_slot_at"] is None
    decided = await batch.claim_many(db, [due("a")], instance_id="me", now=NOW)
    assert decided.claims["a"].status == "RUNNING"
