"""slotcron side by side with APScheduler 4: real processes on a real database, one table.

    python -m bench.run                       # everything, PostgreSQL
    python -m bench.run --backend mariadb     # or sqlite (one machine: no cluster rows)
    python -m bench.run --only burst,steady --no-apscheduler

Workloads (docs/explanation/benchmark.md has the definitions and the last figures):
  burst       N jobs (1,000 and 10,000) due in the same second, one instance
  steady      3 instances, 500 jobs every second, 60 s
  throughput  the most slot runs per second 3 instances sustain (p99 lag < 1 s, none missed)
  idle        10,000 jobs with no slot due for an hour, one instance, 60 s
  scaling     the same 1,000 jobs every second on one instance and on three, 20 s each: the
              cluster's CPU per 1,000 runs side by side, and their ratio (slotcron only)
  statements  database round trips per slot run (counted by the database)
  schedules   runtime schedules created through slotcron.Client: 1,000 one by one, 100,000 in one
              add_schedules (bench/schedules.py; slotcron only, not in the default set)

Every job records its real start; lag = start - slot. ``doubled`` is a (job, slot) started
more than once; ``missed`` a (job, slot) in the measured window that never started.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

ROOT = Path(__file__).resolve().parents[1]
PYTHONPATH = os.pathsep.join([str(ROOT), str(ROOT / "app")])
"""The checkout's own package first (``app/slotcron``, and ``bench``): a benchmark measures the
tree it is in, not whichever slotcron is installed."""
sys.path.insert(0, str(ROOT))

from tests import backends  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")
Record = tuple[int, float, float]  # job index, slot, start (unix seconds)


# ---------------------------------------------------------------- processes


@dataclass
class Proc:
    """One scheduler process (ours or APScheduler's) and the file its jobs' starts go to."""

    name: str
    popen: subprocess.Popen[bytes]
    out: Path
    log: Path
    ready: Path | None = None
    cpu_mark: float = 0.0

    def is_ready(self) -> bool:
        if self.popen.poll() is not None:
            raise RuntimeError(f"{self.name} exited {self.popen.returncode}:\n{self.tail()}")
        if self.ready is not None:
            return self.ready.exists()
        text = self.log.read_bytes()
        return b" running " in text and b"instance " in text

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.popen.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime

    def memory_mb(self, key: str = "VmHWM") -> float:
        for line in Path(f"/proc/{self.popen.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
        return math.nan

    def stop(self, timeout: float = 60) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
            print(f"  !! {self.name} ignored SIGTERM for {timeout} s: killed", file=sys.stderr)


def wait_for(condition: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:.0f} s for {what}")
        time.sleep(0.05)


def sleep_until(wall: float) -> None:
    time.sleep(max(0.0, wall - time.time()))


class System:
    """How to start one scheduler's processes on a database."""

    name = ""

    def __init__(self, url: str, workdir: Path) -> None:
        self.url = url
        self.workdir = workdir
        self.procs: list[Proc] = []

    def _spawn(self, name: str, argv: list[str], env: dict[str, str], ready: bool) -> Proc:
        out, log = self.workdir / f"{name}.starts", self.workdir / f"{name}.log"
        ready_path = self.workdir / f"{name}.ready" if ready else None
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("SCHEDULER_")}
        full_env.update(env, PYTHONPATH=PYTHONPATH)
        with log.open("wb") as sink:
            popen = subprocess.Popen(
                argv, cwd=ROOT, env=full_env, stdout=sink, stderr=subprocess.STDOUT
            )
        proc = Proc(name, popen, out, log, ready_path)
        self.procs.append(proc)
        return proc

    def prepare(self, jobs: int, expression: str) -> None:
        raise NotImplementedError

    def start(self, instance: int, jobs: int, expression: str) -> Proc:
        raise NotImplementedError

    def records(self) -> list[Record]:
        found: list[Record] = []
        for proc in self.procs:
            if proc.out.exists():
                for line in proc.out.read_text().splitlines():
                    i, slot, start = line.split()
                    found.append((int(i), float(slot), float(start)))
        return found

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.popen.poll() is None:
                proc.popen.send_signal(signal.SIGTERM)
        for proc in self.procs:
            proc.stop()


JOBS_MODULE = os.environ.get("BENCH_JOBS_MODULE", "bench.jobs")  # an instrumented copy, say


