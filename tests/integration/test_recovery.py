"""What happens when runs fail, instances die, leaders change and slots go undecided."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from slotcron import JobContext
from slotcron.clock import ManualClock
from slotcron.jobs.registry import Registry, cron, every
from slotcron.store import leadership
from slotcron.store.database import Database
from slotcron.store.tables import executions
from sqlalchemy import insert, select

from tests.conftest import ServiceFactory, outcomes_written, wait_for
from tests.integration.test_claims import hold_job_row

T0 = datetime(2026, 11, 22, 0, 0, 0, 500_000, tzinfo=UTC)


async def rows(db: Database, job: str) -> list[dict[str, object]]:
    async with db.read() as conn:
        result = await conn.execute(
            select(executions)
            .where(executions.c.job_name == job)
            .order_by(executions.c.scheduled_at, executions.c.attempt)
        )
        return [dict(r) for r in result.mappings()]


async def test_a_failed_run_is_retried_with_its_slot_and_checkpointed_state(
    db: Database, start_service: ServiceFactory
) -> None:
    registry = Registry()
    seen: list[tuple[datetime, int, str, dict[str, object]]] = []

    @every(seconds=2, name="flaky", max_attempts=2, retry_backoff=0.2, registry=registry)
    async def flaky(ctx: JobContext) -> None:
        seen.append((ctx.scheduled_at, ctx.attempt, ctx.trigger, dict(ctx.state)))
        if ctx.attempt == 1:
            await ctx.checkpoint(done=["a", "b"])
            raise RuntimeError("transient")

    await start_service(list(registry))
    await wait_for(lambda: any(a == 2 for _, a, _, _ in seen), what="the retry of a slot")
    slot = next(s for s, a, _, _ in seen if a == 2)
    attempts = [(a, trig, state) for s, a, trig, state in seen if s == slot]
    assert attempts == [(1, "interval", {}), (2, "retry", {"done": ["a", "b"]})]
    records = [r for r in await rows(db, "flaky") if r["scheduled_at"] == slot]
    await wait_for(
        lambda: _statuses(db, "flaky", slot, ["FAILED", "COMPLETED"]), what="both attempts recorded"
    )
    assert [r["attempt"] for r in records] == [1, 2]


async def _statuses(db: Database, job: str, slot: datetime, want: list[str]) -> bool:
    return [r["status"] for r in await rows(db, job) if r["scheduled_at"] == slot] == want


async def test_a_run_whose_instance_died_is_abandoned_and_retried_by_a_live_one(
    db: Database, start_service: ServiceFactory
) -> None:
    registry = Registry()
    retried: list[tuple[datetime, int, str, dict[str, object]]] = []

    @cron("0 0 1 1 *", name="nightly", max_attempts=3, retry_backoff=0, registry=registry)
    async def nightly(ctx: JobContext) -> None:
        retried.append((ctx.scheduled_at, ctx.attempt, ctx.trigger, dict(ctx.state)))

    service = await start_service(list(registry), lease_seconds=2, heartbeat_seconds=0.2)
    slot = datetime(2026, 1, 1, tzinfo=UTC)
    lapsed = service.clock.now() - timedelta(seconds=1)
    async with db.transaction() as conn:
        await conn.execute(
            insert(executions).values(
                job_name="nightly",
                scheduled_at=slot,
                trigger="cron",
                status="RUNNING",
                attempt=1,
                instance_id="ghost",
                created_at=lapsed,
                started_at=lapsed,
                heartbeat_at=lapsed,
                lease_until=lapsed,
                lease_ms=2000,
                state={"cursor": 42},
                params={},
            )
        )
    await wait_for(lambda: retried, timeout=10, what="the retry to run")
    assert retried == [(slot, 2, "retry", {"cursor": 42})]
    await wait_for(
        lambda: _statuses(db, "nightly", slot, ["ABANDONED", "COMPLETED"]), what="records"
    )
    abandoned = (await rows(db, "nightly"))[0]
    assert "ghost" in str(abandoned["error"]) and "lease" in str(abandoned["error"])


@pytest.mark.apart  # a bound on lateness, light itself: beside the `alone` tests only
async def test_one_leader_at_a_time_and_another_takes_over_within_one_lease(
    db: Database, start_service: ServiceFactory
) -> None:
    a = await start_service([], instance_id="a", lease_seconds=1, heartbeat_seconds=0.1)
    b = await start_service([], instance_id="b", lease_seconds=1, heartbeat_seconds=0.1)
    await wait_for(lambda: a.leader.leading or b.leader.leading, what="a leader")
    for _ in range(10):
        assert a.leader.leading + b.leader.leading <= 1
        await asyncio.sleep(0.05)
    first, other = (a, b) if a.leader.leading else (b, a)
    # The leader dies without resigning: its loop stops, its lease is left to lapse.
    assert first.leader._task is not None
    first.leader._task.cancel()
    died = asyncio.get_running_loop().time()
    await wait_for(lambda: other.leader.leading, timeout=5, what="the takeover")
    took = asyncio.get_running_loop().time() - died
    assert took <= 1 + 0.1 + 0.3, f"takeover took {took:.2f} s with a 1 s lease"
    holder, _ = await leadership.current(db)
    assert holder == other.instance_id


async def test_a_node_that_lost_the_lease_cannot_renew_it(db: Database) -> None:
    now = datetime.now(UTC)
    assert await leadership.take(db, instance_id="a", now=now, lease=1)
    assert not await leadership.take(db, instance_id="b", now=now, lease=1)
    later = now + timedelta(seconds=2)
    assert await leadership.take(db, instance_id="b", now=later, lease=1)
    assert not await leadership.take(db, instance_id="a", now=later, lease=1)
    assert (await leadership.current(db))[0] == "b"


async def test_slots_due_while_no_instance_ran_are_accounted_for_at_start(
    db: Database, start_service: ServiceFactory
) -> None:
    registry = Registry()
    ran: list[datetime] = []

    @every(seconds=10, name="ten", registry=registry)
    async def ten(ctx: JobContext) -> None:
        ran.append(ctx.scheduled_at)

    first_clock = ManualClock(T0)
    first = await start_service(list(registry), clock=first_clock, instance_id="first")
    await first_clock.set(T0 + timedelta(seconds=10))
    await wait_for(lambda: len(ran) == 1, what="slot :10")
    await first.stop()
    # The whole cluster is down for 35 s; the next instance starts at :45.5.
    second_clock = ManualClock(T0 + timedelta(seconds=45))
    await start_service(list(registry), clock=second_clock, instance_id="second")
    base = T0.replace(microsecond=0)

    async def settled() -> bool:
        got = {r["scheduled_at"]: r["status"] for r in await rows(db, "ten")}
        return got == {
            base + timedelta(seconds=10): "COMPLETED",
            base + timedelta(seconds=20): "MISSED",
            base + timedelta(seconds=30): "MISSED",
            base + timedelta(seconds=40): "COMPLETED",
        }

    await wait_for(settled, what=":20 and :30 MISSED, :40 run")


async def test_a_slot_whose_claim_gave_up_is_recorded_when_the_next_one_is_claimed(
    db: Database, backend: str, start_service: ServiceFactory
) -> None:
    if backend == "sqlite":
        pytest.skip("SQLite's lock is database-wide: holding it for seconds stalls every write")
    registry = Registry()
    ran: list[datetime] = []

    @every(seconds=10, name="ten", registry=registry)
    async def ten(ctx: JobContext) -> None:
        ran.append(ctx.scheduled_at)

    clock = ManualClock(T0)
    service = await start_service(list(registry), clock=clock)
    await clock.set(T0 + timedelta(seconds=10))
    await wait_for(lambda: len(ran) == 1, what="slot :10")
    await outcomes_written(db)
    # The job's row stays locked (as in an outage) until :20 is past its grace (10 s).
    held, release = asyncio.Event(), asyncio.Event()
    holder = asyncio.create_task(hold_job_row(db, backend, held, release))
    await held.wait()
    await clock.set(T0 + timedelta(seconds=20))
    await wait_for(lambda: service.claimer.stats.busy_retries > 0, what="busy retries for :20")
    await clock.set(T0 + timedelta(seconds=30))
    await wait_for(lambda: service.claimer.stats.gave_up == 1, what="the :20 claim to give up")
    release.set()
    await holder
    base = T0.replace(microsecond=0)

    async def settled() -> bool:
        got = {r["scheduled_at"]: r["status"] for r in await rows(db, "ten")}
        return got == {
            base + timedelta(seconds=10): "COMPLETED",
            base + timedelta(seconds=20): "MISSED",
            base + timedelta(seconds=30): "COMPLETED",
        }

    await wait_for(settled, what=":20 MISSED once :30 is claimed")
    missed = next(r for r in await rows(db, "ten") if r["status"] == "MISSED")
    assert "misfire" in str(missed["error"])


async def test_the_leader_decides_a_slot_left_undecided_without_waiting_for_the_next_one(
    db: Database, backend: str, start_service: ServiceFactory
) -> None:
    if backend == "sqlite":
        pytest.skip("SQLite's lock is database-wide: holding it for seconds stalls every write")
    registry = Registry()
    ran: list[tuple[datetime, str]] = []

    @cron("0 0 * * *", name="midnight", misfire="once", registry=registry)
    async def midnight(ctx: JobContext) -> None:
        ran.append((ctx.scheduled_at, ctx.trigger))

    eve = datetime(2026, 11, 22, 23, 59, 59, tzinfo=UTC)
    clock = ManualClock(eve)
    service = await start_service(list(registry), clock=clock, heartbeat_seconds=0.5)
    await wait_for(lambda: service.leader.leading, what="leadership")
    held, release = asyncio.Event(), asyncio.Event()
    holder = asyncio.create_task(hold_job_row(db, backend, held, release))
    await held.wait()
    await clock.set(eve + timedelta(seconds=1))  # midnight: its claim finds the row busy
    await wait_for(lambda: service.claimer.stats.busy_retries > 0, what="busy retries")
    await clock.set(eve + timedelta(seconds=62))  # past the 60 s grace: it gives up
    await wait_for(lambda: service.claimer.stats.gave_up == 1, what="the claim to give up")
    release.set()
    await holder
    # The next slot is tomorrow; the leader's sweep decides midnight now instead.
    for step in range(1, 40):
        await clock.set(eve + timedelta(seconds=62 + step * 0.5))
        if ran:
            break
        await asyncio.sleep(0.05)
    assert ran == [(datetime(2026, 11, 23, tzinfo=UTC), "catchup")]


async def test_an_instance_that_stopped_heartbeating_is_recorded_stopped_by_the_leader(
    db: Database, start_service: ServiceFactory
) -> None:
    from slotcron.store import registrations
    from slotcron.store.tables import instances

    long_ago = datetime.now(UTC) - timedelta(minutes=5)
    await registrations.register_instance(
        db, instance_id="killed", host="h", pid=1, version="0", now=long_ago
    )
    await start_service([], instance_id="alive", lease_seconds=2, heartbeat_seconds=0.2)

    async def states() -> dict[str, str]:
        async with db.read() as conn:
            found = await conn.execute(select(instances.c.instance_id, instances.c.state))
            return {r.instance_id: r.state for r in found}

    async def settled() -> bool:
        return await states() == {"killed": "stopped", "alive": "running"}

    await wait_for(settled, what="the silent instance recorded stopped")


async def test_retention_prunes_old_history_and_the_pruned_slot_stays_closed(
    db: Database, start_service: ServiceFactory
) -> None:
    from slotcron.store import retention

    registry = Registry()
    ran: list[datetime] = []

    @every(seconds=10, name="old", registry=registry)
    async def old(ctx: JobContext) -> None:
        ran.append(ctx.scheduled_at)

    clock = ManualClock(T0)
    service = await start_service(list(registry), clock=clock, instance_id="keeper")
    await clock.set(T0 + timedelta(seconds=10))
    await wait_for(lambda: len(ran) == 1, what="slot :10")
    await wait_for(lambda: _statuses(db, "old", ran[0], ["COMPLETED"]), what="recorded")
    pruned = await retention.prune(db, before=T0 + timedelta(days=31))
    assert pruned == 1
    assert await rows(db, "old") == []
    # The slot's record is gone, but the slot stays closed to every claimer.
    claim = await service.claimer.claim(
        registry.get("old"),  # type: ignore[arg-type]
        ran[0],
        trigger="interval",
        following=ran[0] + timedelta(seconds=10),
        check_gap=False,
    )
    assert claim is None and service.claimer.stats.taken == 1
    assert await rows(db, "old") == []
