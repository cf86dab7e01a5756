"""APScheduler 4 side of the side-by-side benchmark: one scheduler process per invocation.

    python -m bench.aps --url URL --role {seed,run} --jobs N --cron "EXPR" [--seconds-first]
        [--out FILE] [--ready FILE] [--max-concurrent-jobs K] [--misfire-grace-time S]

This is our driver code around APScheduler 4.0.0a6 (``pip install
'apscheduler[sqlalchemy,asyncpg]==4.0.0a6' 'anyio<4.14'``): it only calls APScheduler's public
API and contains none of its code. anyio 4.14 and later break APScheduler 4.0.0a6's asyncpg
event broker (every NOTIFY it receives raises ``NoEventLoopError`` and is dropped, so the
schedulers never wake up for new jobs), hence the pin. Run it from the repository root
(``-m bench.aps``): the persisted schedules name their job function ``bench.aps:job``. The
event loop is uvloop when installed, as in slotcron's own CLI.

``--url`` is an SQLAlchemy async URL shared by every process of one workload:
``postgresql+asyncpg://...`` or ``mysql+aiomysql://...``. Use a database of its own: the tables
have generic names. MariaDB does not work with APScheduler 4.0.0a6: its SQLAlchemy data store
acquires schedules with ``WITH ... UPDATE``, which MariaDB rejects (error 1064), so ``run``
crashes there (exit 1); and with PyMySQL 1.2 aiomysql cannot even bind the pickled triggers
that ``seed`` writes.

``--role seed`` creates APScheduler's tables if needed (``metadata``, ``tasks``, ``schedules``,
``jobs``, ``job_results``) and adds the schedules ``job-0`` ... ``job-{N-1}``, all with the same
cron trigger (UTC) and the job function ``bench.aps:job``, then exits 0. An existing schedule of
the same id is replaced.

``--role run`` starts one ``AsyncScheduler`` (scheduler and worker) on that data store, touches
``--ready`` once it has started, and runs until SIGTERM or SIGINT; it then stops the scheduler,
writes one line per job run to ``--out`` and exits 0. A line is
``<job index> <slot unix seconds> <start unix seconds>``. ``--max-concurrent-jobs`` is the
scheduler's ``max_concurrent_jobs`` (APScheduler's default: 100).

The event broker follows the backend: ``AsyncpgEventBroker`` (LISTEN/NOTIFY) for PostgreSQL;
APScheduler 4 has no MySQL/MariaDB broker, so MySQL/MariaDB gets the process-local
``LocalEventBroker``: a process then hears of no other process's schedules or jobs, only of the
jobs its own schedule loop creates.

``--cron`` has 5 fields (minute hour day month weekday) or, with ``--seconds-first``, 6 fields
with the seconds first (``second minute hour day month weekday``, as in Quartz/Spring). A
numeric weekday is cron's (0 or 7 = Sunday), which APScheduler converts itself; Quartz's ``?``
is read as ``*``. When both day and weekday are restricted, APScheduler wants both to match
(cron: either).

Misfires: each schedule uses ``coalesce=CoalescePolicy.all`` (every due slot becomes its own
job, however late the schedule is processed) and a ``misfire_grace_time`` (a job still waiting
that long after its slot is dropped as missed). The grace is ``--misfire-grace-time`` seconds,
by default the cron period clamped to [5 s, 60 s]: never stricter than slotcron's own grace
(the period clamped to [1 s, 60 s]). The task is configured with ``max_running_jobs=None``:
APScheduler's default of 1 would let only one of the N schedules (which share one task) run at
a time across the whole cluster. Seed a fresh database just before starting the runners: with
``all``, every slot due since the seed (or since an earlier run stopped) becomes a job at start-up,
one INSERT each, before any newer slot is looked at.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import logging
import signal
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from apscheduler import AsyncScheduler, CoalescePolicy, ConflictPolicy, current_job
from apscheduler.abc import EventBroker
from apscheduler.datastores.sqlalchemy import SQLAlchemyDataStore
from apscheduler.eventbrokers.asyncpg import AsyncpgEventBroker
from apscheduler.eventbrokers.local import LocalEventBroker
from apscheduler.triggers.cron import CronTrigger
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

SEED_CONCURRENCY = 10
"""add_schedule calls in flight while seeding (SQLAlchemy's default pool holds 5 + 10)."""

_records: list[tuple[str | None, datetime | None, float]] = []
_out: Path | None = None
_flushed = False


async def job() -> None:
    """The benchmarked job: note which schedule and slot this run is, and when it started."""
    started = time.time()
    info = current_job.get()
    _records.append((info.schedule_id, info.scheduled_fire_time, started))


def flush() -> None:
    """Write the recorded runs to ``--out``, once (at the end of ``run``, or at exit)."""
    global _flushed
    if _flushed or _out is None:
        return
    _flushed = True
    lines = []
    for schedule_id, slot, started in _records:
        index = (schedule_id or "-1").rpartition("-")[2]
        lines.append(f"{index} {slot.timestamp() if slot else float('nan'):.6f} {started:.6f}\n")
    _out.write_text("".join(lines))


def next_whole_second() -> datetime:
    return datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=1)


