"""An instance id is one live process (issue 13, item 2): a second ``slotcron run`` under an id
that a live process heartbeats refuses to start, naming the holder; a process that was killed
(and so never said ``stopped``) is replaced once its heartbeat lapses."""

from __future__ import annotations

import asyncio
import socket
import time
from collections import Counter
from pathlib import Path

from app.store.database import Database
from tests.cluster.harness import execution_rows, read_records, wait_until
from tests.conftest import Spawn

LEASE = 2.0
ENV = dict(
    SCHEDULER_LEASE_SECONDS=LEASE,
    SCHEDULER_HEARTBEAT_SECONDS=0.4,
    SCHEDULER_SHUTDOWN_DRAIN_TIMEOUT=0.5,
    SCHEDULER_SHUTDOWN_CANCEL_TIMEOUT=1,
)


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
