"""APScheduler 4 on issue 15's runtime-schedule workloads (PostgreSQL), beside bench/runtime.py.

    python -m bench.aps_runtime --only add      # (c) 1,000 one by one, then 100,000 concurrently
    python -m bench.aps_runtime --only burst    # (b) 100,000 schedules due in the same second
    python -m bench.aps_runtime --only day      # (a) 1,000,000 schedules spread over the day
    python -m bench.aps_runtime --only add,burst,day --burst 10000,100000 --day 1000000

Our driver code around APScheduler 4.0.0a6 (``pip install 'apscheduler[sqlalchemy,asyncpg]==4.0.0a6'
'anyio<4.14'``, see bench/aps.py for why the pin): it calls only APScheduler's public API
(``AsyncScheduler``, ``configure_task``, ``add_schedule``, ``CronTrigger``,
``SQLAlchemyDataStore``, ``AsyncpgEventBroker``) and contains none of its code. Run it from the
repository root: the persisted task names its function ``bench.aps_runtime_jobs:record``.

Every workload gets a PostgreSQL database of its own (created and dropped here, like the tests'
``tests/backends.py``: user postgres, trust, 127.0.0.1:5432). Schedules are added from this
process through an ``AsyncScheduler`` that is entered but never started (a client), with the
asyncpg event broker, as a client that wants running schedulers to hear of new schedules would;
each ``add_schedule`` is then one transaction plus one NOTIFY. APScheduler 4 has no batch add:
"batch" here is ``--concurrency`` ``add_schedule`` calls in flight at once (asyncio tasks sharing
one engine whose pool holds that many connections), the fastest way its public API allows that we
found; ``--concurrency 1`` is one by one. The scheduler measured is a separate process
(``--role run``, started in a process group of its own and killed as a group at the end) running
one ``AsyncScheduler`` (scheduler and worker roles) with ``max_concurrent_jobs`` = the number of
schedules.

add (c): on a fresh database, ``--one`` add_schedule calls one after another (each awaited before
the next), then ``--batch`` calls with ``--concurrency`` in flight. Figure: schedules per second,
wall time around the calls.

burst (b): for each N in ``--burst``, N schedules with the same daily cron at one UTC second
(``S M H * * *``, like bench/runtime.py), far enough ahead to add them all (the add rate is
measured first on 1,000 throw-away schedules, removed again) and start the scheduler; the
scheduler process starts before that second. The task has ``max_running_jobs=None`` and
schedules and task ``misfire_grace_time=None`` (no job dropped for lateness: we measure how late
they start). The scheduler is stopped ``--window`` seconds after the slot. Figures, from the
jobs' own records (schedule id, scheduled fire time, real start time): start lag p50/p99/max,
doubled (a schedule's slot started more than once), not started within 20 s of the slot
(bench/runtime.py's window) and within ``--window``; the scheduler's peak RSS.

day (a): N (``--day``) schedules, one daily slot each, spread evenly over the 23 hours that begin
an hour from now (6-field: distinct seconds, minutes and hours), so none is due while measuring.
Adding is projected from the first 10,000: when the whole N would take longer than
``--max-setup`` seconds, the projection (that is the figure for N) is printed and the workload
continues with ``--fallback`` schedules instead. Then the database settles (VACUUM ANALYZE of the
schedules table, then ``--seconds`` with no scheduler for its background rate), a fresh scheduler
process starts, and: ready = from spawn until ``start_in_background()`` returned (started), and
quiet = until its CPU use first stays under 5 % for 2 s (idle); RSS (VmRSS and peak VmHWM) after
``--seconds`` idle, its CPU over those seconds (% of one core), and the database's transactions
per minute over them: ``pg_stat_database`` ``xact_commit + xact_rollback`` deltas for that
database (every autocommit statement is a transaction, so is each BEGIN ... COMMIT), its
statements a minute (``pg_stat_statements`` calls, BEGIN and COMMIT included; nan where it is
not in ``shared_preload_libraries``), plus
table and index scans a minute (``pg_stat_user_tables``). The background rate measured before
the scheduler started is printed beside them.

Caveats: the machine has 2 cores shared with other work (the load average is printed before
each workload); this process (the adder, then the observer) and PostgreSQL share them with the
scheduler. ``CronTrigger`` keeps its start time's microseconds when that time already matches
the cron, so triggers start at a whole second.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
from apscheduler import AsyncScheduler
from apscheduler.datastores.sqlalchemy import SQLAlchemyDataStore
from apscheduler.eventbrokers.asyncpg import AsyncpgEventBroker
from apscheduler.triggers.cron import CronTrigger
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import aps, aps_runtime_jobs  # noqa: E402
from bench.run import Counters  # noqa: E402
from tests import backends  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")
SLOTCRON_WINDOW = 20
"""bench/runtime.py counts runs not started this many seconds after the slot."""
Slot = Callable[[int], datetime]


# ---------------------------------------------------------------- the client side


def daily(at: datetime, start: datetime) -> CronTrigger:
    """A UTC cron trigger firing every day at ``at``'s time of day (second precision)."""
    return CronTrigger(
        second=at.second, minute=at.minute, hour=at.hour, timezone=UTC, start_time=start
    )


