"""An instance id is one live process (issue 13, item 2): a second ``slotcron run`` under an id
that a live process heartbeats refuses to start, naming the holder; a process that was killed
(and so never said ``stopped``) is replaced once its heartbeat lapses; and a process that was
only paused, and finds on resuming that its id was taken over (issue 11), starts nothing more
and exits 1 through shutdown."""

from __future__ import annotations

import asyncio
import signal
import socket
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from slotcron.store.database import Database
from slotcron.store.tables import instances
from sqlalchemy import select

from tests.cluster.harness import execution_rows, read_records, wait_until
from tests.conftest import Spawn

LEASE = 2.0
ENV = dict(
    SCHEDULER_LEASE_SECONDS=LEASE,
    SCHEDULER_HEARTBEAT_SECONDS=0.4,
    SCHEDULER_SHUTDOWN_DRAIN_TIMEOUT=0.5,
    SCHEDULER_SHUTDOWN_CANCEL_TIMEOUT=1,
)


async def instance_rows(db: Database) -> list[Any]:
    async with db.read() as conn:
        return list((await conn.execute(select(instances))).all())


async def test_a_second_live_process_under_the_same_id_refuses_to_start_naming_the_holder(
    db: Database, spawn: Spawn, records_path: Path
) -> None:
    first = spawn("twin", "tests.cluster.jobs_light", **ENV)
    await asyncio.to_thread(
        wait_until, lambda: len(read_records(records_path)) >= 2, 30, "the first to run jobs"
    )
    second = spawn("twin", "tests.cluster.jobs_light", **ENV)
    started = time.monotonic()
    status = await asyncio.to_thread(second.wait, 30)
    took = time.monotonic() - started
    log = second.log()

    assert status == 2, log
    refusal = [line for line in log.splitlines() if "configuration error" in line]
    assert len(refusal) == 1, log
    assert "SCHEDULER_INSTANCE_ID" in refusal[0] and "'twin'" in refusal[0]
    assert f"host {socket.gethostname()}" in refusal[0] and f"pid {first.pid}" in refusal[0]
    assert "Traceback" not in log
    assert first.alive(), first.log()

    # The first went on alone: no run of it was taken for an orphan, no slot ran twice.
    await asyncio.sleep(LEASE)
    rows = await execution_rows(db)
    assert not [r for r in rows if r.status == "ABANDONED"], [r.error for r in rows]
    slots = Counter((r["job"], r["slot"]) for r in read_records(records_path))
    assert not [s for s, n in slots.items() if n > 1]
    assert {r["instance"] for r in read_records(records_path)} == {"twin"}
    print(f"\nsecond process under the same id: exit {status} after {took:.1f} s: {refusal[0]}")


async def test_a_killed_process_is_replaced_under_its_id_once_its_heartbeat_lapses(
    spawn: Spawn, records_path: Path
) -> None:
    first = spawn("phoenix2", "tests.cluster.jobs_light", **ENV)
    await asyncio.to_thread(
        wait_until, lambda: len(read_records(records_path)) >= 2, 30, "the first to run jobs"
    )
    first.kill()
    killed_at = time.time()
    again = spawn("phoenix2", "tests.cluster.jobs_light", **ENV)

    def ran_again() -> bool:
        return any(
            r["pid"] == again.pid and r["wall"] > killed_at for r in read_records(records_path)
        )

    await asyncio.to_thread(wait_until, ran_again, 30, "the replacement to run jobs")
    assert again.alive(), again.log()


# Not SQLite: a process stopped inside a write transaction holds the database file's lock, and
# no process can take its id over (nor write anything) until it resumes; a server ends such a
# session by its idle-in-transaction limit.
@pytest.mark.parametrize("backend", ["postgresql", "mariadb"], indirect=True)
async def test_a_paused_process_whose_id_was_taken_over_starts_nothing_and_exits_1_on_resuming(
    db: Database, spawn: Spawn, records_path: Path
) -> None:
    first = spawn("paused", "tests.cluster.jobs_incarnation", **ENV)

    def started(pid: int, after: float = 0.0, job: str | None = None) -> list[dict[str, Any]]:
        return [
            r
            for r in read_records(records_path)
            if r["event"] == "start"
            and r["pid"] == pid
            and r["wall"] > after
            and (job is None or r["job"] == job)
        ]

    await asyncio.to_thread(
        wait_until, lambda: started(first.pid, job="long"), 30, "the first to start a long run"
    )
    [held] = started(first.pid, job="long")
    first.signal(signal.SIGSTOP)
    paused_at = time.time()
    # Takes the id over once the first's heartbeat has lapsed (it watches it for a lease).
    second = spawn("paused", "tests.cluster.jobs_incarnation", **ENV)
    await asyncio.to_thread(
        wait_until, lambda: started(second.pid, job="long"), 30, "the second to run the long job"
    )
    # The first's long run was taken for an orphan at the takeover, and is not kept alive by
    # the second's heartbeat: it stays ABANDONED.
    rows = {r.id: r for r in await execution_rows(db)}
    assert rows[held["id"]].status == "ABANDONED", rows[held["id"]]
    first.signal(signal.SIGCONT)
    resumed_at = time.time()
    status = await asyncio.to_thread(first.wait, 30)
    took = time.time() - resumed_at
    log = first.full_log()

    assert status == 1, log
    errors = [line for line in log.splitlines() if "ERROR" in line]
    assert len(errors) == 1, log
    assert "instance id paused is now held by another process" in errors[0], errors
    assert "phase 4" in log, log  # it went through the shutdown phases
    assert "Traceback" not in log, log
    assert not started(first.pid, after=resumed_at), "a body started after SIGCONT"
    stops = [
        r for r in read_records(records_path) if r["event"] == "stop" and r["id"] == held["id"]
    ]
    assert [s["lease_lost"] for s in stops] == [True], stops  # fenced, not stopped
    assert second.alive(), second.log()

    # The first left the instance row to its holder, and every RUNNING row under the id is a
    # run of the second's: nothing of the first's is kept alive.
    await asyncio.sleep(LEASE)
    rows = {r.id: r for r in await execution_rows(db)}
    assert rows[held["id"]].status == "ABANDONED"
    [instance] = await instance_rows(db)
    assert (instance.pid, instance.state) == (second.pid, "running"), instance
    running = [r for r in rows.values() if r.status == "RUNNING"]
    first_ids = {r["id"] for r in started(first.pid)}
    assert running and not [r for r in running if r.id in first_ids], (running, first_ids)
    # Each is a run of the second's: its body records its start (just after the claim's row,
    # which was read first; under load, a moment after).
    await asyncio.to_thread(
        wait_until,
        lambda: {r.id for r in running} <= {r["id"] for r in started(second.pid)},
        10,
        "the second to have started every RUNNING run",
    )
    second.signal()
    assert await asyncio.to_thread(second.wait, 30) == 0, second.log()
    print(
        f"\nparked {resumed_at - paused_at:.1f} s; after SIGCONT the first exited {status} in "
        f"{took:.1f} s: {errors[0]}"
    )
