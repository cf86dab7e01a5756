"""Two real instances racing the same jobs: each slot runs exactly once, by the jobs' own record."""

from __future__ import annotations

import asyncio
import signal
from collections import Counter
from datetime import datetime
from pathlib import Path

from slotcron.store.database import Database
from slotcron.store.tables import executions
from sqlalchemy import select

from tests.cluster.conftest import Spawn
from tests.cluster.harness import read_records, wait_until

JOBS = "tests.cluster.jobs_race"
N_JOBS = 10


async def test_two_instances_racing_run_each_slot_of_each_job_exactly_once(
    db: Database, spawn: Spawn, records_path: Path
) -> None:
    a = spawn("racer-a", JOBS)
    b = spawn("racer-b", JOBS)

    def both_ran_many() -> bool:
        starts = [r for r in read_records(records_path) if r["event"] == "start"]
        by = Counter(r["instance"] for r in starts)
        return len({r["slot"] for r in starts}) >= 8 and by["racer-a"] > 0 and by["racer-b"] > 0

    await asyncio.to_thread(wait_until, both_ran_many, 40, "8 slots with both instances claiming")
    for proc in (a, b):
        proc.signal(signal.SIGTERM)
    for proc in (a, b):
        assert await asyncio.to_thread(proc.wait, 20) == 0, proc.log()

    starts = [r for r in read_records(records_path) if r["event"] == "start"]
    runs = Counter((r["job"], r["slot"]) for r in starts)
    doubled = {key: n for key, n in runs.items() if n > 1}
    assert doubled == {}, f"slots run twice: {doubled}"

    # Between the first and the last slot seen, no slot of any job was dropped.
    slots = sorted({datetime.fromisoformat(r["slot"]) for r in starts})
    for slot in slots[1:-1]:
        for i in range(N_JOBS):
            assert (f"race-{i}", slot.isoformat()) in runs, f"race-{i} {slot} not run"
    # Both instances did claim: it was a race, not one instance doing all the work.
    by_instance = Counter(r["instance"] for r in starts)
    assert by_instance["racer-a"] > 0 and by_instance["racer-b"] > 0, by_instance

    # Our tables agree with the jobs' own record: one run per slot, one execution per run.
    async with db.read() as conn:
        rows = (
            await conn.execute(
                select(executions.c.job_name, executions.c.scheduled_at, executions.c.status)
            )
        ).all()
    # (A slot claimed ahead whose body had not started at SIGTERM was handed back: QUEUED, for
    # the next instance to run.)
    ran = Counter(
        (r.job_name, r.scheduled_at.isoformat())
        for r in rows
        if r.status not in ("SKIPPED", "QUEUED")
    )
    assert ran == runs
    assert {r.status for r in rows} <= {"COMPLETED", "SKIPPED", "STOPPED", "QUEUED"}
    # A run handed back never ran, and it is one of the last slots: claimed ahead, due after the
    # SIGTERM, not a slot dropped in the middle.
    queued = [(r.job_name, r.scheduled_at) for r in rows if r.status == "QUEUED"]
    assert not [key for key in queued if (key[0], key[1].isoformat()) in runs], queued
    assert all(slot >= slots[-1] for _, slot in queued), (queued, slots[-1])
