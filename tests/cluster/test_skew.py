"""Clock skew: one instance 5 s ahead and one 5 s behind (libfaketime, Debian package faketime).
Both fire by the database's clock: no slot runs twice, none runs before its time, all on time.

When each run really started is read off a file it creates (see jobs_skew.py): the kernel
stamps the file from the real clock, which the skewed processes cannot fake; the database
runs on this machine, so the real clock is the database's (SQLite's clock is its storage's: the
kernel's file times, see app/slotcron/store/dialects.py).
"""

from __future__ import annotations

import asyncio
import glob
import math
import os
import re
import shutil
import time
from collections import Counter
from pathlib import Path

import pytest
from slotcron.store.database import Database

from tests.cluster.conftest import Spawn
from tests.cluster.harness import (
    Instance,
    execution_rows,
    percentile,
    read_records,
    slot_time,
    wait_until,
)

JOBS = "tests.cluster.jobs_skew"
N_JOBS = 5
SKEW = {"ahead": 5.0, "behind": -5.0}
# The kernel stamps files from its coarse clock, up to one tick (at most 10 ms) behind the
# real time: a stamp this much before the slot may still be a run that started on time.
TICK = 0.012
CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def libfaketime() -> str:
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketimeMT.so.1")) + sorted(
        glob.glob("/usr/lib/faketime/libfaketimeMT.so.1")
    )
    if not found or not shutil.which("faketime"):
        if CI:
            pytest.fail("libfaketime is not installed (Debian package faketime)")
        pytest.skip("libfaketime is not installed (apt-get install faketime)")
    return found[0]


def offset_logged(instance: Instance) -> str:
    match = re.search(r"clock offset to the database: ([+-][\d.]+) ms", instance.full_log())
    return match.group(1) if match else "not logged"


async def test_instances_with_skewed_clocks_fire_on_time_by_the_database_clock(
    db: Database, spawn: Spawn, records_path: Path
) -> None:
    lib = libfaketime()
    marks = records_path.parent / "marks"
    marks.mkdir()
    instances = {
        name: spawn(
            name,
            JOBS,
            # The environment rather than the faketime wrapper: the wrapper forks, so our
            # signals would reach it and not the instance.
            LD_PRELOAD=lib,
            FAKETIME=f"{skew:+g}",
            # The monotonic clock is shifted too (FAKETIME_DONT_FAKE_MONOTONIC unset): a constant
            # shift that timers do not notice. Told not to fake it, libfaketime 0.9.10 mangles
            # waits on it: time.sleep() fails with EINVAL and the GIL's timed waits return at
            # once, so a process with threads (aiosqlite) thrashes and fires seconds late even
            # at FAKETIME=+0.
            SLOTCRON_TEST_MARKS=marks,
            SCHEDULER_LEASE_SECONDS=3,
            SCHEDULER_HEARTBEAT_SECONDS=0.5,
        )
        for name, skew in SKEW.items()
    }

    def enough() -> bool:
        starts = [r for r in read_records(records_path) if r["event"] == "start"]
        by = Counter(r["instance"] for r in starts)
        return len({r["slot"] for r in starts}) >= 8 and all(by[n] for n in SKEW)

    try:
        await asyncio.to_thread(wait_until, enough, 40, "8 slots run, by both instances")
    finally:
        stopped_at = time.time()
        for instance in instances.values():
            instance.signal()
        for instance in instances.values():
            assert await asyncio.to_thread(instance.wait, 20) == 0, instance.log()

    starts = [r for r in read_records(records_path) if r["event"] == "start"]
    offsets = {n: offset_logged(i) for n, i in instances.items()}
    # The skew is real: each process's own clock is off by its skew.
    for r in starts:
        real = (marks / r["mark"]).stat().st_mtime
        assert abs(r["wall"] - real - SKEW[r["instance"]]) < 0.5, (r, real)

    runs = Counter((r["job"], r["slot"]) for r in starts)
    assert {k: n for k, n in runs.items() if n > 1} == {}, "slots run twice"
    lateness: dict[str, list[float]] = {n: [] for n in SKEW}
    for r in starts:
        real = (marks / r["mark"]).stat().st_mtime
        late = real - slot_time(r["slot"])
        lateness[r["instance"]].append(late)
        assert late >= -TICK, (
            f"{r['instance']} ran {r['job']} slot {r['slot']} {-late:.3f} s before its time "
            f"(offsets measured: {offsets})"
        )
        assert late < 1.0, f"{r['instance']} ran {r['job']} slot {r['slot']} {late:.3f} s late"
    by_instance = Counter(r["instance"] for r in starts)
    assert all(by_instance[n] > 0 for n in SKEW), by_instance

    # No slot lost from the first one run to the stop.
    rows = await execution_rows(db)
    done = {(r.job_name, r.scheduled_at.timestamp()) for r in rows if r.status == "COMPLETED"}
    first = min(slot_time(r["slot"]) for r in starts)
    for second in range(int(first), math.floor(stopped_at)):
        for i in range(N_JOBS):
            assert (f"skew-{i}", float(second)) in done, f"skew-{i} slot {second} not run"
    print(
        f"\nskew: offsets logged {offsets}; runs {dict(by_instance)}; real lateness p50/max "
        + ", ".join(
            f"{n} {percentile(v, 0.5) * 1000:.0f}/{max(v) * 1000:.0f} ms"
            for n, v in lateness.items()
        )
    )
