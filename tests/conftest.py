"""Fixtures shared by every test: the backends, fresh databases, and in-process services."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from slotcron.config import Settings
from slotcron.jobs.registry import Job
from slotcron.service.service import Service
from slotcron.store import migrate
from slotcron.store.database import Database
from slotcron.store.tables import executions
from sqlalchemy import func, select

from tests import backends
from tests.cluster.harness import Instance

CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def pytest_configure(config: pytest.Config) -> None:
    available = backends.probe_all()
    missing = [n for n in backends.NAMES if not available.ok[n]]
    if CI and missing:
        lines = [f"{n}: {available.why[n]}" for n in missing]
        raise pytest.UsageError(
            "CI=true and these database backends are unreachable: " + "; ".join(lines)
        )


class _LeftBehind(logging.Handler):
    """Collects, across the session, each loop a stop went on without
    (slotcron.lifeline.roles.stop_task):
    the test passes, and the summary says where the loop was stuck."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.found: list[str] = []
        self.test = ""

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "left_behind", None):
            self.found.append(f"{self.test}: {record.getMessage()}")


LEFT_BEHIND = _LeftBehind()
logging.getLogger("slotcron.roles").addHandler(LEFT_BEHIND)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logstart(nodeid: str, location: Any) -> None:
    LEFT_BEHIND.test = nodeid


def pytest_terminal_summary(terminalreporter: Any) -> None:
    found = [f for f in LEFT_BEHIND.found if "test_a_stop_goes_on_without" not in f]
    if found:
        terminalreporter.write_sep(
            "-", "loops a shutdown went on without (slotcron.lifeline.roles.stop_task)"
        )
        for line in found:
            terminalreporter.write_line(line)
    available = backends.AVAILABLE
    parts = []
    for name in backends.NAMES:
        if available.ok.get(name):
            parts.append(f"{name}: tested")
        else:
            parts.append(f"{name}: SKIPPED ({available.why.get(name, 'not probed')})")
    terminalreporter.write_sep("-", "database backends")
    for part in parts:
        terminalreporter.write_line(part)


@pytest.fixture(params=backends.NAMES)
def backend(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    if not backends.AVAILABLE.ok.get(name):
        pytest.skip(f"{name} unreachable: {backends.AVAILABLE.why.get(name)}")
    return name


@pytest.fixture
def empty_db_url(backend: str, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty database (no tables) of the parametrised backend."""
    url = backends.create_database(backend, tmp_path)
    yield url
    backends.drop_database(backend, url)


@pytest.fixture
async def db_url(empty_db_url: str) -> str:
    """A fresh database with the schema migrated to head."""
    db = Database.connect(Settings(database_url=empty_db_url).url, 2)
    try:
        await migrate.upgrade(db.engine, db.dialect)
    finally:
        await db.close()
    return empty_db_url


@pytest.fixture
async def db(db_url: str) -> AsyncIterator[Database]:
    database = Database.connect(Settings(database_url=db_url).url, 5)
    yield database
    await database.close()


def make_settings(url: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "database_url": url,
        "auto_migrate": True,
        "lease_seconds": 10,
        "heartbeat_seconds": 1,
        "shutdown_drain_timeout": 2,
        "shutdown_cancel_timeout": 2,
    }
    values.update(overrides)
    return Settings(**values)


ServiceFactory = Callable[..., Awaitable[Service]]


@pytest.fixture
async def start_service(db_url: str) -> AsyncIterator[ServiceFactory]:
    """Start in-process services on the test's database; all are shut down at teardown."""
    started: list[Service] = []

    async def start(jobs: Sequence[Job], clock: Any = None, **overrides: Any) -> Service:
        service = Service(make_settings(db_url, **overrides), jobs, clock=clock)
        await service.start()
        started.append(service)
        return service

    yield start
    for service in started:
        if service.state != "stopped":
            await service.stop()


async def wait_for(
    condition: Callable[[], Any], *, timeout: float = 10.0, interval: float = 0.02, what: str = ""
) -> Any:
    """Poll ``condition`` (sync or async) until truthy; fail with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or condition}")
        await asyncio.sleep(interval)


async def outcomes_written(db: Database) -> None:
    """Wait until no execution is RUNNING: a job has returned, and its outcome is recorded.
    A test moving the clock on before then races the write (a forbid job's next slot would
    find the lease still held)."""

    async def settled() -> bool:
        async with db.read() as conn:
            running = await conn.scalar(
                select(func.count()).select_from(executions).where(executions.c.status == "RUNNING")
            )
        return running == 0

    await wait_for(settled, what="every outcome written")


Spawn = Callable[..., Instance]


@pytest.fixture
def spawn(db_url: str, tmp_path: Path) -> Iterator[Spawn]:
    """Start real ``slotcron run`` processes on the test's database; killed at teardown."""
    started: list[Instance] = []

    def start(name: str, jobs: str, **env: Any) -> Instance:
        instance = Instance(
            name=name,
            db_url=db_url,
            jobs=jobs,
            record_path=tmp_path / "records.jsonl",
            log_path=tmp_path / f"{name}.log",
            env={k: str(v) for k, v in env.items()},
        ).start()
        started.append(instance)
        return instance

    yield start
    for instance in started:
        instance.kill()


@pytest.fixture
def records_path(tmp_path: Path) -> Path:
    return tmp_path / "records.jsonl"