def make_trigger(expr: str, seconds_first: bool, start: datetime | None = None) -> CronTrigger:
    """Map a 5-field cron or a 6-field seconds-first cron expression onto a UTC CronTrigger.

    ``start`` defaults to the next whole second: CronTrigger keeps the microseconds of its start
    time when that time already matches, so ``* * * * * *`` started at 12.345 would fire at
    13.345, 14.345, ... rather than on whole seconds.
    """
    if start is None:
        start = next_whole_second()
    fields = ["*" if f == "?" else f for f in expr.split()]
    if not seconds_first:
        fields.insert(0, "0")
    if len(fields) != 6:
        wanted = "6 (with --seconds-first)" if seconds_first else "5"
        raise SystemExit(f"--cron {expr!r}: expected {wanted} fields")
    second, minute, hour, day, month, day_of_week = fields
    return CronTrigger(
        second=second,
        minute=minute,
        hour=hour,
        day=day,
        month=month,
        day_of_week=day_of_week,
        start_time=start,
        timezone=UTC,
    )


def default_grace(expr: str, seconds_first: bool) -> float:
    """The cron period (first gap from now) clamped to [5, 60] seconds."""
    trigger = make_trigger(expr, seconds_first)
    first, second = trigger.next(), trigger.next()
    if first is None or second is None:
        return 60.0
    gap: float = (second - first).total_seconds()
    return min(max(gap, 5.0), 60.0)


def make_event_broker(engine: AsyncEngine) -> EventBroker:
    if engine.dialect.name == "postgresql":
        return AsyncpgEventBroker.from_async_sqla_engine(engine)
    return LocalEventBroker()


async def seed(scheduler: AsyncScheduler, args: argparse.Namespace) -> None:
    grace = args.misfire_grace_time
    if grace is None:
        grace = default_grace(args.cron, args.seconds_first)
    task = await scheduler.configure_task(job, max_running_jobs=None, misfire_grace_time=grace)
    start = next_whole_second()
    gate = asyncio.Semaphore(SEED_CONCURRENCY)

    async def add(i: int) -> None:
        async with gate:
            await scheduler.add_schedule(
                task.id,
                make_trigger(args.cron, args.seconds_first, start),
                id=f"job-{i}",
                coalesce=CoalescePolicy.all,
                misfire_grace_time=grace,
                conflict_policy=ConflictPolicy.replace,
            )

    await asyncio.gather(*(add(i) for i in range(args.jobs)))


async def run(scheduler: AsyncScheduler, ready: Path) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await scheduler.start_in_background()
    await asyncio.to_thread(ready.touch)
    await stop.wait()
    await scheduler.stop()
    await scheduler.wait_until_stopped()


async def amain(args: argparse.Namespace) -> None:
    engine = create_async_engine(args.url)
    try:
        scheduler = AsyncScheduler(
            SQLAlchemyDataStore(engine),
            make_event_broker(engine),
            max_concurrent_jobs=args.max_concurrent_jobs,
        )
        async with scheduler:
            if args.role == "seed":
                await seed(scheduler, args)
            else:
                await run(scheduler, args.ready)
    finally:
        await engine.dispose()


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop when installed, as slotcron's own CLI uses it; else asyncio's default loop."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def main(argv: list[str] | None = None) -> int:
    global _out
    parser = argparse.ArgumentParser(prog="python -m bench.aps", description=__doc__.split("\n")[0])
    parser.add_argument("--url", required=True, help="SQLAlchemy async database URL")
    parser.add_argument("--role", required=True, choices=("seed", "run"))
    parser.add_argument("--jobs", type=int, required=True, help="number of schedules (seed)")
    parser.add_argument("--cron", required=True, help="cron expression of every schedule")
    parser.add_argument("--seconds-first", action="store_true", help="6 fields, seconds first")
    parser.add_argument("--out", type=Path, help="records file (run)")
    parser.add_argument("--ready", type=Path, help="file touched once started (run)")
    parser.add_argument("--max-concurrent-jobs", type=int, default=100)
    parser.add_argument(
        "--misfire-grace-time",
        type=float,
        default=None,
        help="seconds a job may start late (seed; default: the cron period within [5, 60])",
    )
    args = parser.parse_args(argv)
    make_trigger(args.cron, args.seconds_first)  # reject a bad expression before connecting
    if args.role == "run" and (args.out is None or args.ready is None):
        parser.error("--role run needs --out and --ready")

    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
    if args.role == "run":
        _out = args.out
        atexit.register(flush)
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        runner.run(amain(args))
    flush()
    return 0


if __name__ == "__main__":
    # Run as bench.aps, not __main__, so that the job function is the one the persisted
    # schedules name (bench.aps:job) and its records land in this module's list.
    from bench import aps

    sys.exit(aps.main())
