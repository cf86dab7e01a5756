"""Runtime schedules fired by real instances (issue 15), on PostgreSQL.

    python -m bench.runtime --only burst       # 100,000 schedules due in the same second
    python -m bench.runtime --only burst --instances 3   # ... over three instances
    python -m bench.runtime --only day         # 1,000,000 schedules spread over the day

burst: N schedules (``--burst``, default 100,000), all due at one second, added with
``add_schedules``; one ``slotcron run`` instance (``--instances``: that many, each slot once
across them) starts, loads them (they are within its horizon) and fires them. Figures: start
lag percentiles (start - slot, by the job's own record with the real clock), doubled (a
schedule's slot started twice), how many had not started :data:`WINDOW` seconds after the
slot, each instance's peak RSS.

day: M schedules (``--day``, default 1,000,000), one cron slot a day each, spread evenly over
the 23 hours that begin an hour from now (so none is due while measuring: what an instance pays
for schedules it is not about to run). Figures: time from process start to "running", RSS,
CPU and statements per minute (pg_stat_statements) over ``--seconds`` of idle.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import text

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from slotcron import Client  # noqa: E402
from slotcron.config import Settings  # noqa: E402
from slotcron.store import migrate  # noqa: E402
from slotcron.store.database import Database  # noqa: E402

from bench import runtime_jobs  # noqa: E402  (registers the task in this process)
from bench.run import Counters, Proc, System, wait_for  # noqa: E402
from tests import backends  # noqa: E402

BATCH = 50_000
WINDOW = 20
"""Seconds after the slot that runs are counted (then the instance is stopped)."""


async def _add(url: str, count: int, slot_of: object, analyze: bool = False) -> float:
    """Migrate, then add ``count`` schedules (``slot_of(i)`` gives each its cron); seconds."""
    db = Database.connect(Settings(database_url=url).url, 1)
    try:
        await migrate.upgrade(db.engine, db.dialect)
    finally:
        await db.close()
    started = time.perf_counter()
    async with Client(url) as client:
        for first in range(0, count, BATCH):
            items = [
                {"task": runtime_jobs.TASK, "cron": slot_of(i), "id": f"s-{i:07d}"}  # type: ignore[operator]
                for i in range(first, min(first + BATCH, count))
            ]
            await client.add_schedules(items)
    took = time.perf_counter() - started
    if analyze:
        db = Database.connect(Settings(database_url=url).url, 1)
        try:
            async with db.engine.connect() as conn:
                await conn.execute(text("ANALYZE"))
        finally:
            await db.close()
    return took


def _cron(at: datetime) -> str:
    return f"{at.second} {at.minute} {at.hour} * * *"


class Instance(System):
    name = "slotcron"

    def start_one(self, name: str) -> Proc:
        env = {
            "SCHEDULER_DATABASE_URL": self.url,
            "SCHEDULER_INSTANCE_ID": name,
            "SCHEDULER_MAX_CONCURRENCY": "100000",
            "BENCH_OUT": str(self.workdir / f"{name}.starts"),
        }
        argv = [sys.executable, "-m", "slotcron", "run", "--jobs", "bench.runtime_jobs"]
        return self._spawn(name, argv, env, ready=False)

    def starts(self) -> list[tuple[str, float, float]]:
        found = []
        for proc in self.procs:
            if proc.out.exists():
                for line in proc.out.read_text().splitlines():
                    job, slot, start = line.split()
                    found.append((job, float(slot), float(start)))
        return found


def percentile(values: list[float], p: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(p / 100 * len(ordered)) - 1))]


def burst(url: str, workdir: Path, count: int, analyze: bool = False, instances: int = 1) -> None:
    # The slot: far enough ahead to add them all and start the instances, within the horizon.
    estimate = 15 + count / 10_000
    slot = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=estimate + 20)
    took = asyncio.run(_add(url, count, lambda _i: _cron(slot), analyze))
    left = (slot - datetime.now(UTC)).total_seconds()
    print(f"  added {count:,} schedules due at {slot:%H:%M:%S} in {took:.1f} s ({left:.0f} s left)")
    system = Instance(url, workdir)
    began = time.monotonic()
    procs = [system.start_one(f"runtime-{i}") for i in range(instances)]
    for proc in procs:
        wait_for(proc.is_ready, 120, "the instances to start")
    print(f"  {instances} instance(s) running after {time.monotonic() - began:.1f} s")
    time.sleep(max(0.0, slot.timestamp() + WINDOW - time.time()))
    rss = [proc.memory_mb("VmHWM") for proc in procs]
    system.stop_all()
    starts = system.starts()
    lags = [(start - at) * 1000 for _, at, start in starts]
    runs = Counter(job for job, _, _ in starts)
    doubled = sum(1 for n in runs.values() if n > 1)
    late = count - len(runs)
    if late:  # what the instances said about it
        for proc in procs:
            lines = proc.log.read_text(errors="replace").splitlines()
            said = [line for line in lines if "WARNING" in line or "ERROR" in line]
            print("\n".join(f"  | {proc.name}: {line[:300]}" for line in said[-15:]))
    per = ", ".join(
        f"{sum(1 for _ in p.out.read_text().splitlines()) if p.out.exists() else 0:,}"
        for p in procs
    )
    print(
        f"  {len(starts):,} runs ({per} by instance): lag p50 {percentile(lags, 50):.0f} ms, "
        f"p99 {percentile(lags, 99):.0f} ms, max {max(lags, default=math.nan):.0f} ms; "
        f"min {min(lags, default=math.nan):.0f} ms; doubled {doubled}, not started within "
        f"{WINDOW} s of the slot {late:,}; "
        f"peak RSS {'/'.join(f'{r:.0f}' for r in rss)} MB"
    )


async def _activity(url: str) -> tuple[float, float]:
    """Transactions of the database so far (``pg_stat_database``: an autocommit statement is
    one, a BEGIN ... COMMIT another; autovacuum's count too), and table and index scans of its
    tables (``pg_stat_user_tables``: about one per statement a scheduler sends). What counts
    where ``pg_stat_statements`` is not loaded."""
    db = Database.connect(Settings(database_url=url).url, 1)
    try:
        async with db.engine.connect() as conn:
            xacts = await conn.scalar(
                text(
                    "SELECT xact_commit + xact_rollback FROM pg_stat_database "
                    "WHERE datname = current_database()"
                )
            )
            scans = await conn.scalar(
                text(
                    "SELECT coalesce(sum(coalesce(seq_scan, 0) + coalesce(idx_scan, 0)), 0) "
                    "FROM pg_stat_user_tables"
                )
            )
    finally:
        await db.close()
    return float(xacts), float(scans)


def _per_minute(url: str, measure: object, seconds: float) -> tuple[float, float]:
    """Transactions and scans a minute while ``measure()`` sleeps ``seconds``."""
    x0, s0 = asyncio.run(_activity(url))
    began = time.monotonic()
    measure()  # type: ignore[operator]
    elapsed = time.monotonic() - began
    x1, s1 = asyncio.run(_activity(url))
    return (x1 - x0) / elapsed * 60, (s1 - s0) / elapsed * 60


def day(url: str, workdir: Path, count: int, seconds: int) -> None:
    first = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=1)
    # Daily slots over the 23 hours from an hour ahead: no time of day in the coming hour.
    step = 23 * 3600 / count
    took = asyncio.run(_add(url, count, lambda i: _cron(first + timedelta(seconds=i * step))))
    print(f"  added {count:,} schedules over the day in {took:.1f} s ({count / took:,.0f}/s)")
    counters = Counters("postgresql", url)
    time.sleep(10)
    quiet = _per_minute(url, lambda: time.sleep(seconds), seconds)
    print(
        f"  no instance, {seconds} s: {quiet[0]:.1f} transactions/min, {quiet[1]:.1f} scans/min "
        "(the database's own background: autovacuum after the adds)"
    )
    system = Instance(url, workdir)
    began = time.monotonic()
    proc = system.start_one("runtime-0")
    wait_for(proc.is_ready, 300, "the instance to start")
    ready = time.monotonic() - began
    # PostgreSQL counts a backend's transactions and scans when it sends them, up to 10 s
    # after the backend went idle: the start-up's would otherwise be counted as idle ones.
    time.sleep(15)
    # Statements are read from another database (pg_stat_statements, through ``postgres``),
    # inside the window of the transactions count, whose reads (of this database) stay out of
    # the statements' window.
    window: dict[str, float] = {}

    def measure() -> None:
        statements, cpu, t0 = counters.read(), proc.cpu_seconds(), time.monotonic()
        time.sleep(seconds)
        window["statements"] = counters.read() - statements
        window["cpu"] = proc.cpu_seconds() - cpu
        window["elapsed"] = time.monotonic() - t0

    xacts_per_min, scans_per_min = _per_minute(url, measure, seconds)
    elapsed = window["elapsed"]
    cpu_pct = window["cpu"] / elapsed * 100
    per_min = window["statements"] / elapsed * 60
    statements = counters.figure(per_min, "statements/min")
    if not math.isnan(per_min):
        statements += f" ({counters.how})"
    rss, peak = proc.memory_mb("VmRSS"), proc.memory_mb("VmHWM")
    system.stop_all()
    print(
        f"  ready in {ready:.1f} s; RSS {rss:.0f} MB (peak {peak:.0f}); idle CPU {cpu_pct:.2f} % "
        f"of a core; {statements}, "
        f"{xacts_per_min:.1f} transactions/min (pg_stat_database), {scans_per_min:.1f} "
        f"scans/min (pg_stat_user_tables) over {elapsed:.0f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default="burst,day")
    parser.add_argument("--burst", type=int, default=100_000)
    parser.add_argument("--day", type=int, default=1_000_000)
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument(
        "--instances", type=int, default=1, help="burst: how many instances share the burst"
    )
    parser.add_argument(
        "--analyze",
        action="store_true",
        help="burst: ANALYZE after the adds, as autovacuum does within a minute or so (the "
        "planner then knows the schedules, as it would of schedules added long before their "
        "slot), instead of the statistics of a fresh database",
    )
    args = parser.parse_args()
    available = backends.probe_all()
    if not available.ok.get("postgresql"):
        sys.exit(f"postgresql is not reachable: {available.why.get('postgresql')}")
    for what in args.only.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            url = backends.create_database("postgresql", Path(tmp))
            try:
                if what == "burst":
                    print(
                        f"burst: {args.burst:,} schedules due in the same second, "
                        f"{args.instances} instance(s)"
                    )
                    burst(url, Path(tmp), args.burst, args.analyze, args.instances)
                elif what == "day":
                    print(f"day: {args.day:,} schedules spread over the day, one instance")
                    day(url, Path(tmp), args.day, args.seconds)
                else:
                    sys.exit(f"unknown workload {what!r}: burst or day")
            finally:
                backends.drop_database("postgresql", url)


if __name__ == "__main__":
    main()
