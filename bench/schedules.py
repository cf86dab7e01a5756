"""Creating runtime schedules through ``slotcron.Client`` (issue 15): one by one, and batched.

    python -m bench.schedules [--backend postgresql] [--one 1000] [--batch 100000]
    python -m bench.run --only schedules

Each figure is schedules stored per second, on a fresh database, wall time around the client's
calls (each call commits). Targets: >= 1,000/s one by one, >= 20,000/s with ``add_schedules``.
The batch is one call, one transaction: all or none.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from slotcron import Client, JobContext  # noqa: E402
from slotcron.config import Settings  # noqa: E402
from slotcron.jobs.registry import Registry, task  # noqa: E402
from slotcron.store import migrate  # noqa: E402
from slotcron.store import schedules as store  # noqa: E402
from slotcron.store.database import Database  # noqa: E402

from tests import backends  # noqa: E402

TASK = "bench.send_report"
ZONES = ("UTC", "Europe/Paris", "Asia/Seoul", "America/New_York", "Australia/Sydney")


@dataclass(frozen=True)
class Rates:
    one_by_one: float
    batched: float
    one_count: int
    batch_count: int
    one_cpu: float
    """CPU seconds the client's process spent on the one-by-one adds (the rest is waiting)."""
    batch_cpu: float


async def _prepare(url: str) -> None:
    db = Database.connect(Settings(database_url=url).url, 1)
    try:
        await migrate.upgrade(db.engine, db.dialect)
        registry = Registry()

        @task(name=TASK, registry=registry)
        async def send_report(ctx: JobContext) -> None:
            pass

        now = datetime.now(UTC)
        await store.register_tasks(db, registry.tasks(), now=now, instance_id="bench", version="0")
    finally:
        await db.close()


async def _measure(url: str, one: int, batch: int) -> Rates:
    await _prepare(url)
    async with Client(url) as client:
        started, cpu = time.perf_counter(), time.process_time()
        for i in range(one):
            await client.add_schedule(
                TASK, cron="0 9 * * *", timezone=ZONES[i % len(ZONES)], params={"tenant": i}
            )
        one_rate = one / (time.perf_counter() - started)
        one_cpu = time.process_time() - cpu
        items = [
            {
                "task": TASK,
                "cron": "0 9 * * *",
                "timezone": ZONES[i % len(ZONES)],
                "params": {"tenant_id": i},
                "id": f"tenant-{i:07d}",
            }
            for i in range(batch)
        ]
        started, cpu = time.perf_counter(), time.process_time()
        added = await client.add_schedules(items)
        batch_rate = batch / (time.perf_counter() - started)
        batch_cpu = time.process_time() - cpu
        assert len(added) == batch
    return Rates(one_rate, batch_rate, one, batch, one_cpu, batch_cpu)


def measure(backend: str, one: int = 1000, batch: int = 100_000) -> Rates:
    """The two rates on a fresh database of ``backend`` (dropped afterwards)."""
    with tempfile.TemporaryDirectory() as tmp:
        url = backends.create_database(backend, Path(tmp))
        try:
            return asyncio.run(_measure(url, one, batch))
        finally:
            backends.drop_database(backend, url)


def report(rates: Rates) -> str:
    return (
        f"  {rates.one_count:,} one by one: {rates.one_by_one:,.0f}/s (target >= 1,000/s; "
        f"client CPU {rates.one_cpu:.2f} s)\n"
        f"  {rates.batch_count:,} in one add_schedules: {rates.batched:,.0f}/s "
        f"(target >= 20,000/s; client CPU {rates.batch_cpu:.2f} s)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--backend", default="postgresql", choices=["postgresql", "mariadb", "sqlite"]
    )
    parser.add_argument("--one", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=100_000)
    args = parser.parse_args()
    available = backends.probe_all()
    if not available.ok.get(args.backend):
        sys.exit(f"{args.backend} is not reachable: {available.why.get(args.backend)}")
    print(f"schedules through slotcron.Client on {args.backend}:")
    print(report(measure(args.backend, args.one, args.batch)))


if __name__ == "__main__":
    main()