class Slotcron(System):
    name = "slotcron"

    def prepare(self, jobs: int, expression: str) -> None:
        env = {"SCHEDULER_DATABASE_URL": self.url}
        subprocess.run(
            [sys.executable, "-m", "slotcron", "migrate"],
            cwd=ROOT,
            env={**os.environ, **env, "PYTHONPATH": PYTHONPATH},
            check=True,
            capture_output=True,
        )

    def start(self, instance: int, jobs: int, expression: str) -> Proc:
        name = f"slotcron-{instance}"
        env = {
            "SCHEDULER_DATABASE_URL": self.url,
            "SCHEDULER_INSTANCE_ID": name,
            "BENCH_JOBS": str(jobs),
            "BENCH_CRON": expression,
            "BENCH_OUT": str(self.workdir / f"{name}.starts"),
            # As APScheduler's max_concurrent_jobs below: every job due at once may run at once.
            "SCHEDULER_MAX_CONCURRENCY": str(max(jobs, 1000)),
        }
        argv = [sys.executable, "-m", "slotcron", "run", "--jobs", JOBS_MODULE]
        return self._spawn(name, argv, env, ready=False)


class APScheduler(System):
    name = "APScheduler 4"

    def _argv(self, role: str, jobs: int, expression: str, name: str) -> list[str]:
        return [
            sys.executable, "-m", "bench.aps", "--url", self.url, "--role", role,
            "--jobs", str(jobs), "--cron", expression, "--seconds-first",
            "--out", str(self.workdir / f"{name}.starts"),
            "--ready", str(self.workdir / f"{name}.ready"),
            "--max-concurrent-jobs", str(max(jobs, 100)),
        ]  # fmt: skip

    def prepare(self, jobs: int, expression: str) -> None:
        proc = self._spawn("aps-seed", self._argv("seed", jobs, expression, "aps-seed"), {}, False)
        if proc.popen.wait() != 0:
            raise RuntimeError(f"seeding APScheduler failed:\n{proc.tail()}")
        self.procs.remove(proc)

    def start(self, instance: int, jobs: int, expression: str) -> Proc:
        name = f"aps-{instance}"
        return self._spawn(name, self._argv("run", jobs, expression, name), {}, ready=True)


# ---------------------------------------------------------------- database counters


class Counters:
    """Statements executed, as the database counts them (not as we do). A count it cannot read
    is nan, and :meth:`figure` prints it as one line saying why, never the driver's error."""

    # Why the last count could not be read (shared: the table's footer prints it too).
    missing: str | None = None

    def __init__(self, backend: str, url: str) -> None:
        self.backend = backend
        self.url = url
        self.how = {
            "postgresql": "pg_stat_statements calls",
            "mariadb": "global Questions (the whole server)",
        }.get(backend, "")

    async def _read(self) -> float:
        if self.backend == "postgresql":
            admin = make_url(self.url).set(database="postgres")
            engine = create_async_engine(admin)
            try:
                async with engine.connect() as conn:
                    await conn.execute(text("CREATE EXTENSION IF NOT EXISTS pg_stat_statements"))
                    await conn.commit()
                    value = (
                        await conn.execute(
                            text(
                                "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements s "
                                "JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = :db"
                            ),
                            {"db": make_url(self.url).database},
                        )
                    ).scalar_one()
            finally:
                await engine.dispose()
            return float(value)
        if self.backend == "mariadb":
            engine = create_async_engine(self.url)
            try:
                async with engine.connect() as conn:
                    row = (await conn.execute(text("SHOW GLOBAL STATUS LIKE 'Questions'"))).one()
            finally:
                await engine.dispose()
            return float(row[1]) - 1  # this query itself
        return math.nan

    def read(self) -> float:
        try:
            return asyncio.run(self._read())
        except Exception as exc:  # the figure is optional; the run is not
            Counters.missing = _why_unreadable(exc)
            return math.nan

    def available(self) -> bool:
        return not math.isnan(self.read())

    @staticmethod
    def figure(value: float, unit: str) -> str:
        """``12.0 statements/min``, or ``statements/min: n/a (pg_stat_statements not loaded)``."""
        if math.isnan(value):
            return f"{unit}: n/a ({Counters.missing or 'not counted on this backend'})"
        return f"{value:.1f} {unit}"


def _why_unreadable(exc: BaseException) -> str:
    """One line for a count that could not be read (the driver's message is a block)."""
    text = str(exc)
    if "pg_stat_statements" in text or "shared_preload_libraries" in text:
        return "pg_stat_statements not loaded"
    first = text.strip().splitlines()[0] if text.strip() else ""
    return f"{type(exc).__name__}: {first}"[:120]


