"""``async with slotcron.Scheduler(...)`` inside a test application: it runs the jobs (judged by
their own records), drains a run in flight on leaving, leaves the process's signal handlers,
garbage collector and logging as they were, fails fast on an unreachable database, and serves
HTTP only when asked; the FastAPI lifespan example of docs/how-to/embedding.md runs as written."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import re
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from slotcron import DatabaseUnreachable, Hook, RunEvent, Scheduler, SlotcronError
from slotcron.errors import ConfigError
from slotcron.jobs.registry import REGISTRY
from slotcron.store.database import Database
from slotcron.store.dialects.base import CONNECT_TIMEOUT
from slotcron.store.tables import executions
from sqlalchemy import select

from tests.conftest import wait_for

EMBEDDING_PAGE = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "embedding.md"

FAST: dict[str, Any] = {
    "auto_migrate": True,
    "lease_seconds": 10,
    "heartbeat_seconds": 1,
    "shutdown_drain_timeout": 10,
    "shutdown_cancel_timeout": 2,
}
"""Settings of every embedded scheduler here, besides its database."""

JOBS = """
import asyncio
import json
from pathlib import Path

from slotcron import JobContext, every

RECORDS = Path({records!r})


def record(ctx: JobContext, event: str) -> None:
    line = {{"job": ctx.job, "slot": ctx.scheduled_at.isoformat(), "event": event}}
    with RECORDS.open("a") as out:
        out.write(json.dumps(line) + "\\n")


@every(seconds=1, name={prefix!r} + "tick")
async def tick(ctx: JobContext) -> None:
    record(ctx, "ran")


@every(seconds=1, name={prefix!r} + "slow", enabled={slow!r})
async def slow(ctx: JobContext) -> None:
    record(ctx, "started")
    await asyncio.sleep({slow_seconds!r})
    record(ctx, "finished")
"""


class App:
    """A test application's job module, its records, and a clean registry afterwards."""

    def __init__(self, root: Path, name: str) -> None:
        self.root = root
        self.module = name
        self.records = root / f"{name}.jsonl"

    def write_jobs(self, *, slow: bool = False, slow_seconds: float = 1.5) -> str:
        text = JOBS.format(
            records=str(self.records),
            prefix=f"{self.module}.",
            slow=slow,
            slow_seconds=slow_seconds,
        )
        (self.root / f"{self.module}.py").write_text(text)
        return self.module

    def read(self) -> list[dict[str, str]]:
        if not self.records.exists():
            return []
        return [json.loads(line) for line in self.records.read_text().splitlines()]


