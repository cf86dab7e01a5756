"""How long one claim takes, per backend: sequential (no contention) and 10 claimers at once.

    python bench/claims.py [--backends sqlite,postgresql,mariadb] [--n 300]

Each backend gets a fresh database (PostgreSQL and MariaDB at the URLs the tests use).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slotcron.clock import SystemClock
from slotcron.config import Settings
from slotcron.engine.claims import Claimer
from slotcron.jobs.registry import Registry, cron
from slotcron.lifeline.roles import Collaborators
from slotcron.store import migrate, registrations
from slotcron.store.database import Database
from slotcron.store.registrations import JobRow

from tests import backends


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


async def measure(url: str, n: int) -> tuple[list[float], list[float]]:
    db = Database.connect(Settings(database_url=url).url, 12)
    await migrate.upgrade(db.engine, db.dialect)
    registry = Registry()
    names = [f"job-{i}" for i in range(10)]
    for name in names:
        cron("* * * * *", name=name, registry=registry, overlap="allow")(_noop)
    now = datetime.now(UTC)
    await registrations.register_jobs(
        db,
        [
            JobRow(name=x, kind="cron", schedule="* * * * *", timezone="UTC", options={})
            for x in names
        ],
        now=now,
        instance_id="bench",
        version="bench",
    )
    claimer = Claimer(
        Collaborators(db=db, clock=SystemClock(), instance_id="bench"), default_lease=60
    )
    jobs = {job.name: job for job in registry}
    base = now.replace(microsecond=0) + timedelta(days=1)
    # Warm the pool.
    await asyncio.gather(
        *(
            claimer.claim(jobs[x], base, trigger="cron", following=base, check_gap=False)
            for x in names
        )
    )
    sequential = []
    for i in range(n):
        t0 = time.perf_counter()
        slot = base + timedelta(seconds=i + 1)
        await claimer.claim(jobs["job-0"], slot, trigger="cron", following=slot, check_gap=False)
        sequential.append((time.perf_counter() - t0) * 1000)
    burst = []

    async def timed(job: str, slot: datetime) -> None:
        t0 = time.perf_counter()
        await claimer.claim(jobs[job], slot, trigger="cron", following=slot, check_gap=False)
        burst.append((time.perf_counter() - t0) * 1000)

    for i in range(n // 10):
        slot = base + timedelta(hours=1, seconds=i)
        await asyncio.gather(*(timed(x, slot) for x in names))
    await db.close()
    return sequential, burst


async def _noop() -> None: ...


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backends", default="sqlite,postgresql,mariadb")
    parser.add_argument("--n", type=int, default=300)
    args = parser.parse_args()
    available = backends.probe_all()
    print(
        f"{'backend':<11} {'one claim p50':>14} {'p99':>8}   "
        f"{'10 at once p50':>15} {'p99':>8} {'max':>8}"
    )
    for name in args.backends.split(","):
        if not available.ok.get(name):
            print(f"{name:<11} skipped: {available.why.get(name)}")
            continue
        with tempfile.TemporaryDirectory() as tmp:
            url = backends.create_database(name, Path(tmp))
            try:
                seq, burst = asyncio.run(measure(url, args.n))
            finally:
                backends.drop_database(name, url)
        print(
            f"{name:<11} {statistics.median(seq):>11.2f} ms {pct(seq, 99):>5.2f} ms   "
            f"{statistics.median(burst):>12.2f} ms {pct(burst, 99):>5.2f} ms {max(burst):>5.2f} ms"
        )


if __name__ == "__main__":
    main()