# ---------------------------------------------------------------- figures


@dataclass
class Outcome:
    lags_ms: list[float] = field(default_factory=list)
    doubled: int = 0
    missed: int = 0
    runs: int = 0
    extra: dict[str, float] = field(default_factory=dict)

    def pct(self, p: float) -> float:
        if not self.lags_ms:
            return math.nan
        ordered = sorted(self.lags_ms)
        return ordered[min(len(ordered) - 1, math.ceil(p / 100 * len(ordered)) - 1)]


def judge(records: Iterable[Record], jobs: int, slots: list[float]) -> Outcome:
    wanted = set(slots)
    counts = Counter((i, slot) for i, slot, _ in records if slot in wanted)
    outcome = Outcome()
    outcome.lags_ms = [(start - slot) * 1000 for i, slot, start in records if slot in wanted]
    outcome.runs = len(outcome.lags_ms)
    outcome.doubled = sum(n - 1 for n in counts.values() if n > 1)
    outcome.missed = jobs * len(slots) - len(counts)
    return outcome


def next_slot(after: float, period: int) -> float:
    return float(math.ceil(after / period) * period)


# ---------------------------------------------------------------- workloads


def burst(system: System, jobs: int) -> Outcome:
    """``jobs`` jobs due in the same second on one instance: the first such second after it is
    ready (every 30 s, so the burst is alone)."""
    expression = "*/30 * * * * *"
    system.prepare(jobs, expression)
    proc = system.start(0, jobs, expression)
    wait_for(proc.is_ready, 300, f"{proc.name} to start")
    slot = next_slot(time.time() + 1, 30)
    sleep_until(slot + 25)  # everything of that burst has started long before, or it is missed
    system.stop_all()
    outcome = judge(system.records(), jobs, [slot])
    return outcome


def cluster(system: System, counters: Counters, instances: int, jobs: int, seconds: int) -> Outcome:
    """``instances`` processes, ``jobs`` jobs due every second, measured over ``seconds``."""
    expression = "* * * * * *"
    system.prepare(jobs, expression)
    procs = [system.start(n, jobs, expression) for n in range(instances)]
    for proc in procs:
        wait_for(proc.is_ready, 300, f"{proc.name} to start")
    first = next_slot(time.time() + 2, 1)
    sleep_until(first)
    statements = counters.read()
    cpu = [p.cpu_seconds() for p in procs]
    sleep_until(first + seconds)
    cpu_used = sum(p.cpu_seconds() - c for p, c in zip(procs, cpu, strict=True))
    statements = counters.read() - statements
    peak = max(p.memory_mb() for p in procs)
    sleep_until(first + seconds + 3)  # the last slots' stragglers
    system.stop_all()
    slots = [first + k for k in range(seconds)]
    outcome = judge(system.records(), jobs, slots)
    runs = jobs * seconds
    outcome.extra = {
        "cpu_per_1k": cpu_used / (runs / 1000),
        "peak_rss_mb": peak,
        "statements_per_run": statements / runs,
    }
    return outcome


def idle(system: System, counters: Counters, seconds: int = 60) -> Outcome:
    """10,000 jobs with no slot due for over an hour: what one instance costs doing nothing."""
    later = datetime.now(UTC) + timedelta(hours=2)
    expression = f"0 {later.minute} {later.hour} * * *"
    system.prepare(10_000, expression)
    proc = system.start(0, 10_000, expression)
    wait_for(proc.is_ready, 300, f"{proc.name} to start")
    time.sleep(5)  # start-up settles
    statements, cpu, t0 = counters.read(), proc.cpu_seconds(), time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - t0
    outcome = Outcome()
    outcome.extra = {
        "cpu_percent": (proc.cpu_seconds() - cpu) / elapsed * 100,
        "rss_mb": proc.memory_mb("VmRSS"),
        "statements_per_min": (counters.read() - statements) / elapsed * 60,
    }
    system.stop_all()
    return outcome


# ---------------------------------------------------------------- driver


