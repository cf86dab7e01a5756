"""slotcron.store.failover: what an instance asks of a database it reached again, by each run's
whole key."""

from __future__ import annotations

from datetime import datetime, timedelta

from slotcron.store import failover, markers
from slotcron.store.database import Database
from slotcron.store.failover import Found, Lost
from slotcron.store.tables import executions

from tests.store.common import (
    EARLY,
    LEASE,
    NEXT,
    NOW,
    SLOT,
    add_run,
    claim_ahead,
    job_row,
    markers_of,
    register,
    run_row,
    set_job,
    table_rows,
)

LATER = NOW + timedelta(seconds=5)


async def test_replication_is_known_on_postgresql_only(db: Database) -> None:
    found = await failover.replication(db)
    if db.dialect.name != "postgresql":
        assert found is None
        return
    assert found is not None and found.standbys is not None and found.standbys >= 0
    assert found.mode in ("synchronous", "asynchronous", "none")
    assert found.synchronous == bool(found.standby_names.strip())
    assert found.describe()


async def test_find_runs_reads_each_run_and_its_chunks_marker_by_key(db: Database) -> None:
    await register(db, "a", "b", "c")
    key, runs = await claim_ahead(db, "a")
    await markers.mark(
        db, key, ids=[runs["a"]], slot=SLOT, lease_until=EARLY + LEASE, instance_id="me", now=SLOT
    )
    back_key, back = await claim_ahead(db, "b", instance="you")
    await markers.settle(db, [back_key], now=NOW)
    lone = await add_run(db, "c", instance="me")
    keys = {
        "a": (runs["a"], "a", SLOT, 1),
        "b": (back["b"], "b", SLOT, 1),
        "c": (lone, "c", SLOT, 1),
    }
    absent = (lone, "c", SLOT, 2)
    reused = (lone, "other", SLOT, 1)  # the id handed to another run after a lossy failover
    found = await failover.find_runs(db, [*keys.values(), absent, reused])
    assert found == {
        keys["a"]: Found("RUNNING", "me", key, False, "started"),
        keys["b"]: Found("RUNNING", "you", back_key, False, "handed back"),
        keys["c"]: Found("RUNNING", "me", None, True, None),
    }
    assert await failover.find_runs(db, []) == {}


async def test_restore_markers_puts_back_lost_markers_but_not_over_a_tombstone(
    db: Database,
) -> None:
    await markers.settle(db, ["tomb"], now=NOW)
    await failover.restore_markers(db, {"kept": SLOT}, instance_id="me", now=NOW)
    restored = await failover.restore_markers(
        db,
        {"lost": SLOT, "kept": SLOT, "tomb": SLOT, "theirs": NEXT},
        instance_id="me",
        now=LATER,
    )
    assert restored == {"lost", "kept", "theirs"}
    assert await failover.restore_markers(db, {}, instance_id="me", now=NOW) == set()
    assert await markers_of(db) == [
        ("kept", "me", SLOT, False),
        ("lost", "me", SLOT, False),
        ("theirs", "me", NEXT, False),
        ("tomb", None, None, True),
    ]
    other = await failover.restore_markers(db, {"lost": SLOT}, instance_id="you", now=LATER)
    assert other == set(), "a key started by another instance is not ours"


def lost(
    job: str,
    *,
    trigger: str = "cron",
    status: str = "COMPLETED",
    error: str | None = None,
    next_slot: datetime | None = NEXT,
) -> Lost:
    return Lost(
        run=(0, job, SLOT, 1),
        trigger=trigger,
        status=status,
        error=error,
        started_at=SLOT,
        finished_at=LATER,
        lease_ms=60_000,
        fencing_token=4,
        params={"p": 1},
        next_slot=next_slot,
    )


async def test_restore_rows_puts_back_lost_rows_and_moves_the_marks_forward(
    db: Database,
) -> None:
    await register(db, "lost", "taken", "manual", "ahead")
    await set_job(db, "ahead", last_slot_at=NEXT, next_slot_at=NEXT + timedelta(minutes=1))
    taken = await add_run(db, "taken", instance="other")
    inserted = await failover.restore_rows(
        db,
        [
            lost("lost"),
            lost("taken"),
            lost("manual", trigger="manual", next_slot=None),
            lost("ahead", status="STOPPED", error="fenced"),
        ],
        instance_id="me",
    )
    assert inserted == 3
    assert await failover.restore_rows(db, [], instance_id="me") == 0
    rows = {r["job_name"]: r for r in await table_rows(db, executions)}
    row = rows["lost"]
    assert (row["status"], row["instance_id"], row["started_at"], row["finished_at"]) == (
        "COMPLETED",
        "me",
        SLOT,
        LATER,
    )
    assert (row["fencing_token"], row["params"], row["attempt"]) == (4, {"p": 1}, 1)
    assert rows["taken"]["id"] == taken and rows["taken"]["instance_id"] == "other"
    assert (rows["ahead"]["status"], rows["ahead"]["error"]) == ("STOPPED", "fenced")
    marks = {n: ((j := await job_row(db, n))["last_slot_at"], j["next_slot_at"]) for n in rows}
    assert marks == {
        "lost": (SLOT, NEXT),
        "taken": (SLOT, NEXT),
        "manual": (None, None),  # a manual run's slot is no mark of the job's
        "ahead": (NEXT, NEXT + timedelta(minutes=1)),  # never moved back
    }


async def test_settle_lost_takes_stops_runs_queued_again_by_key(db: Database) -> None:
    queued = await add_run(db, "a", status="QUEUED", trigger="manual")
    running = await add_run(db, "b", instance="me")
    keys = [(queued, "a", SLOT, 1), (running, "b", SLOT, 1), (queued, "a", NEXT, 1)]
    assert await failover.settle_lost_takes(db, keys, reason="take lost", now=LATER) == 1
    assert await failover.settle_lost_takes(db, [], reason="none", now=LATER) == 0
    row = await run_row(db, queued)
    assert (row["status"], row["error"], row["finished_at"]) == ("STOPPED", "take lost", LATER)
    assert (await run_row(db, running))["status"] == "RUNNING"
