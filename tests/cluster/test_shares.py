"""Members joining and leaving under load (issue 29): real ``slotcron run`` processes sharing
1,000 jobs due every second by rendezvous hashing, while one is paused (SIGSTOP) for longer
than a lease, one is killed (SIGKILL), one joins and one leaves (SIGTERM). Judged by what the
jobs recorded: no slot ran twice, none was lost, and none started later than one heartbeat
period plus its grace (1 s) because its owner was gone.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.harness import Instance, read_records, slot_time, wait_until
from tests.conftest import Spawn

pytestmark = pytest.mark.load  # a bound on lateness: alone on the machine

JOBS = 1000
HEARTBEAT = 1.0
GRACE = 1.0
ENV = {
    "SHARES_JOBS": JOBS,
    "SCHEDULER_HEARTBEAT_SECONDS": HEARTBEAT,
    "SCHEDULER_LEASE_SECONDS": 4,
    "SCHEDULER_MAX_CONCURRENCY": 5000,
    "SCHEDULER_POOL_SIZE": 4,
}


async def until(condition: Any, timeout: float, what: str) -> Any:
    return await asyncio.to_thread(wait_until, condition, timeout, what)


def sharing(instance: Instance, members: int) -> bool:
    return f"{members} instances share the planning" in instance.full_log()


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
async def test_members_join_leave_die_and_pause_under_load(
    spawn: Spawn, records_path: Path
) -> None:
    a, b, c = (spawn(name, "tests.cluster.jobs_shares", **ENV) for name in ("sh-a", "sh-b", "sh-c"))
    for instance in (a, b, c):
        await until(lambda i=instance: sharing(i, 3), 90, f"{instance.name} to share with 3")
    begun = time.time()
    events: list[tuple[str, float]] = []

    async def hold(seconds: float) -> None:
        await asyncio.sleep(seconds)  # the load runs on meanwhile: what the test watches

    async def mid_second() -> None:
        """Half-way between two slots. A kill or a pause within the few milliseconds after a
        slot, between a burst's start marker and its bodies, leaves runs recorded started
        whose bodies never ran (ABANDONED by design: tests/cluster/test_claim_ahead.py aims
        there); this test is about members coming and going, not that window."""
        await hold((0.5 - time.time()) % 1.0)

    await mid_second()
    c.signal(signal.SIGSTOP)  # longer than a lease (4 s)
    events.append(("pause", time.time()))
    try:
        await hold(6)
    finally:
        c.signal(signal.SIGCONT)
    events.append(("resume", time.time()))
    await hold(3)
    await mid_second()
    b.kill()
    events.append(("kill -9", time.time()))
    await hold(5)
    d = spawn("sh-d", "tests.cluster.jobs_shares", **ENV)
    await until(lambda: d.alive() and sharing(d, 3), 90, "sh-d to join")
    events.append(("join", time.time()))
    await hold(4)
    # Half-way too: a SIGTERM within milliseconds after a slot whose burst this member was
    # still claiming (under this load, late) leaves the chunks it never claimed to the others,
    # which took them over past their grace in 1 of 10 runs aimed there (MISSED, recorded, not
    # run): a known gap, not what this test is about (phase 1 now sends a chunk under way, as
    # tests/integration/test_batch_claims.py checks).
    await mid_second()
    a.signal(signal.SIGTERM)
    events.append(("SIGTERM", time.time()))
    assert await asyncio.to_thread(a.wait, 30) == 0
    await hold(4)
    ended = time.time()
    for instance in (c, d):
        instance.signal(signal.SIGTERM)
    for instance in (c, d):
        assert await asyncio.to_thread(instance.wait, 30) == 0

    starts = [r for r in read_records(records_path) if r["event"] == "start"]
    counts = Counter((r["job"], round(slot_time(r["slot"]))) for r in starts)
    twice = {k: n for k, n in counts.items() if n > 1}
    assert not twice, f"{len(twice)} slots ran twice, e.g. {list(twice.items())[:5]}"
    seconds = range(int(begun) + 2, int(ended) - 1)  # every whole second watched
    lost = [(i, t) for t in seconds for i in range(JOBS) if (f"shares-{i}", t) not in counts]
    assert not lost, f"{len(lost)} slots lost, e.g. {lost[:5]} ({events})"
    late: dict[int, float] = defaultdict(float)
    for r in starts:
        at = slot_time(r["slot"])
        if begun < at < ended:
            late[round(at)] = max(late[round(at)], r["wall"] - at)
    worst = max(late.values())
    print(f"shares: {len(starts)} starts, worst lateness {worst:.3f} s, events {events}")
    assert worst < HEARTBEAT + GRACE, f"a slot started {worst:.2f} s late ({events})"
