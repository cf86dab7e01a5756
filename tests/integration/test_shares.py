"""Each slot planned once per cluster (issue 29): two in-process instances share their jobs by
rendezvous hashing, each job's slots run on its owner, and an owner that leaves has its slots
taken over at once, judged by what the jobs recorded themselves."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from slotcron import JobContext, cron
from slotcron.clock import ManualClock
from slotcron.engine import takeover
from slotcron.engine.shares import owner
from slotcron.jobs.registry import Registry, task
from slotcron.service.service import Service
from slotcron.store import schedules
from slotcron.store.database import Database
from slotcron.store.tables import executions
from sqlalchemy import func, select

from tests.conftest import ServiceFactory, wait_for

JOBS = 20
Ran = list[tuple[str, datetime, str]]


def every_second(ran: Ran) -> Registry:
    registry = Registry()

    def make(i: int) -> None:
        @cron("* * * * * *", name=f"share-{i}", registry=registry)
        async def job(ctx: JobContext) -> None:
            ran.append((ctx.job, ctx.scheduled_at, ctx.instance_id))

    for i in range(JOBS):
        make(i)
    return registry


async def _nothing() -> None:
    pass


def slots_seen(ran: Ran) -> list[datetime]:
    return sorted({slot for _, slot, _ in ran})


async def sharing_pair(start_service: ServiceFactory, ran: Ran) -> tuple[Service, Service]:
    """Two instances of the same jobs, once the first has seen the second."""
    registry = every_second(ran)
    a = await start_service(list(registry), instance_id="share-a")
    b = await start_service(list(registry), instance_id="share-b")
    await wait_for(lambda: a.takeover.shares.members == ("share-a", "share-b"), what="a sees b")
    # b told a it joined: a's heartbeat found its flag (a reads nothing while alone).
    await wait_for(lambda: a.membership.flags >= 1, what="a's heartbeat to find b's flag")
    return a, b


def assert_each_ran_once(ran: Ran, slots: list[datetime], what: str) -> None:
    """No slot ran twice, and every job ran at each of ``slots``."""
    counts = Counter((job, slot) for job, slot, _ in ran)
    assert not [k for k, n in counts.items() if n > 1], "a slot ran twice"
    for slot in slots:
        for i in range(JOBS):
            assert (f"share-{i}", slot) in counts, f"share-{i} at {slot} {what}"


@pytest.mark.parametrize("backend", ["postgresql", "mariadb", "sqlite"], indirect=True)
async def test_two_instances_share_the_jobs_and_run_each_slot_once(
    start_service: ServiceFactory,
) -> None:
    ran: Ran = []
    a, b = await sharing_pair(start_service, ran)
    since = max(slots_seen(ran), default=datetime.min.replace(tzinfo=UTC))
    await wait_for(
        lambda: len([s for s in slots_seen(ran) if s > since]) >= 4, timeout=20, what="4 slots"
    )
    shared = [s for s in slots_seen(ran) if s > since][:-1]  # the last may be under way
    assert_each_ran_once(ran, shared, "did not run")
    # Each job ran where rendezvous hashing puts it, and both instances have a share.
    members = ["share-a", "share-b"]
    where = {(job, slot): instance for job, slot, instance in ran if slot in shared}
    wrong = {k: v for k, v in where.items() if v != owner(k[0], members)}
    assert not wrong, f"runs away from their owner: {wrong}"
    assert set(where.values()) == set(members)
    assert a.takeover.taken == b.takeover.taken == 0
    for instance in (a, b):  # each job planned once on its owner, never twice
        entries = Counter(job.name for _, _, job in instance.planner._heap)
        assert entries and max(entries.values()) == 1, entries


@pytest.mark.parametrize("backend", ["postgresql", "sqlite"], indirect=True)
async def test_an_instance_alone_reads_no_members_until_one_joins(
    start_service: ServiceFactory,
) -> None:
    ran: Ran = []
    registry = every_second(ran)
    a = await start_service(list(registry), instance_id="alone-a")
    beats = a.heartbeat.period
    # Its reads in the first two periods after joining (members started with it) are over.
    await wait_for(lambda: not a.membership.settling, timeout=4 * beats + 5, what="settled")
    reads = a.membership.reads
    await wait_for(lambda: len(slots_seen(ran)) >= 4 * beats + 2, timeout=30, what="4 periods")
    assert a.membership.reads == reads, "an instance alone read the members"
    await start_service(list(registry), instance_id="alone-b")
    await wait_for(lambda: len(a.takeover.shares.members) == 2, timeout=10, what="a sees b")
    assert a.membership.flags == 1


@pytest.mark.parametrize("backend", ["postgresql", "sqlite"], indirect=True)
async def test_instances_started_together_see_each_other_within_seconds_not_heartbeats(
    start_service: ServiceFactory,
) -> None:
    """The first of two instances started together reads the members again 1, 2, 4... s after
    joining: it learns of the second within seconds, not when its idle heartbeat (every other
    period: 40 s here) finds the flag the second's join set."""
    registry = Registry()  # no slot due for months: no lost claim hints at the other either
    for i in range(JOBS):
        cron("0 0 1 1 *", name=f"quiet-{i}", registry=registry)(_nothing)
    settings = {"heartbeat_seconds": 20.0, "lease_seconds": 80.0}
    a = await start_service(list(registry), instance_id="early-a", **settings)
    await wait_for(lambda: a.membership.reads >= 1, what="a to join")
    b = await start_service(list(registry), instance_id="early-b", **settings)
    await wait_for(lambda: b.takeover.shares.members == ("early-a", "early-b"), what="b sees a")
    await wait_for(
        lambda: a.takeover.shares.members == ("early-a", "early-b"), timeout=9, what="a sees b"
    )
    assert a.membership.flags == 0, "learnt from its heartbeat's flag, not by reading"


