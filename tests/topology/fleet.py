"""Helpers of the topology tests: real ``slotcron run`` processes on a harness-made PostgreSQL
topology (tests/pgcluster.py), the command line, the HTTP probes, the instances' logs, the
history as the database has it, and the FIGURES line each test prints.

Judgements rest on what the jobs recorded (tests/topology/jobs_topology.py, read with
tests.cluster.harness), the tables only for what slotcron claims (its history).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp

from tests.cluster.harness import Instance, Run, read_records, runs, slot_time, wait_until
from tests.pgcluster import PgServer

ROOT = Path(__file__).resolve().parents[2]
JOBS = "tests.topology.jobs_topology"
DATABASE = "slotcron"

Key = tuple[str, int]
"""A slot as (job, microseconds since the epoch): the records' and the rows' slots compared."""


def key_of(job: str, slot: datetime | str) -> Key:
    at = slot_time(slot) if isinstance(slot, str) else slot.timestamp()
    return job, round(at * 1_000_000)


class Fleet:
    """The ``slotcron run`` processes of one test, sharing one records file; :meth:`close`
    (the fixture's teardown) kills whatever still runs."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.records_path = directory / "records.jsonl"
        self.instances: list[Instance] = []

    def start(self, name: str, url: str, scenario: str, **env: Any) -> Instance:
        values = {
            "SLOTCRON_TOPOLOGY": scenario,
            "SCHEDULER_SHUTDOWN_DRAIN_TIMEOUT": 5,
            "SCHEDULER_SHUTDOWN_CANCEL_TIMEOUT": 3,
            **env,
        }
        instance = Instance(
            name=name,
            db_url=url,
            jobs=JOBS,
            record_path=self.records_path,
            log_path=self.dir / f"{name}.log",
            env={k: str(v) for k, v in values.items()},
        ).start()
        self.instances.append(instance)
        return instance

    def records(self) -> list[dict[str, Any]]:
        return read_records(self.records_path)

    def runs(self) -> list[Run]:
        return runs(self.records())

    def starts_after(self, moment: float, jobs: Iterable[str] | None = None) -> list[Run]:
        wanted = set(jobs) if jobs is not None else None
        return [r for r in self.runs() if r.start > moment and (wanted is None or r.job in wanted)]

    async def stop(self, timeout: float = 20.0) -> dict[str, int | None]:
        """SIGTERM every live instance; each one's exit status (None: killed after
        ``timeout`` s)."""
        for instance in self.instances:
            if instance.alive():
                instance.signal(signal.SIGTERM)
        codes: dict[str, int | None] = {}
        for instance in self.instances:
            assert instance.process is not None
            try:
                codes[instance.name] = await asyncio.to_thread(instance.process.wait, timeout)
            except subprocess.TimeoutExpired:
                codes[instance.name] = None
                instance.kill()
        return codes

    def close(self) -> None:
        for instance in self.instances:
            instance.kill()


async def until(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll ``condition`` in a worker thread (the test's loop keeps serving) until truthy."""
    return await asyncio.to_thread(wait_until, condition, timeout, what)


def figures(test: str, **values: Any) -> str:
    """Print (and return) the test's one ``FIGURES:`` line."""
    shown = " ".join(f"{k}={_shown(v)}" for k, v in values.items())
    line = f"FIGURES: {test} {shown}"
    print(line, flush=True)
    return line


def _shown(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.2f}"
    if isinstance(value, dict | list) or (isinstance(value, str) and " " in value):
        return json.dumps(value, separators=(",", ":"), default=str)
    return str(value)


# --- the command line


@dataclass(frozen=True)
class Cli:
    returncode: int
    stdout: str
    stderr: str
    started: float
    ended: float

    @property
    def seconds(self) -> float:
        return self.ended - self.started


async def cli(url: str, *args: str, pooler: str = "none", timeout: float = 30.0) -> Cli:
    """``python -m slotcron ARGS`` on ``url`` (through whatever the URL names), run to its end."""
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("SCHEDULER_")}
    env.update(
        SCHEDULER_DATABASE_URL=url,
        SCHEDULER_DATABASE_POOLER=pooler,
        PYTHONPATH=str(ROOT),
    )

    def run() -> Cli:
        started = time.time()
        done = subprocess.run(
            [sys.executable, "-m", "slotcron", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        return Cli(done.returncode, done.stdout, done.stderr, started, time.time())

    return await asyncio.to_thread(run)


# --- the instances' logs


def log_lines(instance: Instance, text: str) -> list[tuple[float, str]]:
    """The lines of ``instance``'s log holding ``text``, with their time (epoch seconds)."""
    found = []
    for line in instance.full_log().splitlines():
        if text in line:
            stamp = line.split(" ", 1)[0]
            try:
                at = datetime.fromisoformat(stamp).timestamp()
            except ValueError:
                at = float("nan")
            found.append((at, line))
    return found


def running(instance: Instance) -> bool:
    """Whether ``instance`` logged that it runs (``instance NAME running N jobs on ...``)."""
    return any(" running " in line for _, line in log_lines(instance, f"instance {instance.name}"))


# --- HTTP


async def get(port: int, path: str, timeout: float = 5.0) -> tuple[int, str]:
    """``GET http://127.0.0.1:port/path``: (status, body); (0, why) when nothing answered."""
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session,
            session.get(f"http://127.0.0.1:{port}{path}") as response,
        ):
            return response.status, await response.text()
    except (aiohttp.ClientError, TimeoutError) as exc:
        return 0, repr(exc)


async def readyz(port: int) -> tuple[int, dict[str, Any]]:
    status, body = await get(port, "/readyz")
    try:
        parsed = json.loads(body) if status else {"error": body}
    except ValueError:
        parsed = {"body": body}
    return status, parsed if isinstance(parsed, dict) else {"body": parsed}


def metric(text: str, name: str) -> float | None:
    """The value of the unlabelled sample ``name`` in Prometheus text (None if absent)."""
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{}"):
            return float(line.rsplit(" ", 1)[1])
    return None


# --- the history, as the database has it


@dataclass(frozen=True)
class Row:
    id: int
    job: str
    slot: datetime
    attempt: int
    trigger: str
    status: str
    instance: str | None
    error: str | None
    until: datetime | None
    """The last slot of a MISSED row standing for a passed-over range."""

    @property
    def key(self) -> Key:
        return key_of(self.job, self.slot)

    def covers(self, job: str, at: float) -> bool:
        """Whether this row accounts for ``job``'s slot at ``at`` (epoch seconds)."""
        last = self.until or self.slot
        return job == self.job and self.slot.timestamp() <= at <= last.timestamp()


def history(server: PgServer) -> list[Row]:
    """Every row of ``scheduler_executions`` on ``server``."""
    rows = server.fetch(
        "SELECT id, job_name, scheduled_at, attempt, trigger, status, instance_id, error, "
        '"until" FROM scheduler_executions ORDER BY id',
        database=DATABASE,
    )
    return [Row(*row) for row in rows]


@dataclass(frozen=True)
class Disagreement:
    finished_not_completed: list[str]
    """Runs the records show ran to their end, whose row says otherwise (or is missing)."""
    running_left: list[str]
    """Rows still RUNNING once every instance has stopped."""
    completed_never_ran: list[str]
    """Rows COMPLETED whose run no record shows ending."""

    @property
    def total(self) -> int:
        return (
            len(self.finished_not_completed)
            + len(self.running_left)
            + len(self.completed_never_ran)
        )

    def describe(self) -> list[str]:
        return [
            *(f"ran to its end, history says {x}" for x in self.finished_not_completed),
            *(f"left RUNNING: {x}" for x in self.running_left),
            *(f"COMPLETED without an end record: {x}" for x in self.completed_never_ran),
        ]


def compare(found: list[Run], rows: list[Row]) -> Disagreement:
    """Where the history (every instance stopped) disagrees with the records."""
    by_key: dict[tuple[Key, int], list[Row]] = {}
    for row in rows:
        by_key.setdefault((row.key, row.attempt), []).append(row)
    ended = {(key_of(r.job, r.slot), r.attempt) for r in found if r.finished}
    finished_not_completed = []
    for run in found:
        if not run.finished:
            continue
        mine = by_key.get((key_of(run.job, run.slot), run.attempt), [])
        if not any(row.status == "COMPLETED" for row in mine):
            shown = ",".join(f"{row.status}@{row.instance}" for row in mine) or "no row"
            finished_not_completed.append(f"{run.job} {run.slot} on {run.instance}: {shown}")
    running_left = [
        f"{row.job} {row.slot.isoformat()} on {row.instance}"
        for row in rows
        if row.status == "RUNNING"
    ]
    completed_never_ran = [
        f"{row.job} {row.slot.isoformat()} on {row.instance}"
        for row in rows
        if row.status == "COMPLETED" and (row.key, row.attempt) not in ended
    ]
    return Disagreement(finished_not_completed, running_left, completed_never_ran)


# --- what the records say


def started_twice(found: list[Run]) -> dict[Key, int]:
    """Slots (with their attempt folded in: no test job retries) whose body started more than
    once, with how many times."""
    counts = Counter(key_of(r.job, r.slot) for r in found)
    return {k: n for k, n in counts.items() if n > 1}


def shown_key(key: Key) -> str:
    job, micros = key
    return f"{job} {datetime.fromtimestamp(micros / 1_000_000, UTC).isoformat()}"


def every_second(
    found: list[Run], job: str, first: float, last: float
) -> tuple[list[float], list[float]]:
    """For ``job`` (every second, aligned to the epoch), the slots in [first, last] that no
    record shows started, and those started more than once."""
    counts = Counter(slot_time(r.slot) for r in found if r.job == job)
    lost, doubled = [], []
    for second in range(int(first) + 1, int(last) + 1):
        n = counts.get(float(second), 0)
        if n == 0:
            lost.append(float(second))
        elif n > 1:
            doubled.append(float(second))
    return lost, doubled


def idle_gaps(found: list[Run], job: str, since: float, until_: float) -> float:
    """The longest time in [since, until_] during which ``job`` had no run executing (a run
    executes from its start to its end or stop; one with neither runs on to ``until_``)."""
    spans = sorted(
        (r.start, r.stop if r.stop is not None else until_) for r in found if r.job == job
    )
    longest, covered = 0.0, since
    for start, stop in spans:
        if stop <= covered:
            continue
        if start > covered:
            longest = max(longest, min(start, until_) - covered)
        covered = max(covered, stop)
        if covered >= until_:
            break
    return max(longest, until_ - covered)


def unaccounted(
    found: list[Run], rows: list[Row], jobs: Iterable[str], first: float, last: float
) -> list[str]:
    """Slots of ``jobs`` (every second) in (first, last] that no record shows started and no
    row of the history accounts for (guarantee 2: none is lost silently)."""
    ran = {(r.job, slot_time(r.slot)) for r in found}
    missing = []
    for job in jobs:
        for second in range(int(first) + 1, int(last) + 1):
            if (job, float(second)) in ran or any(row.covers(job, second) for row in rows):
                continue
            missing.append(shown_key((job, second * 1_000_000)))
    return missing