@dataclass
class Adder:
    """An entered, never started AsyncScheduler on the workload's database: a client."""

    url: str
    concurrency: int
    engine: object = None
    scheduler: AsyncScheduler | None = None
    task_id: str = ""

    async def __aenter__(self) -> Adder:
        engine = create_async_engine(self.url, pool_size=max(5, self.concurrency + 2))
        self.engine = engine
        self.scheduler = AsyncScheduler(
            SQLAlchemyDataStore(engine), AsyncpgEventBroker.from_async_sqla_engine(engine)
        )
        await self.scheduler.__aenter__()
        task = await self.scheduler.configure_task(
            aps_runtime_jobs.record, max_running_jobs=None, misfire_grace_time=None
        )
        self.task_id = task.id
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.scheduler is not None
        await self.scheduler.__aexit__(None, None, None)
        await self.engine.dispose()  # type: ignore[attr-defined]

    async def add(self, ids: Iterator[int], slot_of: Slot, concurrency: int) -> int:
        """add_schedule for every index ``ids`` yields, ``concurrency`` calls in flight."""
        assert self.scheduler is not None
        scheduler, start = self.scheduler, datetime.now(UTC).replace(microsecond=0)
        added = 0

        async def worker() -> None:
            nonlocal added
            for i in ids:  # one shared iterator: each index goes to one worker
                await scheduler.add_schedule(
                    self.task_id,
                    daily(slot_of(i), start),
                    id=f"s-{i:07d}",
                    misfire_grace_time=None,
                )
                added += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return added

    async def timed(self, first: int, count: int, slot_of: Slot, concurrency: int) -> float:
        began = time.perf_counter()
        await self.add(iter(range(first, first + count)), slot_of, concurrency)
        return time.perf_counter() - began

    async def remove(self, first: int, count: int) -> None:
        assert self.scheduler is not None
        for i in range(first, first + count):
            await self.scheduler.remove_schedule(f"s-{i:07d}")


# ---------------------------------------------------------------- the scheduler process


async def serve(url: str, ready: Path, max_jobs: int) -> None:
    engine = create_async_engine(url)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        scheduler = AsyncScheduler(
            SQLAlchemyDataStore(engine),
            AsyncpgEventBroker.from_async_sqla_engine(engine),
            max_concurrent_jobs=max_jobs,
        )
        async with scheduler:
            await scheduler.start_in_background()
            await asyncio.to_thread(ready.touch)
            await stop.wait()
            await scheduler.stop()
            await scheduler.wait_until_stopped()
    finally:
        await engine.dispose()


@dataclass
class Proc:
    popen: subprocess.Popen[bytes]
    ready: Path
    out: Path
    log: Path

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.popen.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK

    def memory_mb(self, key: str) -> float:
        for line in Path(f"/proc/{self.popen.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
        return math.nan

    def is_ready(self) -> bool:
        if self.popen.poll() is not None:
            tail = self.log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"scheduler exited {self.popen.returncode}:\n{tail}")
        return self.ready.exists()

    def stop(self, timeout: float = 120) -> None:
        """SIGTERM (records are written on the way out), then SIGKILL to the whole group."""
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                print(f"  !! scheduler ignored SIGTERM for {timeout} s: killed")
        with contextlib.suppress(ProcessLookupError):  # the group may be gone already
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait()

    def records(self) -> list[tuple[str, float, float]]:
        if not self.out.exists():
            return []
        found = []
        for line in self.out.read_text().splitlines():
            sid, slot, start = line.split()
            found.append((sid, float(slot), float(start)))
        return found


