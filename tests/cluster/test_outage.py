"""Database outage: every connection of the cluster cut mid-run, a few times (PostgreSQL:
pg_terminate_backend; MariaDB: KILL). The instances log the outage, reconnect and go on; runs
in flight go on and are recorded; no slot runs twice and none is left unaccounted for.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from slotcron.config import Settings
from slotcron.store.database import Database
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from tests.cluster.conftest import Spawn
from tests.cluster.harness import execution_rows, read_records, slot_time, wait_until

JOBS = "tests.cluster.jobs_outage"
SHORT = [f"short-{i}" for i in range(8)]
CUTS = 3
ENV: dict[str, Any] = dict(
    SCHEDULER_LEASE_SECONDS=3,
    SCHEDULER_HEARTBEAT_SECONDS=0.5,
    SCHEDULER_SHUTDOWN_DRAIN_TIMEOUT=10,
)


async def cut_connections(admin: Database, backend: str) -> int:
    """Terminate every other connection to the test's database; return how many."""
    async with admin.engine.connect() as conn:
        if backend == "postgresql":
            result = await conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            )
            return sum(1 for (ok,) in result if ok)
        ids = (
            await conn.execute(
                text(
                    "SELECT id FROM information_schema.processlist "
                    "WHERE db = DATABASE() AND id <> CONNECTION_ID()"
                )
            )
        ).scalars()
        killed = 0
        for thread in list(ids):
            try:
                await conn.execute(text(f"KILL {int(thread)}"))
                killed += 1
            except DBAPIError:  # it ended meanwhile
                pass
        return killed


async def test_connections_cut_mid_run_the_cluster_recovers_with_no_duplicate(
    db: Database, db_url: str, backend: str, spawn: Spawn, records_path: Path
) -> None:
    if backend == "sqlite":
        pytest.skip("SQLite has no server whose connections could be cut")
    a = spawn("oa", JOBS, **ENV)
    b = spawn("ob", JOBS, **ENV)

    def long_running_and_both_up() -> bool:
        starts = [r for r in read_records(records_path) if r["event"] == "start"]
        by = Counter(r["instance"] for r in starts)
        ended = {r["id"] for r in read_records(records_path) if r["event"] == "end"}
        in_flight = [r for r in starts if r["job"] == "long" and r["id"] not in ended]
        both_up = by["oa"] > 0 and by["ob"] > 0
        return both_up and len({r["slot"] for r in starts}) >= 3 and len(in_flight) > 0

    await asyncio.to_thread(wait_until, long_running_and_both_up, 40, "both up, long running")
    admin = Database.connect(Settings(database_url=db_url).url, 1)
    cuts: list[tuple[float, int]] = []
    try:
        for _ in range(CUTS):
            cuts.append((time.time(), await cut_connections(admin, backend)))
            await asyncio.sleep(1.0)
    finally:
        await admin.close()
    assert all(n >= 2 for _, n in cuts), f"connections cut: {cuts}"
    last_cut = cuts[-1][0]

    def after_cuts() -> Counter[str]:  # who ran slots well after the last cut
        starts = [r for r in read_records(records_path) if r["event"] == "start"]
        return Counter(r["instance"] for r in starts if slot_time(r["slot"]) > last_cut + 2)

    ran = await asyncio.to_thread(wait_until, after_cuts, 20, "slots to run again")
    # Both came through. A second's nine slots are claimed in one batch, so one instance can win
    # every second for long; so the one that ran is stopped, and the other must then run slots
    # on its own.
    winner, then = (a, b) if ran["oa"] >= ran["ob"] else (b, a)
    winner.signal()
    assert await asyncio.to_thread(winner.wait, 20) == 0, winner.log()
    alone_from = time.time()

    def then_alone() -> bool:
        return any(
            r["event"] == "start" and r["instance"] == then.name and r["wall"] > alone_from
            for r in read_records(records_path)
        )

    await asyncio.to_thread(wait_until, then_alone, 10, f"{then.name} to run slots on its own")
    stop_wall = time.time()
    then.signal()
    assert await asyncio.to_thread(then.wait, 20) == 0, then.log()

    records = read_records(records_path)
    starts = [r for r in records if r["event"] == "start"]
    ended = {r["id"]: r["wall"] for r in records if r["event"] == "end"}
    await db.engine.dispose()  # its pooled connections were cut too
    rows = await execution_rows(db)
    by_slot = {(r.job_name, r.scheduled_at.isoformat()): r for r in rows}

    # The outage was logged, and so was its end. (Not necessarily by each instance: the pool
    # replaces all its cut connections after the first failed call, and when that call is the
    # leader's tick, it is logged at DEBUG only.)
    logs = [instance.full_log() for instance in (a, b)]
    assert any("database unreachable" in log for log in logs), logs[0][-3000:]
    for log in logs:
        assert log.count("database unreachable") == log.count("database reachable again"), log

    # No slot ran twice.
    runs = Counter((r["job"], r["slot"]) for r in starts)
    assert {k: n for k, n in runs.items() if n > 1} == {}, "slots run twice"

    # Runs in flight during a cut went on to their end and were recorded COMPLETED.
    straddling = [
        r for r in starts if any(r["wall"] < cut < ended.get(r["id"], math.inf) for cut, _ in cuts)
    ]
    assert any(r["job"] == "long" for r in straddling), "no run was in flight across a cut"
    for r in straddling:
        assert r["id"] in ended, f"a run in flight during the outage never ended: {r}"
        assert by_slot[(r["job"], r["slot"])].status == "COMPLETED", by_slot[(r["job"], r["slot"])]

    # Every slot from before the first cut to after the last was run (or, for ``long``, skipped
    # while its previous run held the lease); nothing ABANDONED, FAILED or left RUNNING.
    statuses = Counter(r.status for r in rows)
    odd = [r for r in rows if r.status not in ("COMPLETED", "SKIPPED", "MISSED")]
    assert odd == [], (
        f"{statuses}; {[dict(r._mapping) for r in odd]}; cuts at {cuts}; "
        f"recorded runs of these: {[r for r in records if r.get('id') in {o.id for o in odd}]}"
    )
    first = max(math.ceil(cuts[0][0]) - 2, min(math.ceil(slot_time(r["slot"])) for r in starts))
    for second in range(first, math.floor(stop_wall) - 1):
        slot = datetime.fromtimestamp(second, UTC).isoformat()
        for job in [*SHORT, "long"]:
            row = by_slot.get((job, slot))
            assert row is not None, f"{job} slot {slot} has no record"
            if row.status == "COMPLETED":
                assert runs[(job, slot)] == 1, f"{job} {slot} COMPLETED but never started"
            elif job == "long":
                assert row.status == "SKIPPED" and "overlap" in (row.error or ""), row
            else:
                raise AssertionError(f"{job} slot {slot} was not run: {row.status} {row.error}")
    print(f"\noutage: cuts {[n for _, n in cuts]} connections; statuses {dict(statuses)}")
