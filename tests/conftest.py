"""Fixtures shared by every test: the backends, fresh databases, and in-process services."""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from slotcron.config import Settings
from slotcron.jobs.registry import Job
from slotcron.service.service import Service
from slotcron.store.database import Database
from slotcron.store.tables import executions
from sqlalchemy import func, select

from tests import backends, gc_pauses
from tests.cluster.harness import Instance
from tests.lanes import Lanes

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
gc_pauses.install()
FREEZE = os.environ.get("SLOTCRON_TEST_GC", "freeze") == "freeze"


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logstart(nodeid: str, location: Any) -> None:
    if FREEZE:
        gc_pauses.settle()
    LEFT_BEHIND.test = nodeid
    gc_pauses.entering(nodeid)


def pytest_sessionfinish(session: pytest.Session) -> None:
    backends.drop_templates()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    found = [f for f in LEFT_BEHIND.found if "test_a_stop_goes_on_without" not in f]
    if found:
        terminalreporter.write_sep(
            "-", "loops a shutdown went on without (slotcron.lifeline.roles.stop_task)"
        )
        for line in found:
            terminalreporter.write_line(line)
    long = gc_pauses.long_passes()
    if long:
        terminalreporter.write_sep(
            "-", f"garbage collector passes of {gc_pauses.LONG * 1000:.0f} ms or more"
        )
        for line in long[:20]:
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


HERE = Path(__file__).resolve().parent
DATABASE_FIXTURES = frozenset(
    {"backend", "db", "db_url", "empty_db_url", "services", "start_service", "spawn"}
)
# Top-level test files that start processes of their own (the console script, a JVM, promtool).
PROCESS_FILES = frozenset(
    {"test_deploy.py", "test_springcron_java.py", "test_tracing.py"}
    | {p.name for p in HERE.glob("test_cli*.py")}
)
FOLDER_MARKS = {"cluster": "cluster", "packaging": "packaging", "topology": "topology"}


_RUN = os.environ.get("PYTEST_XDIST_TESTRUNUID")
"""Shared by the worker processes of one run (pytest-xdist), None without workers."""
LANES = None if _RUN is None else Lanes(Path(tempfile.gettempdir()) / f"slotcron-tests-{_RUN}")


@pytest.hookimpl(hookwrapper=True, tryfirst=True)  # outside pytest-timeout's bound
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """An ``alone`` test runs while no ordinary test does, an ``apart`` one beside the ``alone``
    ones only (tests/lanes.py); the ordinary tests share the time between."""
    if LANES is None:
        yield
        return
    kind = _kind(item)
    LANES.enter(kind)
    try:
        yield
    finally:
        LANES.leave(kind, None if nextitem is None else _kind(nextitem))


def _kind(item: pytest.Item) -> str | None:
    for kind in ("alone", "apart"):
        if item.get_closest_marker(kind) is not None:
            return kind
    return None


def pytest_itemcollected(item: pytest.Item) -> None:
    """``alone`` for a load test or a page driven in a real browser; the groups of tests that
    go to one worker together (``--dist loadgroup``): the ``alone`` tests, one after another,
    holding the machine from one to the next; the ``apart`` tests, beside them on a second
    worker (tests/lanes.py); the packaging tests, which build in the source tree (two at once
    collide there). Set as each test is collected, before any plugin reads the
    groups (pytest-xdist names them in its own pass over the collection)."""
    if item.get_closest_marker("load") is not None or "chromium_path" in getattr(
        item, "fixturenames", ()
    ):
        item.add_marker(pytest.mark.alone)
    kind = _kind(item)
    if kind is not None:
        item.add_marker(pytest.mark.xdist_group(kind))
    elif _place(item)[1] == "packaging":
        item.add_marker(pytest.mark.xdist_group("packaging"))


