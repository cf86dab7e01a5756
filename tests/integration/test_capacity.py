"""Capacity is shared, never hoarded (issue 26, item 1): runs claimed ahead of their slot hold no
permit another job needs before that slot. A burst of runtime schedules claimed seconds ahead
beside a one-second code job, on every backend, by the real clock; judged by what the jobs
recorded themselves."""

from __future__ import annotations

import time
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
import slotcron.engine.burst
import slotcron.engine.horizon
from slotcron import JobContext
from slotcron.jobs.registry import Registry, every, task
from slotcron.store import schedules as store
from slotcron.store.database import Database
from slotcron.store.tables import executions
from sqlalchemy import func, select

from tests.conftest import Services, wait_for

SCHEDULES = 300
PERIOD = 10
CAPACITY = 30


@pytest.mark.apart  # a bound on lateness (each tick within its grace) beside a burst; light
async def test_a_burst_claimed_ahead_of_its_slot_costs_a_one_second_job_no_slot(
    db: Database, services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Claimed as far ahead as a big burst is (seconds): 300 schedules, priced like 25,000.
    monkeypatch.setattr(slotcron.engine.horizon, "PREPARE_COST", 0.02)
    monkeypatch.setattr(slotcron.engine.burst, "CLAIM_COST_FIRST", 0.02)
    ticks: list[tuple[datetime, float]] = []  # the one-second job's own record: slot, start
    bursts: list[tuple[str, datetime]] = []
    registry = Registry()

    @every(seconds=1, name="tick", registry=registry)
    async def tick(ctx: JobContext) -> None:
        ticks.append((ctx.scheduled_at, time.time()))

    @task(name="capacity.quick", registry=registry)
    async def quick(ctx: JobContext) -> None:
        bursts.append((ctx.job, ctx.scheduled_at))

    now = datetime.now(UTC)
    await store.create(
        db,
        [{"task": "capacity.quick", "every": PERIOD, "id": f"s{i:04}"} for i in range(SCHEDULES)],
        default_timezone="UTC",
        by="test",
        registry=registry,
        now=now,
    )
    service = await services.start(
        list(registry), tasks=registry.tasks(), pool_size=5, max_concurrency=CAPACITY
    )
    began = time.time()
    # One whole burst: its slot comes within a period; its claims start seconds before it.
    await wait_for(lambda: len(bursts) >= SCHEDULES, timeout=PERIOD + 15, what="a whole burst")
    burst_slot = max(slot for _, slot in bursts)
    await wait_for(
        lambda: ticks and ticks[-1][0] >= burst_slot + timedelta(seconds=2),
        timeout=10,
        what="the tick job past the burst",
    )
    await service.stop()

    # Every slot of the one-second job from its first to past the burst ran, each within its
    # grace (one period) of its time: none waited for the burst's permits.
    slots = sorted(slot for slot, _ in ticks)
    first, last = slots[0], slots[-1]
    expected = [first + timedelta(seconds=k) for k in range(int((last - first).total_seconds()))]
    missing = sorted(set(expected) - set(slots))
    assert not missing, f"tick lost {len(missing)} slots: {[s.isoformat() for s in missing]}"
    late = [(s, round(at - s.timestamp(), 3)) for s, at in ticks if at - s.timestamp() > 1.0]
    assert not late, f"tick slots started past their grace: {late}"
    assert first.timestamp() <= began + 2
    # And every schedule of the burst ran its slot once.
    counts = Counter(name for name, slot in bursts if slot == burst_slot)
    assert len(counts) == SCHEDULES and set(counts.values()) == {1}
    async with db.read() as conn:
        missed = await conn.scalar(
            select(func.count())
            .select_from(executions)
            .where(executions.c.job_name == "tick", executions.c.status != "COMPLETED")
        )
    assert missed == 0, "tick slots recorded other than COMPLETED"
