"""A backfill's throughput beside live slots (issue 30): one ``slotcron run`` with 100 jobs every
second and a job with a long history to fill in.

    python -m bench.backfill [--backend postgresql] [--live 100]

Two phases, each judged by what the jobs recorded: at the default rate (10 starts a second) for
20 s, and with ``--rate 0`` (as fast as capacity allows) over 5,000 slots. Each gives the
backfill's slots a second and the live slots' p99 start lag meanwhile (and before it, as the
baseline). Not in ``bench.run``'s default set.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from slotcron.config import Settings  # noqa: E402
from slotcron.store import backfills  # noqa: E402
from slotcron.store.database import Database  # noqa: E402

from bench.run import Slotcron, wait_for  # noqa: E402
from tests import backends  # noqa: E402

JOB = "bench.filled"


async def _backfill(url: str, start: datetime, end: datetime, rate: float) -> int:
    db = Database.connect(Settings(database_url=url).url, 1)
    try:
        made = await backfills.create(
            db, job=JOB, start=start, end=end, rate=rate, now=await db.now()
        )
        return made.id
    finally:
        await db.close()


async def _status(url: str, backfill_id: int) -> str:
    db = Database.connect(Settings(database_url=url).url, 1)
    try:
        return {b.id: b for b in await backfills.listing(db)}[backfill_id].status
    finally:
        await db.close()


async def _cancel(url: str, backfill_id: int) -> None:
    db = Database.connect(Settings(database_url=url).url, 1)
    try:
        await backfills.cancel(db, backfill_id, now=await db.now())
    finally:
        await db.close()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _lags(records: list[tuple[int, float, float]], since: float, until: float) -> str:
    lags = [(start - slot) * 1000 for _, slot, start in records if since <= slot < until]
    if not lags:
        return "n/a"
    return f"p99 {percentile(lags, 0.99):.1f} ms over {len(lags):,} live starts"


def run(backend: str, live: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        url = backends.create_database(backend, workdir)
        system = Slotcron(url, workdir)
        try:
            system.prepare(live, "* * * * * *")
            env = {
                "SCHEDULER_DATABASE_URL": url,
                "SCHEDULER_INSTANCE_ID": "bench-backfill",
                "BENCH_JOBS": str(live),
                "BENCH_CRON": "* * * * * *",
                "BENCH_OUT": str(workdir / "live.starts"),
                "BENCH_FILL_OUT": str(workdir / "fill.starts"),
            }
            argv = [
                sys.executable,
                "-m",
                "slotcron",
                "run",
                "--jobs",
                "bench.jobs",
                "bench.backfill_jobs",
            ]
            proc = system._spawn("bench-backfill", argv, env, ready=False)
            proc.out = workdir / "live.starts"
            wait_for(proc.is_ready, 60, "the instance")
            time.sleep(5)
            now = datetime.now(UTC).replace(microsecond=0)
            history = now - timedelta(days=1)  # the job's past: never ran
            t0 = time.time()
            first = asyncio.run(_backfill(url, history, history + timedelta(seconds=2000), 10))
            time.sleep(20)
            t1 = time.time()
            asyncio.run(_cancel(url, first))
            start = history + timedelta(seconds=3000)
            t2 = time.time()
            second = asyncio.run(_backfill(url, start, start + timedelta(seconds=5000), 0))
            wait_for(lambda: asyncio.run(_status(url, second)) == "COMPLETED", 600, "the backfill")
            t3 = time.time()
            system.stop_all()
            fills = [
                (float(s), trig, float(at))
                for s, trig, at in (
                    line.split() for line in (workdir / "fill.starts").read_text().splitlines()
                )
            ]
            records = system.records()
            default = [f for f in fills if f[1] == "backfill" and t0 + 2 <= f[2] < t1]
            fast = [f for f in fills if f[1] == "backfill" and f[0] >= start.timestamp()]
            print(f"backfill beside {live} live jobs every second ({backend}):")
            print(f"  before it: live {_lags(records, t0 - 5, t0)}")
            print(
                f"  default rate (10/s): {len(default) / (t1 - t0 - 2):.1f} slots/s; "
                f"live {_lags(records, t0, t1)}"
            )
            took = t3 - t2
            print(
                f"  --rate 0: {len(fast):,} slots in {took:.1f} s = {len(fast) / took:,.0f} "
                f"slots/s; live {_lags(records, t2, t3)}"
            )
        finally:
            system.stop_all()
            backends.drop_database(backend, url)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--backend", default="postgresql", choices=["postgresql", "mariadb", "sqlite"]
    )
    parser.add_argument("--live", type=int, default=100)
    args = parser.parse_args()
    run(args.backend, args.live)


if __name__ == "__main__":
    main()