async def last_claimed(instance: Service) -> datetime:
    """The latest slot ``instance`` claimed. A claim under way when its planner stops is
    finished, not dropped (shutdown's phase 1: tests/integration/test_batch_claims.py), and its
    slot runs there: the slots taken over are the ones after it."""
    query = select(func.max(executions.c.scheduled_at)).where(
        executions.c.instance_id == instance.instance_id
    )
    async with instance.db.read() as conn:
        latest: datetime = (await conn.execute(query)).scalar_one()
    return latest


@pytest.mark.parametrize("backend", ["postgresql", "mariadb"], indirect=True)
async def test_an_owner_that_stops_has_its_slots_taken_over_within_its_grace(
    start_service: ServiceFactory,
) -> None:
    ran: Ran = []
    a, b = await sharing_pair(start_service, ran)
    # a stops planning and claiming without a word to b (a member hung on its database, or
    # paused): its heartbeat row still says it is alive.
    await a.planner.stop()
    stopped = max(max(slots_seen(ran)), await last_claimed(a))
    await wait_for(
        lambda: len([s for s in slots_seen(ran) if s > stopped]) >= 3, timeout=20, what="3 slots"
    )
    after = [s for s in slots_seen(ran) if s > stopped][:-1]
    assert_each_ran_once(ran, after, "was not taken over")
    assert b.takeover.taken > 0
    assert {instance for _, slot, instance in ran if slot in after} == {"share-b"}


async def test_a_member_behind_takes_nothing_over_until_it_has_caught_up(
    start_service: ServiceFactory,
) -> None:
    ran: Ran = []
    a, b = await sharing_pair(start_service, ran)
    behind_until = [0.0]

    def keep_behind() -> bool:  # b decides a slot of its own late every look, for 3 s
        if b.clock.now().timestamp() < behind_until[0]:
            b.planner.firing.late.note()
        return False

    await a.planner.stop()
    behind_until[0] = b.clock.now().timestamp() + 3.0
    b.planner.firing.late.note()
    with pytest.raises(AssertionError):  # nothing taken over while behind (3 s)
        await wait_for(lambda: keep_behind() or b.takeover.taken > 0, timeout=2.5, what="held")
    assert b.takeover.taken == 0
    # Caught up (2 s after its last late slot): a's slots are taken over again.
    await wait_for(lambda: b.takeover.taken > 0, timeout=10, what="b to take over")
    assert b.clock.now().timestamp() >= behind_until[0] + takeover.BEHIND.total_seconds() - 0.5
    counts = Counter((job, slot) for job, slot, _ in ran)
    assert not [k for k, n in counts.items() if n > 1], "a slot ran twice"