class Bench:
    def __init__(self, backend: str, with_aps: bool) -> None:
        self.backend = backend
        self.systems: list[type[System]] = [Slotcron] + ([APScheduler] if with_aps else [])
        self.rows: list[tuple[str, str, dict[str, float | None]]] = []

    def run(
        self, label: str, workload: Callable[[System, Counters], Outcome], ours_only: bool = False
    ) -> dict[str, Outcome]:
        results: dict[str, Outcome] = {}
        for kind in self.systems[:1] if ours_only else self.systems:
            with tempfile.TemporaryDirectory(prefix="slotcron-bench-") as tmp:
                url = backends.create_database(self.backend, Path(tmp))
                system = kind(url, Path(tmp))
                print(f"- {label}: {kind.name} ...", flush=True)
                try:
                    results[kind.name] = workload(system, Counters(self.backend, url))
                except Exception as exc:
                    print(f"  !! {kind.name} {label} failed: {exc}")
                finally:
                    system.stop_all()
                    backends.drop_database(self.backend, url)
        return results

    def add(
        self,
        label: str,
        metric: str,
        results: dict[str, Outcome],
        value: Callable[[Outcome], float],
    ) -> None:
        self.rows.append((label, metric, {k: value(v) for k, v in results.items()}))

    def table(self) -> str:
        names = [k.name for k in self.systems]
        head = f"| workload | figure | {' | '.join(names)} |" + (
            " ratio |" if len(names) > 1 else ""
        )
        lines = [head, "|" + " --- |" * (head.count("|") - 1)]
        for label, metric, values in self.rows:
            cells = [_fmt(values.get(n)) for n in names]
            line = f"| {label} | {metric} | {' | '.join(cells)} |"
            if len(names) > 1:
                line += f" {_ratio(values.get(names[0]), values.get(names[1]), metric)} |"
            lines.append(line)
        return "\n".join(lines)


def _fmt(value: float | None) -> str:
    if value is None or math.isnan(value):
        return "n/a"
    if abs(value) >= 100 or value == int(value):
        return f"{value:,.0f}"
    return f"{value:.2f}"


def _ratio(ours: float | None, theirs: float | None, metric: str) -> str:
    if ours is None or theirs is None or math.isnan(ours) or math.isnan(theirs):
        return "n/a"
    higher_is_better = "runs/s" in metric
    if ours == theirs:
        return "even"
    if ours == 0 or theirs == 0:
        better = (ours > theirs) == higher_is_better
        return "slotcron ahead" if better else "APScheduler ahead"
    factor = theirs / ours if not higher_is_better else ours / theirs
    return f"{factor:.1f}x" + ("" if factor >= 1 else " (behind)")


def throughput(bench: Bench, steps: list[int], seconds: int) -> tuple[int, dict[str, Outcome]]:
    """Raise the jobs due every second until p99 lag reaches 1 s or a slot is missed."""
    best, best_results = 0, {}
    for jobs in steps:
        results = bench.run(
            f"throughput {jobs}/s",
            lambda s, c: cluster(s, c, 3, jobs, seconds),  # noqa: B023 (run before the next step)
            ours_only=True,
        )
        ours = results.get(Slotcron.name)
        if ours is None:
            break
        ok = ours.pct(99) < 1000 and ours.missed == 0 and ours.doubled == 0
        print(
            f"  {jobs}/s: p99 {ours.pct(99):.0f} ms, missed {ours.missed}, doubled {ours.doubled}"
            f" -> {'sustained' if ok else 'not sustained'}",
            flush=True,
        )
        if not ok:
            break
        best, best_results = jobs, results
    return best, best_results


