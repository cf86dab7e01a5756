"""slotcron.store.lifeline: runs whose instance died, handed back or recorded ABANDONED; and
slotcron.store.instance_ids: the instance id held by one live process at a time."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from types import SimpleNamespace

import pytest
from slotcron.errors import ConfigError
from slotcron.store import instance_ids, lifeline, markers, registrations
from slotcron.store.database import Database
from slotcron.store.tables import executions, instances
from sqlalchemy import update

from tests.store.common import (
    EARLY,
    LEASE,
    NOW,
    SLOT,
    add_run,
    claim_ahead,
    register,
    run_row,
    table_rows,
)

LAPSED = NOW + LEASE + timedelta(seconds=1)


async def test_announce_queued_tells_listeners_where_the_database_can(db: Database) -> None:
    heard: asyncio.Queue[str] = asyncio.Queue()
    listening = await db.dialect.listen(db.engine, lifeline.QUEUED_CHANNEL, heard.put_nowait)
    try:
        async with db.transaction() as conn:
            await lifeline.announce_queued(conn, db.dialect, NOW)
        if listening is None:  # MariaDB, SQLite: no notifications, instances poll
            assert db.dialect.name != "postgresql"
            return
        async with asyncio.timeout(5):
            assert await heard.get() == NOW.isoformat()
    finally:
        if listening is not None:
            await listening.close()


async def test_queue_retry_queues_the_next_attempt_with_params_and_state(db: Database) -> None:
    run = await add_run(db, status="FAILED", params={"p": 1}, state={"s": [2]})
    row = SimpleNamespace(**await run_row(db, run))
    async with db.transaction() as conn:
        retry = await lifeline.queue_retry(conn, row=row, now=NOW, backoff=2.5, dialect=db.dialect)
    assert retry is not None
    queued = await run_row(db, retry)
    assert (queued["status"], queued["attempt"], queued["trigger"], queued["scheduled_at"]) == (
        "QUEUED",
        2,
        "retry",
        SLOT,
    )
    assert (queued["available_at"], queued["params"], queued["state"]) == (
        NOW + timedelta(seconds=2.5),
        {"p": 1},
        {"s": [2]},
    )


async def test_abandon_lapsed_records_started_runs_abandoned_and_retries_them(
    db: Database,
) -> None:
    await register(db, "retried", options={"max_attempts": 2, "retry_backoff": 5, "alert": False})
    await register(db, "once", "live")
    retried = await add_run(db, "retried", instance="dead")
    once = await add_run(db, "once", instance="dead")
    live = await add_run(db, "live", instance="dead", lease_ms=LEASE.seconds * 3000)

    found = await lifeline.abandon_lapsed(db, now=LAPSED)

    by_id = {a.execution_id: a for a in found}
    assert set(by_id) == {retried, once}
    assert (by_id[retried].alert, by_id[once].alert) == (False, True)
    assert by_id[once].retry_id is None and not by_id[once].handed_back
    assert by_id[retried].lease_until == NOW + LEASE and by_id[retried].instance_id == "dead"
    row = await run_row(db, once)
    assert (row["status"], row["finished_at"], row["started_at"]) == ("ABANDONED", LAPSED, NOW)
    assert row["error"] == (
        f"instance dead stopped renewing the lease, which lapsed at {(NOW + LEASE).isoformat()}"
    )
    retry_id = by_id[retried].retry_id
    assert retry_id is not None
    retry = await run_row(db, retry_id)
    assert (retry["status"], retry["attempt"], retry["available_at"]) == (
        "QUEUED",
        2,
        LAPSED + timedelta(seconds=5),
    )
    assert (await run_row(db, live))["status"] == "RUNNING"
    assert await lifeline.abandon_lapsed(db, now=LAPSED) == [], "decided once"


async def test_abandon_lapsed_hands_back_a_run_whose_body_never_started(db: Database) -> None:
    await register(db, "a", "b")
    _, runs = await claim_ahead(db, "a")
    lone = await add_run(db, "b", instance="me", started=False)

    found = await lifeline.abandon_lapsed(db, now=LAPSED)

    assert {(a.execution_id, a.handed_back, a.retry_id) for a in found} == {
        (runs["a"], True, None),
        (lone, True, None),
    }
    for execution_id in (runs["a"], lone):
        row = await run_row(db, execution_id)
        assert (row["status"], row["attempt"], row["instance_id"], row["available_at"]) == (
            "QUEUED",
            1,
            None,
            LAPSED,
        )
        assert (row["lease_until"], row["start_key"], row["fencing_token"]) == (None, None, None)


async def test_abandon_orphans_takes_a_restarted_instances_runs_whatever_their_lease(
    db: Database,
) -> None:
    await register(db, "job", "other")
    mine = await add_run(db, instance="me")
    theirs = await add_run(db, "other", instance="Me")
    found = await lifeline.abandon_orphans(db, instance_id="me", now=NOW)
    assert [a.execution_id for a in found] == [mine]
    row = await run_row(db, mine)
    assert (row["status"], row["error"]) == (
        "ABANDONED",
        "instance me restarted; the run did not survive its previous process",
    )
    assert (await run_row(db, theirs))["status"] == "RUNNING"


async def test_hand_back_only_unstarted_runs_that_match(db: Database) -> None:
    unstarted = await add_run(db, "a", instance="me", started=False)
    started = await add_run(db, "b", instance="me")
    other = await add_run(db, "c", instance="you", started=False)
    ids = [unstarted, started, other]
    back = await lifeline.hand_back(db, ids, which=executions.c.instance_id == "me", now=NOW)
    assert back == {unstarted}
    assert await lifeline.hand_back(db, [], which=executions.c.id > 0, now=NOW) == set()
    assert [r["status"] for r in await table_rows(db, executions)] == [
        "QUEUED",
        "RUNNING",
        "RUNNING",
    ]
    assert await lifeline.hand_back_mine(db, ids, instance_id="you", now=NOW) == {other}


async def test_hand_back_mine_leaves_a_marked_chunk_unless_told_its_body_never_ran(
    db: Database,
) -> None:
    await register(db, "a")
    key, runs = await claim_ahead(db, "a")
    await mark_chunk(db, key, runs["a"])
    assert await lifeline.hand_back_mine(db, [runs["a"]], instance_id="me", now=SLOT) == set()
    assert await lifeline.hand_back_mine(
        db, [runs["a"]], instance_id="me", now=SLOT, marked_too=True
    ) == {runs["a"]}
    row = await run_row(db, runs["a"])
    assert (row["status"], row["start_key"], row["instance_id"]) == ("QUEUED", None, None)


async def mark_chunk(db: Database, key: str, execution_id: int) -> None:
    marked = await markers.mark(
        db,
        key,
        ids=[execution_id],
        slot=SLOT,
        lease_until=EARLY + LEASE,
        instance_id="me",
        now=SLOT,
    )
    assert marked.started


async def test_next_unstarted_lapse_is_the_earliest_lease_of_a_run_not_started(
    db: Database,
) -> None:
    assert await lifeline.next_unstarted_lapse(db) is None
    await register(db, "a")
    key, runs = await claim_ahead(db, "a")  # lease until EARLY + LEASE
    await add_run(db, "b", started=False, lease_ms=LEASE.seconds * 2000)
    await add_run(db, "c", now=EARLY - timedelta(seconds=1))  # started: not counted
    assert await lifeline.next_unstarted_lapse(db) == EARLY + LEASE
    await mark_chunk(db, key, runs["a"])  # started by its chunk's marker
    assert await lifeline.next_unstarted_lapse(db) == NOW + 2 * LEASE


class StepClock:
    """A clock whose every sleep is a step of ``step`` seconds, after ``on_sleep`` runs."""

    def __init__(
        self, start: datetime, step: float, on_sleep: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        self.at = start
        self.step = step
        self.on_sleep = on_sleep
        self.slept = 0

    def now(self) -> datetime:
        return self.at

    def monotonic(self) -> float:
        return self.at.timestamp()

    def said_at(self, moment: float) -> datetime:
        return self.at

    async def sleep(self, seconds: float) -> None:
        self.slept += 1
        if self.on_sleep is not None:
            await self.on_sleep()
        self.at += timedelta(seconds=self.step)

    async def sleep_until(self, when: datetime, *, precise: bool = False) -> None:
        self.at = max(self.at, when)


async def instance_rows(db: Database) -> dict[str, tuple[object, ...]]:
    return {
        r["instance_id"]: (r["incarnation"], r["state"], r["heartbeat_at"])
        for r in await table_rows(db, instances)
    }


async def test_hold_instance_id_takes_a_new_stopped_or_own_row_at_once(db: Database) -> None:
    clock = StepClock(NOW, 0)
    first = await instance_ids.hold_instance_id(db, instance_id="pod-0", lapse=10, clock=clock)
    assert len(first) == 32
    row = (await table_rows(db, instances))[0]
    assert (row["host"], row["pid"], row["state"], row["incarnation"]) == (
        socket.gethostname(),
        os.getpid(),
        "running",
        first,
    )
    again = await instance_ids.hold_instance_id(
        db, instance_id="pod-0", lapse=10, clock=clock, incarnation=first
    )
    assert again == first, "a start-up retried takes its own row back"
    await registrations.set_instance_state(db, instance_id="pod-0", state="stopped", now=NOW)
    taken = await instance_ids.hold_instance_id(db, instance_id="pod-0", lapse=10, clock=clock)
    assert taken != first and clock.slept == 0
    other = await instance_ids.hold_instance_id(db, instance_id="Pod-0", lapse=10, clock=clock)
    assert await instance_rows(db) == {
        "pod-0": (taken, "running", NOW),
        "Pod-0": (other, "running", NOW),
    }


async def test_hold_instance_id_refuses_a_live_holder_and_takes_a_dead_ones_row(
    db: Database,
) -> None:
    holder = await instance_ids.hold_instance_id(
        db, instance_id="pod-0", lapse=10, clock=StepClock(NOW, 0)
    )
    beats = 0

    async def heartbeat() -> None:  # the holder is alive: its heartbeat moves
        nonlocal beats
        beats += 1
        async with db.transaction() as conn:
            await conn.execute(
                update(instances).values(heartbeat_at=NOW + timedelta(milliseconds=beats))
            )

    with pytest.raises(ConfigError, match="held by a live process"):
        await instance_ids.hold_instance_id(
            db, instance_id="pod-0", lapse=10, clock=StepClock(NOW, 0.25, heartbeat)
        )
    assert (await instance_rows(db))["pod-0"][0] == holder
    # A holder whose heartbeat stays still past the lapse is gone (killed): its row is taken.
    clock = StepClock(NOW + timedelta(seconds=1), 10)
    taken = await instance_ids.hold_instance_id(db, instance_id="pod-0", lapse=10, clock=clock)
    assert clock.slept == 1 and taken != holder
    assert (await instance_rows(db))["pod-0"] == (taken, "running", clock.at)
