"""Start lag of N jobs due in the same second, one in-process instance, per backend.

    python bench/burst.py [--jobs 10] [--rounds 5] [--backends sqlite,postgresql,mariadb]

Each job records the wall time it started; lag = start - slot. Every round is a fresh slot.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slotcron import JobContext
from slotcron.config import Settings
from slotcron.jobs.registry import Registry, cron
from slotcron.service.service import Service, tune_gc

from tests import backends


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


async def measure(url: str, n_jobs: int, rounds: int) -> tuple[list[float], int]:
    registry = Registry()
    lags: list[float] = []
    seen: set[tuple[str, float]] = set()
    doubled = 0

    def make(i: int) -> None:
        @cron("*/2 * * * * *", name=f"burst-{i}", registry=registry)
        async def job(ctx: JobContext) -> None:
            nonlocal doubled
            started = time.time()
            key = (ctx.job, ctx.scheduled_at.timestamp())
            doubled += key in seen
            seen.add(key)
            lags.append(started - ctx.scheduled_at.timestamp())
            await asyncio.sleep(1)

    for i in range(n_jobs):
        make(i)
    settings = Settings(database_url=url, auto_migrate=True, max_concurrency=max(n_jobs, 10))
    service = Service(settings, list(registry))
    await service.start()
    tune_gc()  # as `slotcron run` does
    while len(lags) < n_jobs * (rounds + 1):  # noqa: ASYNC110 - a benchmark's plain poll
        await asyncio.sleep(0.05)
    await service.stop()
    return sorted(lags), doubled


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backends", default="sqlite,postgresql,mariadb")
    parser.add_argument("--jobs", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    available = backends.probe_all()
    print(f"{args.jobs} jobs due together, {args.rounds + 1} rounds, lag = start - slot")
    print(f"{'backend':<11} {'p50':>9} {'p99':>9} {'max':>9} {'runs':>6} {'doubled':>8}")
    for name in args.backends.split(","):
        if not available.ok.get(name):
            print(f"{name:<11} skipped: {available.why.get(name)}")
            continue
        with tempfile.TemporaryDirectory() as tmp:
            url = backends.create_database(name, Path(tmp))
            try:
                lags, doubled = asyncio.run(measure(url, args.jobs, args.rounds))
            finally:
                backends.drop_database(name, url)
        ms = [x * 1000 for x in lags]
        print(
            f"{name:<11} {statistics.median(ms):>6.1f} ms {pct(ms, 99):>6.1f} ms "
            f"{max(ms):>6.1f} ms {len(ms):>6} {doubled:>8}"
        )


if __name__ == "__main__":
    main()