@pytest.fixture
def app(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[App]:
    """Job modules importable from ``tmp_path``; whatever they registered in the process-wide
    registry (which an embedded scheduler runs) is taken out again afterwards."""
    name = re.sub(r"\W", "_", f"embedded_{request.node.name}")
    sys.path.insert(0, str(tmp_path))
    saved_jobs, saved_tasks = dict(REGISTRY._jobs), dict(REGISTRY._tasks)
    try:
        yield App(tmp_path, name)
    finally:
        sys.path.remove(str(tmp_path))
        for module in [m for m in sys.modules if m == name or m.split(".")[0] == "myapp"]:
            del sys.modules[module]
        REGISTRY._jobs.clear()
        REGISTRY._jobs.update(saved_jobs)
        REGISTRY._tasks.clear()
        REGISTRY._tasks.update(saved_tasks)


def slots(records: list[dict[str, str]], event: str) -> set[str]:
    return {r["slot"] for r in records if r["event"] == event}


async def statuses(db: Database, job: str) -> dict[str, str]:
    async with db.read() as conn:
        rows = await conn.execute(
            select(executions.c.scheduled_at, executions.c.status).where(
                executions.c.job_name == job
            )
        )
        return {_iso(at): status for at, status in rows}


def _iso(at: datetime) -> str:
    return (at if at.tzinfo else at.replace(tzinfo=UTC)).isoformat()


async def test_it_runs_the_jobs_of_the_modules_it_is_given(
    app: App, db_url: str, db: Database
) -> None:
    module = app.write_jobs()
    async with asyncio.timeout(60), Scheduler(jobs=[module], database_url=db_url, **FAST):
        await wait_for(lambda: len(slots(app.read(), "ran")) >= 2, what="two slots run")
    ran = slots(app.read(), "ran")
    recorded = await statuses(db, f"{module}.tick")
    assert {recorded.get(slot) for slot in ran} == {"COMPLETED"}, (ran, recorded)


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"], indirect=True)
async def test_leaving_drains_the_run_in_flight(app: App, db_url: str, db: Database) -> None:
    module = app.write_jobs(slow=True, slow_seconds=1.5)
    async with asyncio.timeout(60):
        async with Scheduler(jobs=[module], database_url=db_url, **FAST):
            await wait_for(lambda: slots(app.read(), "started"), what="a slow run to start")
            in_flight = slots(app.read(), "started") - slots(app.read(), "finished")
            assert in_flight, "the run should still be in flight when the application leaves"
    # Leaving returned once the run had finished, not cancelled: its body wrote its last line,
    # and its outcome was recorded before the database was closed.
    assert in_flight <= slots(app.read(), "finished")
    recorded = await statuses(db, f"{module}.slow")
    assert {recorded[slot] for slot in in_flight} == {"COMPLETED"}, recorded


def _process_state() -> dict[str, Any]:
    """What an embedded scheduler must leave as it found it."""
    root = logging.getLogger()
    ours = logging.getLogger("slotcron")
    loop = asyncio.get_running_loop()
    return {
        "signals": {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)},
        "loop signal handlers": dict(getattr(loop, "_signal_handlers", {})),
        "gc thresholds": gc.get_threshold(),
        "gc enabled": gc.isenabled(),
        "root handlers": list(root.handlers),
        "root level": root.level,
        "slotcron handlers": list(ours.handlers),
        "slotcron level": ours.level,
        "slotcron propagates": ours.propagate,
    }


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_it_leaves_signals_gc_and_logging_as_they_were(
    app: App, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    module = app.write_jobs()
    caplog.set_level(logging.INFO, logger="slotcron")  # before the snapshot: caplog's change
    before, frozen = _process_state(), gc.get_freeze_count()
    async with asyncio.timeout(60), Scheduler(jobs=[module], database_url=db_url, **FAST):
        await wait_for(lambda: slots(app.read(), "ran"), what="a slot run")
        during, frozen_during = _process_state(), gc.get_freeze_count()
        running = [r for r in caplog.records if r.name.startswith("slotcron")]
    after = _process_state()
    assert during == before
    assert after == before
    # Nothing frozen: a freeze moves every object tracked into the permanent generation (the
    # count would jump by hundreds of thousands); the suite's own freeze between tests lets the
    # count fall as frozen objects die.
    assert frozen_during <= frozen and gc.get_freeze_count() <= frozen
    # It logs to the slotcron.* loggers, for the application to route.
    assert any("running" in r.getMessage() for r in running), [r.getMessage() for r in running]


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("scheme", ["postgresql+asyncpg", "mysql+aiomysql"])
async def test_an_unreachable_database_fails_entering_within_the_connect_timeout(
    scheme: str,
) -> None:
    port = _closed_port()
    scheduler = Scheduler(
        database_url=f"{scheme}://slotcron:s3cret-pw@127.0.0.1:{port}/none", **FAST
    )
    began = time.monotonic()
    with pytest.raises(DatabaseUnreachable) as failed:
        async with asyncio.timeout(CONNECT_TIMEOUT + 5), scheduler:
            pytest.fail("entered without a database")
    assert time.monotonic() - began < CONNECT_TIMEOUT
    assert isinstance(failed.value, SlotcronError)
    message = str(failed.value)
    assert f"127.0.0.1:{port}" in message, message
    assert "s3cret-pw" not in message + repr(failed.value)


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_it_serves_http_only_when_given_a_port(
    app: App, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = app.write_jobs()
    port = _closed_port()
    monkeypatch.setenv("SCHEDULER_HTTP_PORT", str(port))  # the service's: not the application's
    async with asyncio.timeout(60):
        async with Scheduler(jobs=[module], database_url=db_url, **FAST) as quiet:
            assert quiet.service.http is None
            with pytest.raises(OSError):
                await asyncio.open_connection("127.0.0.1", port)
        async with Scheduler(jobs=[module], database_url=db_url, http_port=0, **FAST) as served:
            assert served.service.http is not None
            url = served.service.http.url
            async with aiohttp.ClientSession() as client, client.get(f"{url}/healthz") as answer:
                assert answer.status == 200
                assert (await answer.json())["state"] == "running"


class _Finished(Hook):
    def __init__(self) -> None:
        self.runs: list[RunEvent] = []

    async def run_finished(self, run: RunEvent) -> None:
        self.runs.append(run)


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_the_hooks_it_is_given_hear_of_its_runs(app: App, db_url: str) -> None:
    module = app.write_jobs()
    hook = _Finished()
    async with (
        asyncio.timeout(60),
        Scheduler(jobs=[module], hooks=[hook], database_url=db_url, **FAST),
    ):
        await wait_for(lambda: hook.runs, what="a run_finished event")
    ran = slots(app.read(), "ran")
    heard = {run.scheduled_at.isoformat() for run in hook.runs if run.status == "COMPLETED"}
    assert heard and heard <= ran, (heard, ran)


HOOK_MODULE = """
from slotcron import Hook, RunEvent


class Finished(Hook):
    def __init__(self) -> None:
        self.runs: list[RunEvent] = []

    async def run_finished(self, run: RunEvent) -> None:
        self.runs.append(run)


heard = Finished()
"""


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_a_hook_named_in_the_environment_and_one_given_each_hear_every_run_once(
    app: App, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = app.write_jobs()
    (app.root / f"{module}_hooks.py").write_text(HOOK_MODULE)
    monkeypatch.setenv("SCHEDULER_HOOKS", f"{module}_hooks:heard")
    given = _Finished()
    async with (
        asyncio.timeout(60),
        Scheduler(jobs=[module], hooks=[given], database_url=db_url, **FAST),
    ):
        named = sys.modules[f"{module}_hooks"].heard
        await wait_for(lambda: len(given.runs) >= 2, what="two run_finished events")
    for hook in (given, named):
        ids = [run.execution_id for run in hook.runs]
        assert ids and len(ids) == len(set(ids)), ids  # each run heard once, by each hook
    assert {r.execution_id for r in named.runs} == {r.execution_id for r in given.runs}
    sys.modules.pop(f"{module}_hooks", None)


def test_a_misspelt_setting_or_a_bad_value_is_a_configuration_error_naming_it() -> None:
    with pytest.raises(ConfigError) as misspelt:
        Scheduler(databse_url="sqlite+aiosqlite:///x.db")
    assert misspelt.value.variable == "databse_url"
    with pytest.raises(ConfigError) as bad:
        Scheduler(max_concurrency=0)
    assert bad.value.variable == "max_concurrency"


def _embedding_example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", EMBEDDING_PAGE.read_text(), flags=re.S)
    return str(next(block for block in blocks if "lifespan" in block))


def _myapp(root: Path, app: App) -> None:
    """The embedding page's ``myapp.jobs``: one job recording its runs."""
    package = root / "myapp"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "jobs.py").write_text(
        JOBS.format(records=str(app.records), prefix="myapp.", slow=False, slow_seconds=0)
    )


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"], indirect=True)
async def test_the_documented_fastapi_lifespan_example_runs_as_written(
    app: App, db_url: str, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    _myapp(app.root, app)
    monkeypatch.setenv("DATABASE_URL", db_url)
    namespace: dict[str, Any] = {}
    exec(compile(_embedding_example(), str(EMBEDDING_PAGE), "exec"), namespace)
    fastapi_app = namespace["app"]
    lifespan: Callable[[Any], Any] = fastapi_app.router.lifespan_context
    async with asyncio.timeout(60), lifespan(fastapi_app):
        await wait_for(lambda: slots(app.read(), "ran"), what="myapp.jobs to run")
    ran = slots(app.read(), "ran")
    recorded = await statuses(db, "myapp.tick")
    assert {recorded.get(slot) for slot in ran} == {"COMPLETED"}, (ran, recorded)
