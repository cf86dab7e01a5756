"""Blue/green: green starts while blue runs, then blue gets SIGTERM mid-run. Blue stops
claiming at once and drains its runs; green claims everything from then on. No slot is lost
or doubled across the hand-over.
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
from sqlalchemy import select

from app.store.database import Database
from app.store.tables import instances
from tests.cluster.conftest import Spawn
from tests.cluster.harness import execution_rows, read_records, slot_time, wait_until

JOBS = "tests.cluster.jobs_chaos"


def utc(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


N_JOBS = 20
ENV: dict[str, Any] = dict(
    SCHEDULER_LEASE_SECONDS=3,
    SCHEDULER_HEARTBEAT_SECONDS=0.5,
    SCHEDULER_SHUTDOWN_DRAIN_TIMEOUT=10,
)


async def test_green_takes_over_from_blue_with_no_slot_lost_or_doubled(
    db: Database, backend: str, spawn: Spawn, records_path: Path
) -> None:
    if backend == "sqlite":
        pytest.skip("blue/green is a cluster deployment: PostgreSQL and MariaDB (suite time)")
    blue = spawn("blue", JOBS, **ENV)

    def starts() -> list[dict[str, Any]]:
        return [r for r in read_records(records_path) if r["event"] == "start"]

    await asyncio.to_thread(
        wait_until, lambda: len({r["slot"] for r in starts()}) >= 2, 30, "blue to run 2 slots"
    )
    green = spawn("green", JOBS, **ENV)

    def blue_mid_run_and_green_racing() -> bool:
        records = read_records(records_path)
        ended = {r["id"] for r in records if r["event"] == "end"}
        by_green = {
            r["slot"] for r in records if r["event"] == "start" and r["instance"] == "green"
        }
        blue_running = [
            r
            for r in records
            if r["event"] == "start" and r["instance"] == "blue" and r["id"] not in ended
        ]
        return len(by_green) >= 2 and len(blue_running) >= 2

    await asyncio.to_thread(
        wait_until, blue_mid_run_and_green_racing, 30, "green racing blue, blue mid-run"
    )
    signalled = time.time()
    blue.signal()  # SIGTERM
    in_flight = {r["id"] for r in starts() if r["instance"] == "blue"} - {
        r["id"] for r in read_records(records_path) if r["event"] == "end"
    }
    assert await asyncio.to_thread(blue.wait, 20) == 0, blue.log()

    def green_alone_for_3_slots() -> bool:
        return len({r["slot"] for r in starts() if slot_time(r["slot"]) > signalled + 1}) >= 3

    await asyncio.to_thread(wait_until, green_alone_for_3_slots, 20, "green to run on alone")
    stopped = time.time()
    green.signal()
    assert await asyncio.to_thread(green.wait, 20) == 0, green.log()

    records = read_records(records_path)
    all_starts = [r for r in records if r["event"] == "start"]
    ended = {r["id"] for r in records if r["event"] == "end"}
    rows = await execution_rows(db)
    by_slot = {(r.job_name, r.scheduled_at.isoformat()): r for r in rows}

    runs = Counter((r["job"], r["slot"]) for r in all_starts)
    assert {k: n for k, n in runs.items() if n > 1} == {}, "slots run twice"

    # Blue's runs in flight at SIGTERM were drained: they ended and are COMPLETED.
    assert in_flight, "blue had no run in flight when signalled"
    for r in all_starts:
        if r["id"] in in_flight:
            assert r["id"] in ended, f"blue's run was cut short: {r}"
            assert by_slot[(r["job"], r["slot"])].status == "COMPLETED"
    # Blue claimed nothing after the signal: every later slot is green's.
    late_blue = [
        r for r in all_starts if r["instance"] == "blue" and slot_time(r["slot"]) > signalled
    ]
    assert late_blue == [], late_blue
    async with db.read() as conn:
        state = (
            await conn.execute(select(instances.c.state).where(instances.c.instance_id == "blue"))
        ).scalar_one()
    assert state == "stopped"

    # Nothing was cut short or left behind: no run STOPPED, ABANDONED or still RUNNING.
    statuses = Counter(r.status for r in rows)
    odd = [r for r in rows if r.status not in ("COMPLETED", "SKIPPED", "MISSED")]
    assert odd == [], f"{statuses}; SIGTERM to blue at {utc(signalled)}; " + "; ".join(
        f"{r.job_name} {r.scheduled_at} {r.status} by {r.instance_id}: {r.error}" for r in odd
    )
    # Every slot from green's start to its stop, across the hand-over, ran exactly once (or
    # was SKIPPED while the job's previous run held its lease): none MISSED there.
    first_green = min(slot_time(r["slot"]) for r in all_starts if r["instance"] == "green")
    window = range(int(first_green), math.floor(stopped) - 1)
    assert int(signalled) in window
    for second in window:
        slot = utc(second).isoformat()
        for i in range(N_JOBS):
            row = by_slot.get((f"chaos-{i}", slot))
            assert row is not None, f"chaos-{i} slot {slot} lost across the hand-over"
            if row.status == "COMPLETED":
                assert runs[(row.job_name, slot)] == 1, row
            else:
                assert row.status == "SKIPPED" and "overlap" in (row.error or ""), row
    by_instance = Counter(r["instance"] for r in all_starts)
    print(f"\nblue/green: runs {dict(by_instance)}; statuses {dict(statuses)}")
