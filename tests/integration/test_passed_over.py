"""Every slot on the record (guarantee 2, issue 12 item 4): slots older than ``catchup_window``
are recorded as one ``MISSED`` execution per passed-over range, with time moved by the manual
clock, on every backend."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import slotcron.lifeline.leader
from slotcron import JobContext
from slotcron.clock import ManualClock
from slotcron.jobs import misfire
from slotcron.jobs.registry import Job, Registry, every
from slotcron.store.database import Database
from slotcron.store.history import list_executions
from slotcron.store.tables import executions, jobs
from sqlalchemy import select, update

from tests.conftest import ServiceFactory, outcomes_written, wait_for

T0 = datetime(2026, 11, 22, 0, 0, 0, 500_000, tzinfo=UTC)
SECOND = timedelta(seconds=1)


def slot(k: int) -> datetime:
    return T0.replace(microsecond=0) + k * SECOND


async def rows(db: Database) -> list[Any]:
    async with db.read() as conn:
        return list((await conn.execute(select(executions).order_by(executions.c.id))).all())


def coverage(found: Sequence[Any], first: int, last: int) -> Counter[int]:
    """How many records stand for each one-second slot ``first`` .. ``last``: a row for its
    own slot, a range for every slot from ``scheduled_at`` to ``until``."""
    count: Counter[int] = Counter({k: 0 for k in range(first, last + 1)})
    for row in found:
        end = row.until or row.scheduled_at
        for k in range(first, last + 1):
            if row.scheduled_at <= slot(k) <= end:
                count[k] += 1
    return count


def one_second_job(registry: Registry, policy: str, ran: list[datetime]) -> Job:
    @every(seconds=1, name="tick", misfire=policy, catchup_window=5, registry=registry)
    async def tick(ctx: JobContext) -> None:
        ran.append(ctx.scheduled_at)

    job = registry.get("tick")
    assert job is not None
    return job


@pytest.mark.parametrize("policy", ["skip", "once", "all"])
async def test_a_20_s_outage_leaves_no_slot_without_a_record(
    db: Database, start_service: ServiceFactory, policy: str
) -> None:
    """The figure of issue 12: an @every(seconds=1, catchup_window=5) job, every instance down
    20 s. Slots :02 .. :16 are older than the window when the cluster is back at :21.5: one
    MISSED record stands for them; :17 .. :20 go by the misfire policy; :21 is on time."""
    registry = Registry()
    ran: list[datetime] = []
    job = one_second_job(registry, policy, ran)
    clock = ManualClock(T0)
    first = await start_service([job], clock=clock)
    await clock.set(T0 + SECOND)
    await wait_for(lambda: ran == [slot(1)], what="the on-time slot :01")
    await outcomes_written(db)
    await first.stop()  # the outage: no instance alive from :01.5 to :21.5

    back = ManualClock(T0 + 21 * SECOND)
    await start_service([job], clock=back)

    async def settled() -> list[Any] | None:
        found = await rows(db)
        covered = coverage(found, 1, 21)
        done = all(r.status != "RUNNING" for r in found) and min(covered.values()) > 0
        return found if done else None

    found = await wait_for(settled, what="every slot :01 .. :21 decided")
    covered = coverage(found, 1, 21)
    unrecorded = [k for k, n in covered.items() if n == 0]
    twice = [k for k, n in covered.items() if n > 1]
    print(f"misfire={policy}: {len(unrecorded)} of 21 slots of a 20 s outage have no record")
    assert unrecorded == [] and twice == []
    ranges = [r for r in found if r.until is not None]
    assert len(ranges) == 1
    (passed,) = ranges
    assert (passed.scheduled_at, passed.until, passed.status) == (slot(2), slot(16), "MISSED")
    assert passed.trigger == "interval" and passed.attempt == 1
    assert passed.error.startswith(
        f"15 slots from {slot(2).isoformat().replace('+00:00', 'Z')} to "
        f"{slot(16).isoformat().replace('+00:00', 'Z')} passed over: older than catchup_window 5s"
    )
    in_window = {k: r.status for r in found if (k := int((r.scheduled_at - slot(0)) / SECOND)) > 16}
    runs = {"skip": [], "once": [20], "all": [17, 18, 19, 20]}[policy]
    assert in_window == {k: "COMPLETED" if k in [*runs, 21] else "MISSED" for k in range(17, 22)}
    assert sorted(ran) == [slot(1), *(slot(k) for k in runs), slot(21)]
    # The record reads back with its range, newest slot first, as history and the API show it.
    history = await list_executions(db, job="tick", status="MISSED")
    assert [r.until for r in history if r.until] == [slot(16)]


async def test_two_instances_back_from_one_outage_record_each_slot_once(
    db: Database, start_service: ServiceFactory
) -> None:
    """Both instances pass over the old slots, each with its own window edge (their clocks are
    a second apart): the range is recorded once, and no slot recorded one by one overlaps it."""
    registry = Registry()
    ran: list[datetime] = []
    job = one_second_job(registry, "skip", ran)
    clock = ManualClock(T0)
    first = await start_service([job], clock=clock)
    await clock.set(T0 + SECOND)
    await wait_for(lambda: ran == [slot(1)], what="the on-time slot :01")
    await outcomes_written(db)
    await first.stop()

    early, late = ManualClock(T0 + 21 * SECOND), ManualClock(T0 + 22 * SECOND)
    await start_service([job], clock=early)
    await start_service([job], clock=late)
    await early.set(T0 + 22 * SECOND)

    async def settled() -> list[Any] | None:
        found = await rows(db)
        done = all(r.status != "RUNNING" for r in found) and min(coverage(found, 1, 22).values())
        return found if done else None

    found = await wait_for(settled, what="every slot :01 .. :22 decided")
    covered = coverage(found, 1, 22)
    assert [k for k, n in covered.items() if n != 1] == [], covered
    assert len({r.scheduled_at for r in found}) == len(found)


async def test_a_gap_found_by_a_claim_is_recorded_as_one_range_then_its_window(
    db: Database, start_service: ServiceFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lone job whose claims gave up (the database was down for five minutes): its next claim
    finds the gap, records the part older than the window as one range, the rest MISSED."""
    # The claim is to find the gap, not the leader's sweep for overdue jobs (a tick of it between
    # the gap's making and the clock's step, met under load, decides it at :00.5 instead).
    monkeypatch.setattr(slotcron.lifeline.leader, "MAX_GRACE", timedelta(days=1))
    registry = Registry()
    ran: list[datetime] = []

    @every(seconds=10, name="ten", catchup_window=30, registry=registry)
    async def ten(ctx: JobContext) -> None:
        ran.append(ctx.scheduled_at)

    clock = ManualClock(T0)
    await start_service(list(registry), clock=clock)
    async with db.transaction() as conn:  # as if :-300 .. :00 had never been claimed
        await conn.execute(update(jobs).values(next_slot_at=slot(-300)))
    await clock.set(T0 + 10 * SECOND)
    await wait_for(lambda: ran == [slot(10)], what="the on-time slot :10")
    await outcomes_written(db)
    found = await rows(db)
    by_slot = {(r.scheduled_at, r.until, r.status) for r in found}
    # Claimed at :10.5, the window reaches back to -19.5 s: -300 .. -20 passed over, -10 and
    # :00 MISSED one by one.
    assert by_slot == {
        (slot(-300), slot(-20), "MISSED"),
        (slot(-10), None, "MISSED"),
        (slot(0), None, "MISSED"),
        (slot(10), None, "COMPLETED"),
    }
    (passed,) = [r for r in found if r.until]
    assert passed.error.startswith("29 slots from ")


async def test_the_leaders_sweep_records_a_passed_over_range(
    db: Database, start_service: ServiceFactory
) -> None:
    """The leader's sweep (slots nobody decided, found by the leader) records the range too."""
    registry = Registry()

    @every(seconds=10, name="swept", catchup_window=30, registry=registry)
    async def swept() -> None: ...

    clock = ManualClock(T0)
    service = await start_service(list(registry), clock=clock)
    assert service.firing.reconcile("swept", slot(-300))

    async def recorded() -> list[Any]:
        return [r for r in await rows(db) if r.until is not None]

    (passed,) = await wait_for(recorded, what="the range recorded")
    assert (passed.scheduled_at, passed.until) == (slot(-300), slot(-30))
    # Recorded once: the same range passed over again (another instance's sweep) is closed.
    job = registry.get("swept")
    assert job is not None
    again = misfire.passed_over(job, service.schedules["swept"], slot(-300), clock.now())
    assert again is not None and (again.first, again.last) == (slot(-300), slot(-30))
    await service.firing.pass_over([(job, again)], clock.now())
    assert len(await recorded()) == 1