@dataclass
class Spawner:
    url: str
    workdir: Path
    procs: list[Proc] = field(default_factory=list)

    def start(self, max_jobs: int) -> Proc:
        n = len(self.procs)
        ready, out, log = (self.workdir / f"aps-{n}.{s}" for s in ("ready", "out", "log"))
        argv = [sys.executable, "-m", "bench.aps_runtime", "--role", "run", "--url", self.url]
        argv += ["--ready", str(ready), "--max-jobs", str(max_jobs)]
        env = {**os.environ, "APS_BENCH_OUT": str(out), "PYTHONPATH": str(ROOT)}
        with log.open("wb") as sink:
            popen = subprocess.Popen(
                argv,
                cwd=ROOT,
                env=env,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        proc = Proc(popen, ready, out, log)
        self.procs.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in self.procs:
            proc.stop()


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:.0f} s for {what}")
        time.sleep(0.05)


# ---------------------------------------------------------------- figures


def percentile(values: list[float], p: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(p / 100 * len(ordered)) - 1))]


def _pg_args(url: str) -> dict[str, object]:
    parts = make_url(url)
    return {
        "host": parts.host,
        "port": parts.port,
        "user": parts.username,
        "password": parts.password,
        "database": parts.database,
    }


async def _activity(conn: asyncpg.Connection) -> tuple[float, float]:
    """The database's transactions so far, and its tables' scans (see the module docstring)."""
    row = await conn.fetchrow(
        "SELECT (SELECT xact_commit + xact_rollback FROM pg_stat_database "
        "        WHERE datname = current_database()), "
        "       (SELECT coalesce(sum(coalesce(seq_scan, 0) + coalesce(idx_scan, 0)), 0) "
        "        FROM pg_stat_user_tables)"
    )
    assert row is not None
    return float(row[0]), float(row[1])


def per_minute(
    url: str, seconds: float, counters: Counters | None = None
) -> tuple[float, float, float]:
    """Transactions, scans and statements a minute over ``seconds``. Transactions and scans
    are read on one connection, the first read's own transaction taken off (PostgreSQL may
    report it late: +-1); statements (``pg_stat_statements``, read through another database:
    nan where it is not loaded) between those two reads."""

    async def go() -> tuple[float, float, float]:
        conn = await asyncpg.connect(**_pg_args(url))
        try:
            x0, s0 = await _activity(conn)
            began = time.monotonic()
            c0 = await asyncio.to_thread(counters.read) if counters else math.nan
            await asyncio.sleep(seconds)
            c1 = await asyncio.to_thread(counters.read) if counters else math.nan
            elapsed = time.monotonic() - began
            x1, s1 = await _activity(conn)
        finally:
            await conn.close()
        per = 60 / elapsed
        return (x1 - x0 - 1) * per, (s1 - s0) * per, (c1 - c0) * per

    return asyncio.run(go())


async def _unfinished(conn: asyncpg.Connection, slot: datetime) -> int:
    """Schedules not yet past ``slot`` plus jobs not yet finished (APScheduler deletes a job's
    row when it finishes): 0 once every run of the slot is over."""
    value = await conn.fetchval(
        "SELECT (SELECT count(*) FROM schedules WHERE next_fire_time <= $1) "
        "     + (SELECT count(*) FROM jobs)",
        slot,
    )
    return int(value)


async def _sql(url: str, statement: str) -> None:
    engine = create_async_engine(url, isolation_level="AUTOCOMMIT")
    try:
        async with engine.connect() as conn:
            await conn.execute(text(statement))
    finally:
        await engine.dispose()


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


# ---------------------------------------------------------------- workloads


def workload_add(url: str, one: int, batch: int, concurrency: int) -> None:
    far = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=2)

    async def go() -> tuple[float, float, float, float]:
        async with Adder(url, concurrency) as adder:
            cpu0 = time.process_time()
            t_one = await adder.timed(0, one, lambda i: far + timedelta(seconds=i), 1)
            cpu1 = time.process_time()
            t_batch = await adder.timed(
                one, batch, lambda i: far + timedelta(seconds=i % 79_200), concurrency
            )
            return t_one, t_batch, cpu1 - cpu0, time.process_time() - cpu1

    t_one, t_batch, c_one, c_batch = asyncio.run(go())
    print(
        f"  one by one: {one:,} in {t_one:.1f} s = {one / t_one:,.0f}/s (client CPU {c_one:.1f} s)"
    )
    print(
        f"  'batch' ({concurrency} concurrent add_schedule calls): {batch:,} in {t_batch:.1f} s "
        f"= {batch / t_batch:,.0f}/s (client CPU {c_batch:.1f} s)"
    )