def every_second_task(ran: Ran) -> Registry:
    registry = Registry()

    @task(name="share.report", registry=registry)
    async def report(ctx: JobContext) -> None:
        ran.append((ctx.job, ctx.scheduled_at, ctx.instance_id))

    return registry


@pytest.mark.parametrize("backend", ["postgresql", "mariadb"], indirect=True)
async def test_a_runtime_schedules_owner_that_stops_has_its_slots_taken_over(
    start_service: ServiceFactory, db: Database
) -> None:
    ran: Ran = []
    registry = every_second_task(ran)
    items = [{"task": "share.report", "id": f"tenant-{i}", "every": 1} for i in range(JOBS)]
    await schedules.create(
        db, items, default_timezone="UTC", by="test", registry=registry, now=datetime.now(UTC)
    )
    a = await start_service(tasks=registry.tasks(), instance_id="share-a")
    b = await start_service(tasks=registry.tasks(), instance_id="share-b")
    await wait_for(lambda: a.takeover.shares.members == ("share-a", "share-b"), what="a sees b")
    members = ["share-a", "share-b"]
    mine = {f"tenant-{i}" for i in range(JOBS) if owner(f"tenant-{i}", members) == "share-a"}
    assert mine, "a owns some schedules"
    # a stops firing its schedules without a word to b: its row still says it is alive.
    await wait_for(lambda: {job for job, _, who in ran if who == "share-a"} >= mine, what="a's")
    await a.schedule_planner.stop()
    stopped = max(max(slots_seen(ran)), await last_claimed(a))
    await wait_for(
        lambda: len([s for s in slots_seen(ran) if s > stopped]) >= 3, timeout=20, what="3 slots"
    )
    after = [s for s in slots_seen(ran) if s > stopped][:-1]
    counts = Counter((job, slot) for job, slot, _ in ran)
    assert not [k for k, n in counts.items() if n > 1], "a slot ran twice"
    for slot in after:
        for name in mine:
            assert (name, slot) in counts, f"{name} at {slot} was not taken over"
    assert {who for _, slot, who in ran if slot in after} == {"share-b"}
    assert b.takeover.taken > 0


async def test_slots_that_passed_before_an_instance_planned_them_do_not_make_it_behind(
    db: Database, start_service: ServiceFactory
) -> None:
    """An instance starting after some of its jobs' slots passed records them MISSED at its
    first plan: they were nobody's to decide while no instance ran, so it is not behind, and
    takes over what a member leaves at once (noting them made every instance that had just
    started take nothing over for 2 s: a slot its view gave to another member was then nobody's,
    and MISSED). A slot of its own decided late makes it behind."""
    t0 = datetime(2026, 11, 22, 0, 0, 0, 500_000, tzinfo=UTC)
    clock = ManualClock(t0)
    registry = every_second([])
    first = await start_service(list(registry), clock=clock, instance_id="first")
    await first.stop()
    await clock.set(t0 + timedelta(seconds=5))  # five slots pass while no instance runs
    later = await start_service(list(registry), clock=clock, instance_id="later")

    async def passed_recorded() -> bool:
        async with db.read() as conn:
            query = select(func.count()).where(executions.c.status == "MISSED")
            return int((await conn.execute(query)).scalar_one()) >= JOBS * 4

    await wait_for(passed_recorded, what="the passed slots MISSED")
    assert not later.planner.firing.late.behind(takeover.BEHIND)

    # Its own slot found past its grace (a loop stalled for 3 s, say): behind.
    await clock.set(clock.now() + timedelta(seconds=3))
    await wait_for(lambda: later.planner.firing.late.behind(takeover.BEHIND), what="behind")
