"""Shutdown of a real process by real signals: phases, timeouts, and no run left unrecorded."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

from slotcron.store.database import Database
from slotcron.store.tables import executions, instances
from sqlalchemy import select

from tests.cluster.conftest import Spawn
from tests.cluster.harness import read_records, wait_until

JOBS = "tests.cluster.jobs_shutdown"


async def execution(db: Database, execution_id: int) -> dict[str, object]:
    async with db.read() as conn:
        row = (await conn.execute(select(executions).where(executions.c.id == execution_id))).one()
    return dict(row._mapping)


async def instance_state(db: Database, name: str) -> str | None:
    async with db.read() as conn:
        return (
            await conn.execute(select(instances.c.state).where(instances.c.instance_id == name))
        ).scalar_one_or_none()


def first_start(path: Path, timeout: float = 20) -> dict[str, object]:
    start: dict[str, object] = wait_until(
        lambda: next((r for r in read_records(path) if r["event"] == "start"), None),
        timeout,
        "the first run to start",
    )
    return start


async def test_a_run_longer_than_the_drain_timeout_is_recorded_stopped_and_exit_is_0(
    db: Database, spawn: Spawn, records_path: Path
) -> None:
    proc = spawn(
        "drainer",
        JOBS,
        SCHEDULER_SHUTDOWN_DRAIN_TIMEOUT=1,
        SCHEDULER_SHUTDOWN_CANCEL_TIMEOUT=5,
        SLEEP_SECONDS=60,
    )
    started = await asyncio.to_thread(first_start, records_path)
    sent = time.monotonic()
    signalled_at = time.time()
    proc.signal(signal.SIGTERM)
    code = await asyncio.to_thread(proc.wait, 15)
    took = time.monotonic() - sent
    assert code == 0, proc.log()
    assert 1.0 <= took < 8, f"shutdown took {took:.1f} s with a 1 s drain timeout"
    record = await execution(db, int(str(started["id"])))
    assert record["status"] == "STOPPED"
    assert "shutdown" in str(record["error"])
    assert record["finished_at"] is not None
    assert record["state"] == {"progress": "started"}  # its checkpoint survives for a restart
    assert await instance_state(db, "drainer") == "stopped"
    events = [r["event"] for r in read_records(records_path) if r["id"] == started["id"]]
    assert events == ["start", "cancelled"]
    # Phase 1 stopped claims: nothing started after the signal.
    late = [
        r for r in read_records(records_path) if r["event"] == "start" and r["wall"] > signalled_at
    ]
    assert late == []


async def test_a_run_that_ends_within_the_drain_timeout_completes_and_nothing_new_starts(
    db: Database, spawn: Spawn, records_path: Path
) -> None:
    proc = spawn("patient", JOBS, SCHEDULER_SHUTDOWN_DRAIN_TIMEOUT=20, SLEEP_SECONDS=2.5)
    started = await asyncio.to_thread(first_start, records_path)
    signalled_at = time.time()
    proc.signal(signal.SIGTERM)
    code = await asyncio.to_thread(proc.wait, 20)
    assert code == 0, proc.log()
    record = await execution(db, int(str(started["id"])))
    assert record["status"] == "COMPLETED"
    late_starts = [
        r for r in read_records(records_path) if r["event"] == "start" and r["wall"] > signalled_at
    ]
    assert late_starts == [], "a slot was claimed after SIGTERM"
    async with db.read() as conn:
        running = (
            await conn.execute(select(executions.c.id).where(executions.c.status == "RUNNING"))
        ).all()
    assert running == []


async def test_a_second_signal_skips_the_drain_and_stops_runs_at_once(
    db: Database, spawn: Spawn, records_path: Path
) -> None:
    proc = spawn("hurried", JOBS, SCHEDULER_SHUTDOWN_DRAIN_TIMEOUT=120, SLEEP_SECONDS=120)
    started = await asyncio.to_thread(first_start, records_path)
    proc.signal(signal.SIGTERM)
    await asyncio.to_thread(wait_until, lambda: "phase 2" in proc.log(), 10, "phase 2 to begin")
    sent = time.monotonic()
    proc.signal(signal.SIGINT)
    code = await asyncio.to_thread(proc.wait, 15)
    assert code == 0, proc.log()
    assert time.monotonic() - sent < 5
    record = await execution(db, int(str(started["id"])))
    assert record["status"] == "STOPPED"


async def test_a_run_that_ignores_cancellation_is_still_recorded_stopped_and_exit_is_0(
    db: Database, spawn: Spawn, records_path: Path
) -> None:
    proc = spawn(
        "stubborn",
        JOBS,
        SCHEDULER_SHUTDOWN_DRAIN_TIMEOUT=0.5,
        SCHEDULER_SHUTDOWN_CANCEL_TIMEOUT=1,
        SLEEP_SECONDS=120,
        IGNORE_CANCEL=1,
    )
    started = await asyncio.to_thread(first_start, records_path)
    proc.signal(signal.SIGTERM)
    code = await asyncio.to_thread(proc.wait, 15)
    assert code == 0, proc.log()
    record = await execution(db, int(str(started["id"])))
    assert record["status"] == "STOPPED"
    assert "cancel timeout" in str(record["error"])
    assert await instance_state(db, "stubborn") == "stopped"