async def wait_finished(url: str, slot: datetime, window: int) -> float | None:
    """Seconds after ``slot`` at which every run was over (polled each second), or None if some
    were not by ``window`` seconds after it."""
    conn = await asyncpg.connect(**_pg_args(url))
    try:
        while time.time() < slot.timestamp() + window:
            if await _unfinished(conn, slot) == 0:
                return time.time() - slot.timestamp()
            await asyncio.sleep(1)
    finally:
        await conn.close()
    return None


def workload_burst(url: str, workdir: Path, count: int, concurrency: int, window: int) -> None:
    far = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=2)

    async def calibrate() -> float:
        async with Adder(url, concurrency) as adder:
            took = await adder.timed(10_000_000, 1_000, lambda i: far, concurrency)
            await adder.remove(10_000_000, 1_000)
        return 1_000 / took

    rate = asyncio.run(calibrate())
    margin = 1.5 * count / rate + 45
    slot = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=math.ceil(margin))
    print(f"  add rate {rate:,.0f}/s on 1,000: slot {slot:%H:%M:%S} ({margin:.0f} s ahead)")

    async def seed() -> float:
        async with Adder(url, concurrency) as adder:
            return await adder.timed(0, count, lambda i: slot, concurrency)

    took = asyncio.run(seed())
    print(
        f"  added {count:,} in {took:.1f} s ({count / took:,.0f}/s); "
        f"{(slot - datetime.now(UTC)).total_seconds():.0f} s left; {load()}"
    )
    spawner = Spawner(url, workdir)
    try:
        began = time.monotonic()
        proc = spawner.start(count)
        wait_for(proc.is_ready, 120, "the scheduler to start")
        left = slot.timestamp() - time.time()
        print(f"  scheduler started after {time.monotonic() - began:.1f} s ({left:.0f} s left)")
        if left < 0:
            print("  !! the slot passed before the scheduler started: lags include that")
        time.sleep(max(0.0, slot.timestamp() + 1 - time.time()))
        finished = asyncio.run(wait_finished(url, slot, window))
        rss = proc.memory_mb("VmHWM")
    finally:
        spawner.stop_all()
    records = [r for r in proc.records() if abs(r[1] - slot.timestamp()) < 0.5]
    lags = [(start - at) * 1000 for _, at, start in records]
    runs = Counter(sid for sid, _, _ in records)
    doubled = sum(n - 1 for n in runs.values() if n > 1)
    within = {sid for sid, at, start in records if start - at <= SLOTCRON_WINDOW}
    print(
        f"  {len(records):,} runs: lag p50 {percentile(lags, 50):,.0f} ms, "
        f"p99 {percentile(lags, 99):,.0f} ms, max {max(lags, default=math.nan):,.0f} ms, "
        f"min {min(lags, default=math.nan):,.0f} ms; doubled {doubled}; not started within "
        f"{SLOTCRON_WINDOW} s {count - len(within):,}, within {window} s "
        f"{count - len(runs):,}; peak RSS {rss:.0f} MB"
    )
    if finished is not None:
        print(f"  every run over {finished:.0f} s after the slot (by the database)")


