"""slotcron.store.runs: a run's writes after its claim, each only while the run is ours."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from slotcron.jobs.checks import MAX_JSON_DEPTH, json_problem
from slotcron.store import late_claims, registrations, runs
from slotcron.store.claims import RunKey
from slotcron.store.database import Database
from slotcron.store.runs import IncarnationLost
from slotcron.store.tables import executions, instances
from sqlalchemy import event, select, update

from tests.store.common import (
    LEASE,
    LEASE_MS,
    NOW,
    SLOT,
    add_run,
    nested,
    run_row,
    table_rows,
)

LATER = NOW + timedelta(seconds=5)


def key(execution_id: int, job: str = "job", slot: datetime = SLOT, attempt: int = 1) -> RunKey:
    return (execution_id, job, slot, attempt)


async def test_finish_records_the_outcome_once_and_only_for_its_holder(db: Database) -> None:
    run = await add_run(db)
    assert not await runs.finish(
        db, run=key(run), instance_id="b", status="COMPLETED", now=LATER, error=None
    )
    # The whole key, never the id alone: a row under our id with another slot is not ours.
    assert not await runs.finish(
        db, run=key(run, slot=NOW), instance_id="a", status="COMPLETED", now=LATER, error=None
    )
    assert await runs.finish(
        db, run=key(run), instance_id="a", status="FAILED", now=LATER, error="boom"
    )
    assert not await runs.finish(
        db, run=key(run), instance_id="a", status="COMPLETED", now=LATER, error=None
    )
    row = await run_row(db, run)
    assert (row["status"], row["error"], row["finished_at"], row["lease_until"]) == (
        "FAILED",
        "boom",
        LATER,
        LATER,
    )
    assert row["started_at"] == NOW


async def test_finish_with_a_backoff_queues_the_next_attempt_with_params_and_state(
    db: Database,
) -> None:
    run = await add_run(db, params={"tenant": 7})
    assert await runs.save_state(db, run=key(run), instance_id="a", state={"cursor": 41})
    assert await runs.finish(
        db,
        run=key(run),
        instance_id="a",
        status="FAILED",
        now=LATER,
        error="boom",
        retry_backoff=30,
    )
    rows = await table_rows(db, executions, order=executions.c.attempt)
    assert [(r["status"], r["attempt"], r["trigger"]) for r in rows] == [
        ("FAILED", 1, "cron"),
        ("QUEUED", 2, "retry"),
    ]
    retry = rows[1]
    assert (retry["scheduled_at"], retry["available_at"], retry["created_at"]) == (
        SLOT,
        LATER + timedelta(seconds=30),
        LATER,
    )
    assert (retry["params"], retry["state"], retry["instance_id"]) == (
        {"tenant": 7},
        {"cursor": 41},
        None,
    )


async def test_save_state_writes_the_checkpoint_while_the_run_is_ours(db: Database) -> None:
    run = await add_run(db)
    state = {"cursor": "é/ü", "n": [1, 2.5, None], "deep": {"ok": True}}
    assert await runs.save_state(db, run=key(run), instance_id="a", state=state)
    assert (await run_row(db, run))["state"] == state
    assert not await runs.save_state(db, run=key(run), instance_id="A", state={})
    assert not await runs.save_state(db, run=key(run, attempt=2), instance_id="a", state={})
    assert (await run_row(db, run))["state"] == state


async def test_finish_many_records_each_outcome_still_ours_in_one_transaction(
    db: Database,
) -> None:
    ok = await add_run(db, "ok")
    failed = await add_run(db, "failed")
    theirs = await add_run(db, "theirs", instance="b")
    done = await add_run(db, "done", status="COMPLETED")
    recorded = await runs.finish_many(
        db,
        [
            (key(ok, "ok"), "COMPLETED", None),
            (key(failed, "failed"), "FAILED", "boom"),
            (key(theirs, "theirs"), "COMPLETED", None),
            (key(done, "done"), "FAILED", "late"),
            (key(ok + 1000, "ok"), "COMPLETED", None),
        ],
        instance_id="a",
        now=LATER,
    )
    assert recorded == {ok, failed}
    rows = {r["job_name"]: r for r in await table_rows(db, executions)}
    assert {n: (r["status"], r["error"]) for n, r in rows.items()} == {
        "ok": ("COMPLETED", None),
        "failed": ("FAILED", "boom"),
        "theirs": ("RUNNING", None),
        "done": ("COMPLETED", None),
    }
    assert rows["ok"]["finished_at"] == LATER and rows["ok"]["lease_until"] == LATER
    assert await runs.finish_many(db, [], instance_id="a", now=LATER) == set()


async def test_finish_many_sends_one_update_alone_where_that_spares_begin_and_commit(
    db: Database,
) -> None:
    """The writer's usual batch (every run COMPLETED, nothing counted) is one UPDATE; on
    PostgreSQL it goes without BEGIN and COMMIT. Mixed outcomes stay one transaction."""
    one, two = await add_run(db, "one"), await add_run(db, "two")
    ok, failed = await add_run(db, "ok"), await add_run(db, "failed")
    commits: list[object] = []

    def committed(conn: object) -> None:
        commits.append(conn)

    event.listen(db.engine.sync_engine, "commit", committed)
    try:
        recorded = await runs.finish_many(
            db,
            [(key(one, "one"), "COMPLETED", None), (key(two, "two"), "COMPLETED", None)],
            instance_id="a",
            now=LATER,
        )
        assert recorded == {one, two}
        assert len(commits) == (0 if db.dialect.free_autocommit else 1)
        commits.clear()
        recorded = await runs.finish_many(
            db,
            [(key(ok, "ok"), "COMPLETED", None), (key(failed, "failed"), "FAILED", "boom")],
            instance_id="a",
            now=LATER,
        )
        assert recorded == {ok, failed}
        assert len(commits) == 1
    finally:
        event.remove(db.engine.sync_engine, "commit", committed)
    assert {r["job_name"]: r["status"] for r in await table_rows(db, executions)} == {
        "one": "COMPLETED",
        "two": "COMPLETED",
        "ok": "COMPLETED",
        "failed": "FAILED",
    }


async def test_stop_all_records_this_instances_listed_runs_stopped(db: Database) -> None:
    first, second = await add_run(db, "one"), await add_run(db, "two")
    theirs = await add_run(db, "three", instance="b")
    listed = [key(first, "one"), key(second, "two"), key(theirs, "three")]
    assert await runs.stop_all(db, runs=listed, instance_id="a", now=LATER, reason="shutdown") == 2
    assert await runs.stop_all(db, runs=listed, instance_id="a", now=LATER, reason="again") == 0
    assert await runs.stop_all(db, runs=[], instance_id="a", now=LATER, reason="none") == 0
    rows = await table_rows(db, executions, order=executions.c.id)
    assert [(r["status"], r["error"], r["lease_until"]) for r in rows] == [
        ("STOPPED", "shutdown", LATER),
        ("STOPPED", "shutdown", LATER),
        ("RUNNING", None, NOW + LEASE),
    ]


async def test_claimed_late_makes_runs_catchups_or_records_them_missed(db: Database) -> None:
    catchup, missed = await add_run(db, "catchup"), await add_run(db, "missed", start_key="k")
    other = await add_run(db, "other")
    late = [(key(catchup, "catchup"), None), (key(missed, "missed"), "too late")]
    assert await late_claims.claimed_late(db, late, instance_id="b", now=LATER) == set()
    late.append((key(other, "other"), "too late"))
    assert await late_claims.claimed_late(db, late, instance_id="a", now=LATER) == {
        catchup,
        missed,
        other,
    }
    row = await run_row(db, catchup)
    assert (row["status"], row["trigger"], row["started_at"]) == ("RUNNING", "catchup", NOW)
    for execution_id in (missed, other):
        row = await run_row(db, execution_id)
        assert (row["status"], row["error"], row["started_at"], row["start_key"]) == (
            "MISSED",
            "too late",
            None,
            None,
        )
        assert (row["finished_at"], row["lease_until"]) == (LATER, LATER)
    # Decided once: a second write finds them no longer RUNNING (the catch-up still is).
    assert await late_claims.claimed_late(db, late, instance_id="a", now=LATER) == {catchup}


async def add_instance(db: Database, instance: str = "a", incarnation: str | None = None) -> None:
    await registrations.register_instance(
        db, instance_id=instance, host="h", pid=1, version="t", now=NOW
    )
    if incarnation is not None:
        async with db.transaction() as conn:
            await conn.execute(
                update(instances)
                .where(instances.c.instance_id == instance)
                .values(incarnation=incarnation)
            )


async def leases(db: Database) -> dict[int, tuple[object, object]]:
    return {
        r["id"]: (r["lease_until"], r["heartbeat_at"]) for r in await table_rows(db, executions)
    }


async def test_renew_extends_live_leases_and_the_instance_heartbeat(db: Database) -> None:
    await add_instance(db)
    one, two = await add_run(db, "one"), await add_run(db, "two")
    short = await add_run(db, "short", lease_ms=20_000)
    theirs = await add_run(db, "theirs", instance="b")
    renewed = await runs.renew(
        db,
        instance_id="a",
        now=LATER,
        lease_counts={LEASE_MS: 2, 20_000: 1},
        instance_state="draining",
    )
    assert renewed is None
    assert await leases(db) == {
        one: (LATER + LEASE, LATER),
        two: (LATER + LEASE, LATER),
        short: (LATER + timedelta(seconds=20), LATER),
        theirs: (NOW + LEASE, NOW),
    }
    row = (await table_rows(db, instances))[0]
    assert (row["heartbeat_at"], row["state"]) == (LATER, "draining")


async def test_renew_says_which_runs_are_still_ours_and_never_revives_a_lapsed_lease(
    db: Database,
) -> None:
    await add_instance(db)
    ours = await add_run(db, "ours")
    taken = await add_run(db, "taken")
    lapsed = await add_run(db, "lapsed", lease_ms=1_000)
    async with db.transaction() as conn:
        await conn.execute(
            update(executions).where(executions.c.id == taken).values(status="ABANDONED")
        )
    later = NOW + timedelta(seconds=2)  # past the 1 s lease
    still = await runs.renew(
        db,
        instance_id="a",
        now=later,
        lease_counts={LEASE_MS: 2, 1_000: 1},
        instance_state="running",
    )
    assert still == {ours}
    assert (await run_row(db, lapsed))["lease_until"] == NOW + timedelta(seconds=1)


async def test_renew_of_only_our_runs_leaves_another_incarnations_to_lapse(db: Database) -> None:
    await add_instance(db, incarnation="me")
    mine, older = await add_run(db, "mine"), await add_run(db, "older")
    still = await runs.renew(
        db,
        instance_id="a",
        now=LATER,
        lease_counts={LEASE_MS: 1},
        instance_state="running",
        incarnation="me",
        ours=[key(mine, "mine")],
    )
    assert still is None
    assert (await leases(db))[mine] == (LATER + LEASE, LATER)
    assert (await leases(db))[older] == (NOW + LEASE, NOW)


async def test_renew_under_a_lost_incarnation_raises_and_renews_nothing(db: Database) -> None:
    await add_instance(db, incarnation="theirs")
    run = await add_run(db)
    with pytest.raises(IncarnationLost):
        await runs.renew(
            db,
            instance_id="a",
            now=LATER,
            lease_counts={LEASE_MS: 1},
            instance_state="running",
            incarnation="mine",
        )
    with pytest.raises(IncarnationLost):  # idle: the instance row alone
        await runs.renew(
            db,
            instance_id="a",
            now=LATER,
            lease_counts={},
            instance_state="running",
            incarnation="mine",
        )
    assert (await leases(db))[run] == (NOW + LEASE, NOW)
    assert (await table_rows(db, instances))[0]["heartbeat_at"] == NOW
    assert (
        await runs.renew(
            db,
            instance_id="a",
            now=LATER,
            lease_counts={},
            instance_state="running",
            incarnation="theirs",
        )
        is None
    )
    assert (await table_rows(db, instances))[0]["heartbeat_at"] == LATER


async def test_runs_among_and_run_keys_match_rows_by_their_whole_key(db: Database) -> None:
    first, second = await add_run(db, "one"), await add_run(db, "two")
    await add_run(db, "one", SLOT + timedelta(minutes=1))
    wanted = [key(first, "one"), key(second, "two", slot=NOW), key(second + 50, "two")]
    query = select(executions.c.id).where(runs.runs_among(db.dialect, "p_keys"))
    async with db.read() as conn:
        found = await conn.execute(query, runs.run_keys(db.dialect, "p_keys", wanted))
        assert set(found.scalars()) == {first}


async def test_rehearse_runs_finish_many_statements_and_writes_nothing(db: Database) -> None:
    run = await add_run(db)
    before = await table_rows(db, executions)
    async with db.engine.connect() as conn:
        transaction = await conn.begin()
        await runs.rehearse(conn, db.dialect)
        await transaction.rollback()
    assert await table_rows(db, executions) == before
    recorded = await runs.finish_many(
        db, [(key(run), "COMPLETED", None)], instance_id="a", now=LATER
    )
    assert recorded == {run}


async def test_a_checkpoint_of_any_json_reads_back_as_written(db: Database) -> None:
    run = await add_run(db)
    state = {
        "big": 2**70,
        "small": -(2**63),
        "float": 0.1,
        "tiny": 5e-324,
        "nul escape": "a\u0000b",
        "text": "é ü 🎉 \u2028 \\ \" '",
        "deep": nested(30),
        "empty": [{}, [], ""],
    }
    assert await runs.save_state(db, run=key(run), instance_id="a", state=state)
    assert (await run_row(db, run))["state"] == state


async def test_an_outcomes_error_text_reads_back_as_written(db: Database) -> None:
    error = "Traceback (most recent call last):\n  é ü 🎉 \t\r\n" + "x" * 15_000
    run = await add_run(db)
    assert await runs.finish(
        db, run=key(run), instance_id="a", status="FAILED", now=LATER, error=error
    )
    assert (await run_row(db, run))["error"] == error


@pytest.mark.parametrize(
    ("error", "stored"),
    [
        ("ValueError: bad byte \x00 in input", "ValueError: bad byte \\x00 in input"),
        ("UnicodeError: lone \ud800 here", "UnicodeError: lone \\ud800 here"),
    ],
    ids=["nul", "lone-surrogate"],
)
async def test_an_error_text_no_backend_holds_as_written_is_recorded_escaped(
    db: Database, error: str, stored: str
) -> None:
    # PostgreSQL text cannot hold NUL, nor any backend a lone surrogate: an outcome refused
    # would be retried as an outage for good.
    run = await add_run(db)
    recorded = await runs.finish_many(db, [(key(run), "FAILED", error)], instance_id="a", now=LATER)
    assert recorded == {run}
    assert (await run_row(db, run))["error"] == stored


async def test_an_error_text_past_64_kib_is_recorded_cut_in_the_middle(db: Database) -> None:
    # MariaDB's TEXT holds 65,535 bytes: the start and the end (the exception) are kept.
    error = "Traceback: " + "é" * 70_000 + " ValueError: the cause"
    run = await add_run(db)
    recorded = await runs.finish_many(db, [(key(run), "FAILED", error)], instance_id="a", now=LATER)
    assert recorded == {run}
    stored = (await run_row(db, run))["error"]
    assert stored.startswith("Traceback: ") and stored.endswith(" ValueError: the cause")
    assert "characters left out" in stored and len(stored.encode()) < 65_535


async def test_a_checkpoint_nested_as_deep_as_every_backend_stores_is_stored(db: Database) -> None:
    state = {"deep": nested(MAX_JSON_DEPTH - 1)}
    assert json_problem(state) is None and json_problem({"deep": nested(MAX_JSON_DEPTH)})
    run = await add_run(db)
    assert await runs.save_state(db, run=key(run), instance_id="a", state=state)
    assert (await run_row(db, run))["state"] == state


def test_an_error_text_is_made_storable_once_and_for_all() -> None:
    # restore_rows (a lost outcome written back after a failover) stores errors through it too.
    cut = runs.storable_error("a" * 20_000 + "\x00")
    assert cut is not None and cut.endswith("a\\x00") and "characters left out" in cut
    assert runs.storable_error(cut) == cut
    assert runs.storable_error(None) is None


async def test_an_update_of_our_runs_changes_only_those_still_ours(db: Database) -> None:
    ours, theirs = await add_run(db, "ours"), await add_run(db, "theirs", instance="b")
    sql = runs.ours_update(db.dialect, {"error": "noted"})
    params = {
        **runs.run_keys(db.dialect, "p_runs", [key(ours, "ours"), key(theirs, "theirs")]),
        "p_instance": "a",
    }
    async with db.transaction() as conn:
        assert await sql.apply(conn, params) == [ours]
    assert (await run_row(db, ours))["error"] == "noted"
    assert (await run_row(db, theirs))["error"] is None
