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

from sqlalchemy import select

from app.store.database import Database
from app.store.tables import LEADER_ROW, executions, leader

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
            [sys.executable, "-m", "app", "run", "--jobs", self.jobs],
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