def scaling(bench: Bench, jobs: int, seconds: int = 20) -> None:
    """The same load on one instance and on three: what adding instances costs the cluster."""
    cpu: dict[int, float] = {}
    for instances in (1, 3):
        r = bench.run(
            f"scaling {instances}x",
            lambda s, c: cluster(s, c, instances, jobs, seconds),  # noqa: B023 (run at once)
            ours_only=True,
        )
        label = f"scaling {jobs:,}/s, {instances} instance{'s' if instances > 1 else ''}"
        bench.add(label, "CPU s per 1,000 runs", r, lambda o: o.extra["cpu_per_1k"])
        bench.add(label, "start lag p99 ms", r, lambda o: o.pct(99))
        bench.add(label, "doubled", r, lambda o: o.doubled)
        bench.add(label, "missed", r, lambda o: o.missed)
        ours = r.get(Slotcron.name)
        if ours is not None:
            cpu[instances] = ours.extra["cpu_per_1k"]
    if len(cpu) == 2 and cpu[1] > 0:
        ratio = {Slotcron.name: Outcome(extra={"ratio": cpu[3] / cpu[1]})}
        bench.add(f"scaling {jobs:,}/s", "CPU 3 instances / 1", ratio, lambda o: o.extra["ratio"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--backend", default="postgresql", choices=["postgresql", "mariadb", "sqlite"]
    )
    parser.add_argument("--only", default="burst,steady,throughput,idle")
    parser.add_argument("--no-apscheduler", action="store_true")
    parser.add_argument("--burst-sizes", default="1000,10000")
    parser.add_argument("--steady-seconds", type=int, default=60)
    parser.add_argument("--throughput-steps", default="2000,4000,6000,8000,10000,12000")
    parser.add_argument("--scaling-jobs", type=int, default=1000)
    args = parser.parse_args()

    available = backends.probe_all()
    if not available.ok.get(args.backend):
        sys.exit(f"{args.backend} is not reachable: {available.why.get(args.backend)}")
    with_aps = not args.no_apscheduler
    if with_aps:
        try:
            import apscheduler  # noqa: F401
        except ImportError:
            print("APScheduler 4 is not installed (pip install -e '.[bench]'): slotcron only")
            with_aps = False
    bench = Bench(args.backend, with_aps)
    only = set(args.only.split(","))
    cpus = os.cpu_count()
    print(f"{args.backend}, {cpus} cores, python {sys.version.split()[0]}", flush=True)

    if "burst" in only:
        for n in (int(x) for x in args.burst_sizes.split(",")):
            r = bench.run(f"burst {n}", lambda s, c: burst(s, n))  # noqa: B023 (run at once)
            label = f"burst {n:,}"
            bench.add(label, "start lag p50 ms", r, lambda o: o.pct(50))
            bench.add(label, "start lag p99 ms", r, lambda o: o.pct(99))
            bench.add(label, "start lag max ms", r, lambda o: max(o.lags_ms, default=math.nan))
            bench.add(label, "doubled", r, lambda o: o.doubled)
            bench.add(label, "missed", r, lambda o: o.missed)
    if "steady" in only:
        seconds = args.steady_seconds
        r = bench.run("steady", lambda s, c: cluster(s, c, 3, 500, seconds))
        label = f"steady 3x500/s {seconds} s"
        bench.add(label, "start lag p50 ms", r, lambda o: o.pct(50))
        bench.add(label, "start lag p99 ms", r, lambda o: o.pct(99))
        bench.add(label, "doubled", r, lambda o: o.doubled)
        bench.add(label, "missed", r, lambda o: o.missed)
        bench.add(label, "CPU s per 1,000 runs", r, lambda o: o.extra["cpu_per_1k"])
        bench.add(label, "peak RSS MB (largest instance)", r, lambda o: o.extra["peak_rss_mb"])
        bench.add(label, "statements per run", r, lambda o: o.extra["statements_per_run"])
    if "throughput" in only:
        steps = [int(x) for x in args.throughput_steps.split(",")]
        best, r = throughput(bench, steps, 20)
        bench.add(
            "throughput, 3 instances",
            "sustained runs/s",
            {Slotcron.name: Outcome()},
            lambda _o: float(best),
        )
        if r:
            bench.add("throughput, 3 instances", "p99 ms at that rate", r, lambda o: o.pct(99))
    if "scaling" in only:
        scaling(bench, args.scaling_jobs)
    if "idle" in only:
        r = bench.run("idle", idle, ours_only=True)
        label = "idle, 10,000 jobs"
        bench.add(label, "CPU % of a core", r, lambda o: o.extra["cpu_percent"])
        bench.add(label, "RSS MB", r, lambda o: o.extra["rss_mb"])
        bench.add(label, "statements per minute", r, lambda o: o.extra["statements_per_min"])

    if "schedules" in only:
        from bench import schedules

        rates = schedules.measure(args.backend)
        print(f"schedules through slotcron.Client:\n{schedules.report(rates)}", flush=True)
        created = {Slotcron.name: Outcome(extra={"one": rates.one_by_one, "batch": rates.batched})}
        bench.add("schedules created", "one by one per s", created, lambda o: o.extra["one"])
        bench.add("schedules created", "add_schedules per s", created, lambda o: o.extra["batch"])

    counters = Counters(args.backend, "")
    how = counters.how or "not counted on this backend"
    if Counters.missing:
        how = f"n/a ({Counters.missing})"
    print()
    print(f"slotcron {_version()} on {args.backend}; {cpus} cores; statements: {how}")
    print(bench.table())


def _version() -> str:
    from slotcron.version import __version__

    return __version__


if __name__ == "__main__":
    main()
