"""Blue/green: green starts while blue runs, then blue gets SIGTERM mid-run. Blue stops
claiming at once and drains its runs; green claims everything from then on. No slot is lost
or doubled across the hand-over. When green changes a job's schedule, green's schedule is in
force from its registration on: blue stops firing the job while it lives on.
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
from slotcron.store.database import Database
from slotcron.store.operations import list_jobs
from slotcron.store.tables import instances, jobs
from sqlalchemy import select

from tests.cluster.conftest import Spawn
from tests.cluster.harness import execution_rows, read_records, slot_time, wait_until

JOBS = "tests.cluster.jobs_chaos"
RESCHEDULE = "tests.cluster.jobs_reschedule"
N_RESCHEDULED = 5


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


async def test_a_changed_schedule_takes_over_at_its_registration_and_no_old_slot_runs_after(
    db: Database, backend: str, spawn: Spawn, records_path: Path
) -> None:
    """Blue runs five jobs every 2 s; green registers them every 3 s while blue lives on. From
    green's registration, judged by what the jobs recorded, no slot of blue's schedule runs
    (blue's claims are refused: it stops firing them, logs it once, and `jobs` shows it), every
    slot of green's runs, and no slot runs twice."""
    if backend == "sqlite":
        pytest.skip("blue/green is a cluster deployment: PostgreSQL and MariaDB (suite time)")
    env = dict(ENV, SCHEDULER_LEASE_SECONDS=10, SCHEDULER_HEARTBEAT_SECONDS=1)
    blue = spawn("blue", RESCHEDULE, RESCHEDULE_EVERY=2, **env)

    def starts() -> list[dict[str, Any]]:
        return [r for r in read_records(records_path) if r["event"] == "start"]

    await asyncio.to_thread(
        wait_until, lambda: len({r["slot"] for r in starts()}) >= 3, 30, "blue to run 3 slots"
    )
    green = spawn("green", RESCHEDULE, RESCHEDULE_EVERY=3, **env)

    async def registered_by_green() -> datetime | None:
        async with db.read() as conn:
            rows = (await conn.execute(select(jobs.c.updated_by, jobs.c.updated_at))).all()
        if len(rows) == N_RESCHEDULED and all(r.updated_by == "green" for r in rows):
            latest: datetime = max(r.updated_at for r in rows)
            return latest
        return None

    registered: datetime | None = None
    deadline = time.monotonic() + 30
    while registered is None:
        assert time.monotonic() < deadline, "green never registered:\n" + green.log()
        await asyncio.sleep(0.1)
        registered = await registered_by_green()
    at = registered.timestamp()

    # Blue lives on: it must not fire its schedule any more, green fires its own.
    await asyncio.to_thread(
        wait_until,
        lambda: len({r["slot"] for r in starts() if slot_time(r["slot"]) > at + 10}) >= 1,
        30,
        "ten seconds of green's schedule",
    )
    assert blue.alive(), blue.log()
    async with db.read() as conn:
        superseded = (await conn.execute(select(jobs.c.name, jobs.c.superseded))).all()
    listed = await list_jobs(db, now=datetime.now(UTC), live_within=60)
    blue.signal()
    green.signal()
    assert await asyncio.to_thread(blue.wait, 20) == 0, blue.log()
    assert await asyncio.to_thread(green.wait, 20) == 0, green.log()

    found = starts()
    runs = Counter((r["job"], r["slot"]) for r in found)
    assert {k: n for k, n in runs.items() if n > 1} == {}, "slots run twice"
    # A slot claimed ahead (jobs due together are claimed by the burst's lead, about 10 ms,
    # before their time) just before the registration committed may still run at its time.
    ahead = 0.25
    old_after = [
        r for r in found if slot_time(r["slot"]) > at + ahead and int(slot_time(r["slot"])) % 3 != 0
    ]
    assert old_after == [], f"slots of the old schedule ran after the registration: {old_after}"
    assert all(r["instance"] == "green" for r in found if slot_time(r["slot"]) > at + ahead)
    last = max(slot_time(r["slot"]) for r in found)
    for second in range(math.ceil(at + ahead), int(last) + 1):
        if second % 3 == 0:
            for i in range(N_RESCHEDULED):
                assert runs[(f"rescheduled-{i}", utc(second).isoformat())] == 1, (i, second)
    assert {r.name: r.superseded for r in superseded} == {
        f"rescheduled-{i}": {"blue": "every 2s (UTC)"} for i in range(N_RESCHEDULED)
    }
    assert {r.name: r.superseded for r in listed} == {
        f"rescheduled-{i}": {"blue": "every 2s (UTC)"} for i in range(N_RESCHEDULED)
    }
    told = [line for line in blue.full_log().splitlines() if "stops firing it" in line]
    assert len(told) == N_RESCHEDULED, told
    before = sum(1 for r in found if slot_time(r["slot"]) <= at)
    print(
        f"\nschedule change: {before} runs before green's registration, "
        f"{len(found) - before} after (all green's); blue superseded, told once per job"
    )
