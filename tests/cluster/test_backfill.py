"""A backfill of 500 slots of a job that ran some of them, carried on by two real instances, one
SIGKILLed mid-backfill, while the live schedule runs and races it at the range's end. Judged by
what the job recorded with the real clock: every slot of the range that never completed ran, none
completed twice, a slot started twice only when its first body died with the killed instance, no
completed slot ran again, and the live slots ran on time."""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from slotcron.store import backfills
from slotcron.store.database import Database
from slotcron.store.tables import executions
from sqlalchemy import insert, select

from tests.cluster.conftest import Spawn
from tests.cluster.harness import read_records, slot_time, wait_until
from tests.cluster.jobs_backfill import JOB

JOBS = "tests.cluster.jobs_backfill"
SLOTS = 500
RATE = 40  # starts a second: the backfill takes ~12 s, long enough to kill an instance mid-way
LEASE = 3.0
ENV: dict[str, Any] = dict(
    SCHEDULER_LEASE_SECONDS=LEASE,
    SCHEDULER_HEARTBEAT_SECONDS=0.5,
    SCHEDULER_SHUTDOWN_DRAIN_TIMEOUT=5,
    SCHEDULER_POOL_SIZE=4,
)


async def an_earlier_deployment(db: Database, slots: list[datetime]) -> set[datetime]:
    """Rows of an earlier deployment of the job: every fifth slot COMPLETED, every seventh
    FAILED (it runs again); returns the completed ones."""
    completed = set(slots[::5])
    rows = [
        {
            "job_name": JOB, "scheduled_at": slot, "trigger": "interval",
            "status": "COMPLETED" if slot in completed else "FAILED", "attempt": 1,
            "created_at": slot, "started_at": slot, "finished_at": slot,
        }
        for slot in sorted(completed | set(slots[::7]))
    ]  # fmt: skip
    async with db.transaction() as conn:
        await conn.execute(insert(executions), rows)
    return completed


async def test_a_backfill_survives_an_instance_killed_mid_way_and_runs_every_slot_once(
    db: Database, spawn: Spawn, records_path: Path
) -> None:
    now = datetime.now(UTC).replace(microsecond=0)
    start = now - timedelta(seconds=SLOTS - 15)  # the range's last 15 s are the live schedule's
    slots = [start + timedelta(seconds=i) for i in range(SLOTS)]
    completed = await an_earlier_deployment(db, slots[: SLOTS - 30])
    a = spawn("bf-a", JOBS, **ENV)
    b = spawn("bf-b", JOBS, **ENV)

    def starts(trigger: str | None = None) -> list[dict[str, Any]]:
        return [
            r
            for r in read_records(records_path)
            if r["event"] == "start" and trigger in (None, r["trigger"])
        ]

    await asyncio.to_thread(wait_until, lambda: len(starts("interval")) >= 3, 60, "live runs")
    made = await backfills.create(
        db,
        job=JOB,
        start=start,
        end=slots[-1] + timedelta(seconds=1),
        rate=RATE,
        now=await db.now(),
    )
    assert made.total == SLOTS
    await asyncio.to_thread(
        wait_until,
        lambda: (
            len({r["instance"] for r in starts("backfill")}) == 2 and len(starts("backfill")) >= 100
        ),
        60,
        "a hundred backfilled slots run by both instances",
    )
    a.kill()  # SIGKILL: its runs in flight are abandoned, its unstarted ones handed back
    killed_at = time.time()

    async def finished() -> bool:
        found = {x.id: x for x in await backfills.listing(db)}[made.id]
        return found.status == "COMPLETED"

    deadline = time.monotonic() + 120
    while not await finished():
        assert time.monotonic() < deadline, "the backfill did not complete within 120 s"
        await asyncio.sleep(0.2)
    stopping = time.time()
    b.signal(signal.SIGTERM)
    assert await asyncio.to_thread(b.wait, 30) == 0, b.log()

    records = starts()
    ends = Counter(r["slot"] for r in read_records(records_path) if r["event"] == "end")
    assert {s: n for s, n in ends.items() if n > 1} == {}, "slots completed twice"
    # A slot started twice only after its first body died with the killed instance (abandoned:
    # never completed, so the backfill runs it); never after a start that completed.
    by_slot: dict[str, list[dict[str, Any]]] = {}
    for r in sorted(records, key=lambda r: r["wall"]):
        by_slot.setdefault(r["slot"], []).append(r)
    again = {s: runs for s, runs in by_slot.items() if len(runs) > 1}
    for slot, runs in again.items():
        assert len(runs) == 2 and runs[0]["instance"] == "bf-a", (slot, runs)
        assert runs[0]["wall"] < killed_at <= runs[1]["wall"], (slot, runs)
    in_range = {s.isoformat() for s in slots}
    never_completed = in_range - {s.isoformat() for s in completed}
    # Every slot of the range that never completed ran, but one whose backfill run the killed
    # instance had stamped started and whose body it had not begun (the kill fell between the
    # two): ABANDONED by it, accounted for as the contract says, and counted failed by the
    # backfill, which queues each slot once. (A live slot abandoned so is run by the backfill.)
    unrun = never_completed - set(by_slot)
    if unrun:
        async with db.read() as conn:
            attempts = (await conn.execute(select(
                executions.c.scheduled_at, executions.c.status, executions.c.instance_id,
                executions.c.trigger,
            ).where(executions.c.job_name == JOB))).all()  # fmt: skip
        mine = [a for a in attempts if a.scheduled_at.isoformat() in unrun]
        abandoned = {
            a.scheduled_at.isoformat()
            for a in mine
            if (a.status, a.instance_id, a.trigger) == ("ABANDONED", "bf-a", "backfill")
        }
        assert unrun <= abandoned, ("slots of the range that never ran", unrun, mine)
    assert set(by_slot) & {s.isoformat() for s in completed} == set(), "a completed slot ran"
    assert {r["instance"] for r in starts("backfill")} == {"bf-a", "bf-b"}
    # Live slots on time beside it: each within a second of its slot, but those the killed
    # instance had claimed (handed back, or decided by their misfire policy, within a lease).
    settled = killed_at + LEASE + 2
    late = [
        (r["slot"], round(r["wall"] - slot_time(r["slot"]), 2))
        for r in starts("interval")
        if not killed_at - 1 <= slot_time(r["slot"]) <= settled
        and r["wall"] - slot_time(r["slot"]) > 1.0
    ]
    assert late == [], f"live slots late beside the backfill: {late}"
    # Every live second from the first live run to the stop was run or recorded.
    async with db.read() as conn:
        rows = (await conn.execute(select(executions.c.scheduled_at).where(
            executions.c.job_name == JOB
        ))).scalars().all()  # fmt: skip
    recorded = {r.isoformat() for r in rows}
    first = min(slot_time(r["slot"]) for r in starts("interval"))
    for second in range(int(first), int(stopping) - 1):
        slot = datetime.fromtimestamp(second, UTC).isoformat()
        assert slot in by_slot or slot in recorded, f"{slot} unaccounted"
