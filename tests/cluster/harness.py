"""Real ``slotcron run`` processes on one database, and what their jobs recorded.

Jobs used here append one JSON line per event to the file named by SLOTCRON_TEST_RECORD:
a record the scheduler does not control, so assertions do not rest on our own tables.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from slotcron.store.database import Database
from slotcron.store.tables import LEADER_ROW, executions, leader
from sqlalchemy import select

ROOT = Path(__file__).resolve().parents[2]


def record(event: str, **values: Any) -> None:
    """Called by test jobs: append one event atomically (O_APPEND, one small write)."""
    line = json.dumps({"event": event, "pid": os.getpid(), "wall": time.time(), **values}) + "\n"
    fd = os.open(os.environ["SLOTCRON_TEST_RECORD"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def read_records(path: Path) -> list[dict[str, Any]]:
    """The complete lines: one being appended as we read has no newline yet and waits."""
    if not path.exists():
        return []
    complete, _, _ = path.read_text().rpartition("\n")
    return [json.loads(line) for line in complete.splitlines() if line.strip()]


def wait_until(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


@dataclass
class Instance:
    """One ``slotcron run`` process."""

    name: str
    db_url: str
    jobs: str
    record_path: Path
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> Instance:
        env = {k: v for k, v in os.environ.items() if not k.upper().startswith("SCHEDULER_")}
        env.update(
            {
                "SCHEDULER_DATABASE_URL": self.db_url,
                "SCHEDULER_INSTANCE_ID": self.name,
                "SCHEDULER_AUTO_MIGRATE": "true",
                "SCHEDULER_LOG_LEVEL": "INFO",
                "SLOTCRON_TEST_RECORD": str(self.record_path),
                "PYTHONPATH": str(ROOT),
            }
        )
        env.update(self.env)
        self._log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "slotcron", "run", "--jobs", self.jobs],
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        return self

    def signal(self, sig: int = signal.SIGTERM) -> None:
        assert self.process is not None
        self.process.send_signal(sig)

    def wait(self, timeout: float) -> int:
        assert self.process is not None
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"{self.name} did not exit within {timeout} s; log:\n{self.log()}"
            ) from None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def full_log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        if hasattr(self, "_log"):
            self._log.close()


def percentile(values: list[float], q: float) -> float:
    """The ``q``-quantile (0..1) of ``values``, nearest rank."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def slot_time(iso: str) -> float:
    """A slot as the jobs record it (ISO-8601 UTC) in epoch seconds."""
    return datetime.fromisoformat(iso).timestamp()


async def execution_rows(db: Database) -> list[Any]:
    """Every row of scheduler_executions."""
    async with db.read() as conn:
        return list((await conn.execute(select(executions).order_by(executions.c.id))).all())


async def leader_row(db: Database) -> Any:
    """The leadership lease: ``instance_id``, ``lease_until``, ``since``."""
    async with db.read() as conn:
        return (await conn.execute(select(leader).where(leader.c.name == LEADER_ROW))).one()


@dataclass(frozen=True)
class Run:
    """One run as its job recorded it (start, and its end or stop), in real time."""

    id: int
    job: str
    slot: str
    attempt: int
    trigger: str
    instance: str
    pid: int
    token: Any
    start: float
    stop: float | None
    """When the body ended or stopped; None if it had not by the end of the records."""
    finished: bool
    """The body ran to its end."""
    lease_lost: bool | None
    """At a stop: whether ``ctx.lease_lost`` was set (None: no stop, or no ``lease_lost``)."""


def runs(
    records: list[dict[str, Any]], real: Callable[[dict[str, Any]], float] | None = None
) -> list[Run]:
    """The runs in ``records`` (by start time). ``real`` gives a record's real time (default: its
    ``wall``; a process with a faked wall clock records ``mono``, see :func:`mono_to_real`)."""
    when = real or (lambda r: float(r["wall"]))
    ends = {(r["pid"], r["id"]): r for r in records if r["event"] in ("end", "stop") and "id" in r}
    found = []
    for r in records:
        if r["event"] != "start":
            continue
        end = ends.get((r["pid"], r["id"]))
        found.append(
            Run(
                id=r["id"],
                job=r["job"],
                slot=r["slot"],
                attempt=r.get("attempt", 1),
                trigger=r.get("trigger", ""),
                instance=r["instance"],
                pid=r["pid"],
                token=r.get("token"),
                start=when(r),
                stop=when(end) if end else None,
                finished=end is not None and end["event"] == "end",
                lease_lost=end.get("lease_lost") if end else None,
            )
        )
    return sorted(found, key=lambda run: run.start)


def mono_to_real() -> Callable[[dict[str, Any]], float]:
    """A record's real time from its ``mono`` (CLOCK_MONOTONIC is one clock for the whole
    machine), by this process's own, unfaked, offset between the two clocks."""
    offset = time.time() - time.monotonic()
    return lambda r: float(r["mono"]) + offset


Window = tuple[float, float]


def _minus(interval: Window, holes: list[Window]) -> list[Window]:
    pieces = [interval]
    for h0, h1 in holes:
        cut = []
        for a, b in pieces:
            if h1 <= a or h0 >= b:
                cut.append((a, b))
                continue
            if a < h0:
                cut.append((a, h0))
            if h1 < b:
                cut.append((h1, b))
        pieces = cut
    return pieces


def together(intervals: list[Window]) -> float:
    """Seconds during which at least two of ``intervals`` hold at once."""
    edges = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])
    total, depth, since = 0.0, 0, 0.0
    for at, step in edges:
        if depth >= 2:
            total += at - since
        depth += step
        since = at
    return total


def overlaps(
    found: list[Run],
    key: Callable[[Run], Any] = lambda run: run.job,
    *,
    until: float,
    paused: dict[str, list[Window]] | None = None,
) -> dict[Any, float]:
    """Per ``key`` (default: the job), the seconds during which two of its runs executed
    together. A run executes from its start to its end or stop (``until`` if neither was
    recorded), except while its process was stopped (``paused``: SIGSTOP to SIGCONT, per
    instance): a stopped process does nothing."""
    per: dict[Any, list[Window]] = {}
    for run in found:
        holes = (paused or {}).get(run.instance, [])
        end = run.stop if run.stop is not None else until
        per.setdefault(key(run), []).extend(_minus((run.start, max(run.start, end)), holes))
    return {k: together(v) for k, v in per.items()}


def slots_run_twice(found: list[Run]) -> dict[tuple[str, str], int]:
    """Slots whose body ran to its end more than once, with how many times."""
    counts: dict[tuple[str, str], int] = {}
    for run in found:
        if run.finished:
            counts[(run.job, run.slot)] = counts.get((run.job, run.slot), 0) + 1
    return {k: n for k, n in counts.items() if n > 1}


def early_starts(found: list[Run], tolerance: float) -> list[tuple[Run, float]]:
    """Runs that really started more than ``tolerance`` seconds before their slot, and by how
    much."""
    early = []
    for run in found:
        ahead = slot_time(run.slot) - run.start
        if ahead > tolerance:
            early.append((run, ahead))
    return early