def workload_day(
    url: str,
    workdir: Path,
    count: int,
    concurrency: int,
    seconds: int,
    max_setup: float,
    fallback: int,
) -> None:
    first = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=1)

    async def seed() -> tuple[int, float]:
        nonlocal count
        async with Adder(url, concurrency) as adder:
            probe = min(count, 10_000)
            step = 23 * 3600 / count
            took = await adder.timed(
                0, probe, lambda i: first + timedelta(seconds=i * step), concurrency
            )
            projected = count / probe * took
            if projected > max_setup and fallback < count:
                print(
                    f"  adding {count:,} would take ~{projected:,.0f} s "
                    f"({probe / took:,.0f}/s on the first {probe:,}) > {max_setup:.0f} s: "
                    f"measuring {fallback:,} instead"
                )
                # Re-spread over the day for the smaller count: the first ``probe`` stay.
                count = fallback
            step = 23 * 3600 / count
            rest = await adder.timed(
                probe, count - probe, lambda i: first + timedelta(seconds=i * step), concurrency
            )
        return count, took + rest

    count, took = asyncio.run(seed())
    print(f"  added {count:,} over the day in {took:.1f} s ({count / took:,.0f}/s)")
    asyncio.run(_sql(url, "VACUUM ANALYZE schedules"))
    counters = Counters("postgresql", url)
    quiet = per_minute(url, seconds, counters)
    print(
        f"  no scheduler, {seconds} s: {quiet[0]:.1f} transactions/min, {quiet[1]:.1f} scans/min, "
        f"{Counters.figure(quiet[2], 'statements/min')} "
        f"(the database's own background); {load()}"
    )
    spawner = Spawner(url, workdir)
    try:
        began = time.monotonic()
        proc = spawner.start(100)
        wait_for(proc.is_ready, 600, "the scheduler to start")
        ready = time.monotonic() - began
        # Idle: the first 2 s in which it used under 5 % of a core.
        mark, at = proc.cpu_seconds(), time.monotonic()
        while True:
            time.sleep(2)
            now_cpu, now = proc.cpu_seconds(), time.monotonic()
            if (now_cpu - mark) / (now - at) < 0.05:
                break
            mark, at = now_cpu, now
        quiet_after = at - began
        cpu, t0 = proc.cpu_seconds(), time.monotonic()
        xacts, scans, statements = per_minute(url, seconds, counters)
        elapsed = time.monotonic() - t0
        cpu_pct = (proc.cpu_seconds() - cpu) / elapsed * 100
        rss, peak = proc.memory_mb("VmRSS"), proc.memory_mb("VmHWM")
    finally:
        spawner.stop_all()
    print(
        f"  started in {ready:.1f} s, idle from {quiet_after:.1f} s; RSS {rss:.0f} MB "
        f"(peak {peak:.0f}); idle CPU {cpu_pct:.2f} % of a core; "
        f"{Counters.figure(statements, 'statements/min')}, {xacts:.1f} transactions/min "
        f"(pg_stat_database), {scans:.1f} scans/min (pg_stat_user_tables) over {elapsed:.0f} s"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.aps_runtime", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--only", default="add,burst,day", help="add, burst, day (comma list)")
    parser.add_argument("--one", type=int, default=1_000, help="add: one by one")
    parser.add_argument("--batch", type=int, default=100_000, help="add: concurrently")
    parser.add_argument("--concurrency", type=int, default=10, help="add_schedule calls in flight")
    parser.add_argument("--burst", default="100000", help="burst: schedule counts, comma list")
    parser.add_argument("--window", type=int, default=180, help="burst: seconds after the slot")
    parser.add_argument("--day", type=int, default=1_000_000, help="day: schedules")
    parser.add_argument("--seconds", type=int, default=60, help="day: idle seconds measured")
    parser.add_argument("--max-setup", type=float, default=900, help="day: seconds to add")
    parser.add_argument("--fallback", type=int, default=100_000, help="day: count if too slow")
    parser.add_argument("--role", choices=("bench", "run"), default="bench", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--ready", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--max-jobs", type=int, default=100, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.role == "run":
        # uvloop when installed, as bench/aps.py and slotcron's own CLI use it.
        with asyncio.Runner(loop_factory=aps.loop_factory()) as runner:
            runner.run(serve(args.url, args.ready, args.max_jobs))
        aps_runtime_jobs.flush()
        return 0

    available = backends.probe_all()
    if not available.ok.get("postgresql"):
        sys.exit(f"postgresql is not reachable: {available.why.get('postgresql')}")
    for what in args.only.split(","):
        sizes = [int(n) for n in args.burst.split(",")] if what == "burst" else [0]
        for size in sizes:
            with tempfile.TemporaryDirectory() as tmp:
                url = backends.create_database("postgresql", Path(tmp))
                try:
                    if what == "add":
                        print(
                            f"add: {args.one:,} one by one, {args.batch:,} concurrently; {load()}"
                        )
                        workload_add(url, args.one, args.batch, args.concurrency)
                    elif what == "burst":
                        print(f"burst: {size:,} schedules due in the same second; {load()}")
                        workload_burst(url, Path(tmp), size, args.concurrency, args.window)
                    elif what == "day":
                        print(f"day: {args.day:,} schedules spread over the day; {load()}")
                        workload_day(
                            url,
                            Path(tmp),
                            args.day,
                            args.concurrency,
                            args.seconds,
                            args.max_setup,
                            args.fallback,
                        )
                    else:
                        sys.exit(f"unknown workload {what!r}: add, burst or day")
                finally:
                    backends.drop_database("postgresql", url)
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
