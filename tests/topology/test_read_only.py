"""slotcron on a database that turns read-only and back (issue 25): real ``slotcron run``
processes on a harness-made PostgreSQL whose ``default_transaction_read_only`` is switched on for
20 s (what a hot standby or a demoted primary answers: SQLSTATE 25006), then off.

Judged by the HTTP probe and by what the jobs record with the real clock (jobs_topology.py):
``/readyz`` turns 503 naming read-only within seconds, no job starts whose claim would have been
written while read-only, and once writes are taken again the instances are ready and run jobs
within seconds.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from slotcron.engine.burst import LEAD_MAX

from tests.cluster.harness import slot_time
from tests.pgcluster import PgServer, free_port
from tests.topology.conftest import DATABASE
from tests.topology.fleet import (
    Fleet,
    figures,
    get,
    history,
    log_lines,
    metric,
    readyz,
    running,
    until,
)
from tests.topology.jobs_topology import READ_ONLY_JOBS

READ_ONLY_FOR = 20.0
WITHIN = 5.0
"""``/readyz`` follows the database this soon."""
RUN_AGAIN_WITHIN = 8.0
"""Jobs run again this soon once writes are taken: 0.2-0.6 s on a quiet machine, 1.2 s once for
the ``forbid`` job with three CPU burners on two cores, 5.3 s once in a full run with four test
workers on two cores (the log lines around it are shown if it happens again)."""
READ_ONLY = "read-only: the database refuses writes (a standby, or a demoted primary)"
TICK = 0.05
"""Slack for a claim committed just before the read-only setting took effect."""


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    made = Fleet(tmp_path)
    yield made
    made.close()


async def test_a_read_only_database_makes_instances_not_ready_and_start_nothing_until_writable(
    pg_primary: PgServer, fleet: Fleet
) -> None:
    url = pg_primary.url(DATABASE)
    ports = {f"ro-{i}": free_port() for i in range(2)}
    env: dict[str, Any] = {"SCHEDULER_LEASE_SECONDS": 10, "SCHEDULER_HEARTBEAT_SECONDS": 2}
    instances = [
        fleet.start(name, url, "read-only", SCHEDULER_HTTP_PORT=port, **env)
        for name, port in ports.items()
    ]
    await until(lambda: all(running(i) for i in instances), 60, "two instances running")
    await until(
        lambda: {r.job for r in fleet.runs()} >= set(READ_ONLY_JOBS), 20, "both jobs to run"
    )
    for name, port in ports.items():
        status, body = await readyz(port)
        assert status == 200, f"{name} not ready before the test: {body}"

    # Every probe answer from here on, per instance: (time, status, body).
    answers: dict[str, list[tuple[float, int, dict[str, Any]]]] = {n: [] for n in ports}

    async def probe_until(want: int, since: float, timeout: float) -> dict[str, float]:
        """Probe every instance until each answers ``want``; when each first did (s after
        ``since``), or fail naming the last answers."""
        seen: dict[str, float] = {}
        deadline = time.monotonic() + timeout
        while len(seen) < len(ports):
            for name, port in ports.items():
                status, body = await readyz(port)
                answers[name].append((time.time(), status, body))
                named = want == 200 or READ_ONLY in str(body.get("database"))
                if status == want and named and name not in seen:
                    seen[name] = time.time() - since
            if time.monotonic() > deadline:
                last = {n: a[-1][1:] for n, a in answers.items()}
                raise AssertionError(f"/readyz not {want} within {timeout} s: {last}")
            await asyncio.sleep(0.1)
        return seen

    asked = time.time()
    await asyncio.to_thread(pg_primary.set, default_transaction_read_only="on")
    read_only = time.time()
    not_ready = await probe_until(503, read_only, 15)
    read_only_metric = {}
    for name, port in ports.items():
        _, text = await get(port, "/metrics")
        read_only_metric[name] = metric(text, "slotcron_database_read_only")

    # Read-only for READ_ONLY_FOR s; the probe keeps answering 503 meanwhile.
    while time.time() < read_only + READ_ONLY_FOR:
        for name, port in ports.items():
            status, body = await readyz(port)
            answers[name].append((time.time(), status, body))
        await asyncio.sleep(0.5)
    # Delays are counted from the reset's request: from then on a start may be legitimate.
    unlocking = time.time()
    await asyncio.to_thread(pg_primary.reset, "default_transaction_read_only")
    writable = time.time()
    ready = await probe_until(200, unlocking, 15)

    def ran_again() -> dict[str, float] | None:
        after = fleet.starts_after(unlocking)
        firsts = {
            job: min((r.start for r in after if r.job == job), default=0.0)
            for job in READ_ONLY_JOBS
        }
        if all(firsts.values()) and time.time() > writable + 5:
            return {job: at - unlocking for job, at in firsts.items()}
        return None

    again = await until(ran_again, 30, "both jobs to run again")
    codes = await fleet.stop()
    found = fleet.runs()

    problems: list[str] = []
    for name, seconds in not_ready.items():
        if seconds > WITHIN:
            problems.append(f"{name}: /readyz turned 503 {seconds:.2f} s after (<= {WITHIN})")
    for name, seconds in ready.items():
        if seconds > WITHIN:
            problems.append(f"{name}: /readyz turned 200 {seconds:.2f} s after (<= {WITHIN})")
    for job, seconds in again.items():
        if seconds > RUN_AGAIN_WITHIN:
            problems.append(
                f"{job} ran again {seconds:.2f} s after writable (<= {RUN_AGAIN_WITHIN})"
            )
            problems += [
                f"  {instance.name}: {line}"
                for instance in instances
                for at, line in log_lines(instance, "")
                if unlocking - 1 < at < unlocking + seconds + 1
            ]
    # While read-only: the probe never said ready (from its first 503 to the reset).
    flapped = [
        (name, round(at - read_only, 2), status)
        for name, seen in answers.items()
        for at, status, _ in seen
        if read_only + not_ready[name] < at < unlocking and status != 503
    ]
    if flapped:
        problems.append(f"/readyz answered other than 503 while read-only: {flapped[:5]}")
    # No start whose claim came after the database turned read-only (a run claimed before, at
    # most LEAD_MAX ahead of its slot, may start: its claim was written).
    during = [r for r in found if read_only < r.start < unlocking]
    claimed_read_only = [r for r in during if slot_time(r.slot) > read_only + LEAD_MAX + TICK]
    for run in claimed_read_only:
        problems.append(
            f"{run.job} slot {run.slot} started on {run.instance} "
            f"{run.start - read_only:.2f} s into the read-only period"
        )
    # Guarantee 2: every slot of the read-only period is accounted for once writes are taken
    # again, run (claimed before) or recorded with why not.
    rows = await asyncio.to_thread(history, pg_primary)
    unaccounted = [
        (job, float(second))
        for job in READ_ONLY_JOBS
        for second in range(int(read_only) + 1, int(unlocking))
        if not any(r.job == job and slot_time(r.slot) == second for r in found)
        and not any(row.covers(job, second) for row in rows)
    ]
    if unaccounted:
        problems.append(f"slots of the read-only period neither run nor recorded: {unaccounted}")
    statuses = Counter(
        row.status
        for row in rows
        if row.job in READ_ONLY_JOBS and read_only + 1 <= row.slot.timestamp() < unlocking
    )
    if any(code != 0 for code in codes.values()):
        problems.append(f"exit statuses after SIGTERM: {codes}")
    bodies = {
        str(body.get("database")) for seen in answers.values() for _, s, body in seen if s == 503
    }
    warnings = sum(len(log_lines(i, "WARNING")) for i in instances)
    figures(
        "read-only",
        instances=len(instances),
        set_took_s=read_only - asked,
        reset_took_s=writable - unlocking,
        readyz_503_after_s={k: round(v, 2) for k, v in not_ready.items()},
        readyz_200_after_writable_s={k: round(v, 2) for k, v in ready.items()},
        jobs_ran_again_after_s={k: round(v, 2) for k, v in again.items()},
        starts_while_read_only=len(during),
        claimed_while_read_only=len(claimed_read_only),
        read_only_slots_unaccounted=len(unaccounted),
        read_only_slots_recorded=dict(statuses),
        metric_read_only=read_only_metric,
        readyz_503_bodies=sorted(bodies),
        warnings_logged=warnings,
        exits=codes,
    )
    assert not problems, "\n".join(problems[:200])
