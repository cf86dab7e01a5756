"""Leadership: three instances; the leader is SIGKILLed, and another takes over within one
lease; then the new leader is stopped gracefully and hands over at once. Sampled throughout
from the database and from each instance's own log, there is never more than one leader.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
import time
from datetime import datetime
from typing import Any

from slotcron.store.database import Database
from slotcron.store.tables import instances
from sqlalchemy import select

from tests.cluster.conftest import Spawn
from tests.cluster.harness import Instance, leader_row

JOBS = "tests.cluster.jobs_light"
LEASE = 2.0
HEARTBEAT = 0.4
PERIOD = max(
    min(HEARTBEAT, LEASE / 4), LEASE / 3
)  # the leader's tick (app/slotcron/service/service.py)
MARGIN = 1.0
ENV: dict[str, Any] = dict(SCHEDULER_LEASE_SECONDS=LEASE, SCHEDULER_HEARTBEAT_SECONDS=HEARTBEAT)
LOG_LINE = re.compile(r"^(\S+) +\w+ +slotcron\.leader: (took|lost|resigned) leadership", re.M)


class Sampler:
    """Samples, every 50 ms, the leadership row and which instances say they lead."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.samples: list[tuple[float, Any, list[str]]] = []
        self._task: asyncio.Task[None] | None = None

    async def _loop(self) -> None:
        while True:
            row = await leader_row(self.db)
            async with self.db.read() as conn:
                flagged = list(
                    (
                        await conn.execute(
                            select(instances.c.instance_id).where(instances.c.is_leader)
                        )
                    ).scalars()
                )
            self.samples.append((time.time(), row, flagged))
            await asyncio.sleep(0.05)

    async def __aenter__(self) -> Sampler:
        self._task = asyncio.create_task(self._loop())
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def until(self, condition: Any, timeout: float, what: str) -> tuple[float, Any]:
        """The first sample from now on whose leadership row satisfies ``condition``."""
        seen = len(self.samples)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for wall, row, _ in self.samples[seen:]:
                if condition(row):
                    return wall, row
            await asyncio.sleep(0.02)
        raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def beliefs(instance: Instance, ended: float) -> list[tuple[float, float]]:
    """When ``instance`` believed it led, by its own log: from "took" to "lost"/"resigned",
    or to ``ended`` (when it was killed or stopped)."""
    spans: list[tuple[float, float]] = []
    start: float | None = None
    for stamp, what in LOG_LINE.findall(instance.full_log()):
        wall = datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
        if what == "took":
            start = wall
        elif start is not None:
            spans.append((start, wall))
            start = None
    if start is not None:
        spans.append((start, ended))
    return spans


async def test_when_the_leader_dies_another_takes_over_within_a_lease_and_one_leads_at_a_time(
    db: Database, spawn: Spawn
) -> None:
    cluster = {name: spawn(name, JOBS, **ENV) for name in ("la", "lb", "lc")}
    ended: dict[str, float] = {}
    async with Sampler(db) as sampler:
        elected, first = await sampler.until(
            lambda row: row.instance_id in cluster, 30, "a leader to be elected"
        )

        # 1. SIGKILL the leader: it cannot resign; its lease must lapse first.
        victim = first.instance_id
        killed_at = time.time()
        cluster[victim].kill()
        ended[victim] = killed_at
        second_seen, second = await sampler.until(
            lambda row: row.instance_id not in (None, victim), LEASE + PERIOD + 5, "a new leader"
        )
        took = second.lease_until.timestamp() - LEASE  # sampled before its first renewal
        assert took - killed_at <= LEASE + PERIOD + MARGIN, f"took over after {took - killed_at}"
        last_lease = max(
            row.lease_until.timestamp()
            for _, row, _ in sampler.samples
            if row.instance_id == victim
        )
        assert took >= last_lease - 0.05, "took over while the dead leader's lease was live"

        # 2. SIGTERM the new leader: it resigns, so the next takes over within a tick.
        heir = second.instance_id
        stopped_at = time.time()
        cluster[heir].signal()
        third_seen, third = await sampler.until(
            lambda row: row.instance_id not in (None, victim, heir), PERIOD + 5, "a third leader"
        )
        handed = third.lease_until.timestamp() - LEASE - stopped_at
        assert handed <= PERIOD + MARGIN, f"a resigning leader was replaced after {handed:.2f} s"
        assert await asyncio.to_thread(cluster[heir].wait, 15) == 0, cluster[heir].log()
        ended[heir] = time.time()
        await asyncio.sleep(1)  # a few more samples of the settled cluster

    for name, instance in cluster.items():
        if instance.alive():
            instance.signal()
            assert await asyncio.to_thread(instance.wait, 15) == 0, instance.log()
            ended[name] = time.time()

    # Exactly one leader in the database at every sample: never two flagged, and a live lease
    # except while a dead leader's lease ran out or a resigning one was being replaced.
    # Each gap ends when the new leader was first seen: its lease is stamped when its transaction
    # begins, and on SQLite that transaction may wait for the database's lock (0.2 s once, six
    # test workers on two cores) while samples still read the old row.
    gaps = [
        (killed_at, max(took, second_seen) + 0.2),
        (stopped_at, max(stopped_at + handed, third_seen) + 0.2),
    ]
    for wall, row, flagged in sampler.samples:
        assert len(flagged) <= 1, f"at {wall}: instances flagged leader: {flagged}"
        live = row.lease_until.timestamp() > wall
        if flagged and live:
            assert flagged == [row.instance_id], (wall, row, flagged)
        if wall > elected and not live:
            assert any(a <= wall <= b for a, b in gaps), f"no leader at {wall}: {row}"
    # ...and by what the instances themselves believed (their logs, one machine's clock).
    spans = sorted(
        (start, end, name) for name, i in cluster.items() for start, end in beliefs(i, ended[name])
    )
    assert len(spans) >= 3, spans
    # A line is logged just after the transaction that took or gave up the lease: 50 ms of
    # slack for that (a real double leadership would overlap by up to a lease).
    for (_, end, name), (start, _, other) in itertools.pairwise(spans):
        assert start >= end - 0.05, f"{name} and {other} both led from {start} to {end}"

    print(
        f"\nleadership: killed leader replaced after {took - killed_at:.2f} s, "
        f"a resigning one after {handed:.2f} s; {len(sampler.samples)} samples"
    )
    # The lease row says since when its holder leads (on MariaDB, SET order once hid it).
    for row in (second, third):
        assert row.since is not None, row
        assert abs(row.since.timestamp() - (row.lease_until.timestamp() - LEASE)) < 0.01, row