def _place(item: pytest.Item) -> tuple[Path, str]:
    """Where a test lives: its file, and its folder under ``tests/`` ("" at the top)."""
    path = Path(item.path).resolve()
    return path, path.parent.name if path.parent != HERE else ""


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks by where a test lives and what it needs (README, "Running the tests"):
    ``cluster``, ``topology``, ``packaging`` by folder; ``unit`` for a test that needs no
    database and starts no process; ``quick`` for those and every in-process test on SQLite
    (python -m pytest -m quick -n 4); ``timeout`` longer for clusters and topologies."""
    for item in items:
        path, folder = _place(item)
        mark = FOLDER_MARKS.get(folder)
        if mark:
            item.add_marker(getattr(pytest.mark, mark))
            item.add_marker(pytest.mark.timeout(600))
            continue
        fixtures = set(getattr(item, "fixturenames", ()))
        if not folder and path.name not in PROCESS_FILES and not DATABASE_FIXTURES & fixtures:
            item.add_marker(pytest.mark.unit)
            item.add_marker(pytest.mark.quick)
        elif path.name not in PROCESS_FILES and _backend(item) in (None, "sqlite"):
            item.add_marker(pytest.mark.quick)
    items.sort(key=_order)  # stable: in file order within each rank


def _order(item: pytest.Item) -> int:
    """Where a test comes in the run: the ``alone`` and ``apart`` tests first (while the
    workers wait for them anyway), then the longest kinds first so that none starts last and
    keeps the run waiting for it: whole clusters and topologies (10-60 s), tests that start
    processes, the rest. The README's command (``--dist loadgroup``, in pyproject.toml) gives
    the ``alone`` tests to one worker together, the ``apart`` ones to another, and hands the
    others out one at a time, in this order."""
    if _kind(item) is not None:
        return 0
    path, folder = _place(item)
    if folder in FOLDER_MARKS or "spawn" in getattr(item, "fixturenames", ()):
        return 1
    return 2 if path.name in PROCESS_FILES else 3


def _backend(item: pytest.Item) -> str | None:
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("backend") if callspec is not None else None


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
def db_url(backend: str, tmp_path: Path) -> Iterator[str]:
    """A fresh database with the schema at head: a copy of a template migrated once per
    backend per test process (tests/backends.py)."""
    url = backends.migrated_database(backend, tmp_path)
    yield url
    backends.drop_database(backend, url)


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


class Services:
    """The one way tests start in-process instances: ``Service`` on the test's database with
    the test settings (:func:`make_settings`); every instance made is stopped at teardown."""

    def __init__(self, db_url: str) -> None:
        self.db_url = db_url
        self.made: list[Service] = []
        self.started: list[Service] = []

    def make(
        self,
        jobs: Sequence[Job] = (),
        clock: Any = None,
        *,
        tasks: Sequence[Job] | None = None,
        hooks: Sequence[Any] = (),
        url: str | None = None,
        **overrides: Any,
    ) -> Service:
        """An instance not yet started (a test that starts it itself, or wants it to fail)."""
        settings = make_settings(url or self.db_url, **overrides)
        service = Service(settings, list(jobs), clock=clock, tasks=tasks, hooks=hooks)
        self.made.append(service)
        return service

    async def start(self, jobs: Sequence[Job] = (), clock: Any = None, **kw: Any) -> Service:
        service = self.make(jobs, clock, **kw)
        self.started.append(service)
        await service.start()
        return service

    async def stop_all(self) -> None:
        """Stop every instance started here, and any made here that its test left running."""
        for service in self.made:
            if service.state == "stopped":
                continue
            if service in self.started or service.state in ("running", "draining"):
                await service.stop()


@pytest.fixture
async def services(db_url: str) -> AsyncIterator[Services]:
    """In-process instances on the test's database (:class:`Services`)."""
    made = Services(db_url)
    yield made
    await made.stop_all()


@pytest.fixture
async def start_service(services: Services) -> ServiceFactory:
    """Start an in-process instance: ``await start_service(jobs, clock, tasks=..., **settings)``."""
    return services.start


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


async def outcomes_written(db: Database, job: str | None = None) -> None:
    """Wait until no execution (of ``job``, when given) is RUNNING: a job has returned, and its
    outcome is recorded. A test moving the clock on before then races the write (a forbid job's
    next slot would find the lease still held)."""
    running = [executions.c.status == "RUNNING"]
    if job is not None:
        running.append(executions.c.job_name == job)

    async def settled() -> bool:
        async with db.read() as conn:
            count = await conn.scalar(select(func.count()).select_from(executions).where(*running))
        return count == 0

    await wait_for(settled, what=f"every outcome{'' if job is None else ' of ' + job} written")


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
