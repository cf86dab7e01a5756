"""Fixtures for tests on real PostgreSQL topologies the test makes itself (tests/pgcluster.py):
a fresh primary, a primary with a streaming standby, PgBouncer in front of a server.

Every test here is marked ``topology`` (leave them out of a quick run with -m 'not topology').
A missing tool skips the test with the reason, except under CI=true, where it fails.
After each test, whatever the test made and did not close is closed, and the test errors if
a process of its servers or PgBouncers is still running.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import pgcluster
from tests.conftest import CI
from tests.pgcluster import Pair, PgBouncer, PgServer, PoolMode

HERE = Path(__file__).resolve().parent
DATABASE = "slotcron"


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.topology)


def require(*tools: str) -> None:
    """Skip (under CI=true: fail) unless ``tools`` and, as root, the postgres OS user exist."""
    missing = pgcluster.missing_tools(*tools)
    if missing:
        message = "real PostgreSQL topologies need: " + ", ".join(missing)
        if CI:
            pytest.fail(f"CI=true and {message}")
        pytest.skip(message)


@pytest.fixture(scope="session", autouse=True)
def _stale_swept() -> None:
    """Remove what an earlier, killed run left (its clean-up never ran)."""
    pgcluster.sweep_stale()


@pytest.fixture(autouse=True)
def _nothing_left_behind() -> Iterator[None]:
    """Torn down after every other fixture of the test: closes what the test made and did not
    close, then fails the test if any process of its servers or PgBouncers still runs (each
    carries its temp dir's name on its command line) or a temp dir is still there."""
    before = {id(obj) for obj in pgcluster.live()}
    dirs_before = len(pgcluster.created_dirs())
    yield
    pgcluster.close_all([obj for obj in pgcluster.live() if id(obj) not in before])
    dirs = pgcluster.created_dirs()[dirs_before:]
    left = [proc for d in dirs for proc in pgcluster.processes_matching(d.name)]
    kept = [d for d in dirs if d.exists()]
    assert not left, f"processes of this test still running after its clean-up: {left}"
    assert not kept, f"temp dirs of this test still there after its clean-up: {kept}"


@pytest.fixture
def pg_primary() -> Iterator[PgServer]:
    """A fresh PostgreSQL server with an empty database ``slotcron``."""
    require("initdb", "postgres", "pg_ctl")
    with PgServer("primary") as server:
        server.create_database(DATABASE)
        yield server


def _pair(sync: bool) -> Iterator[Pair]:
    require("initdb", "postgres", "pg_ctl", "pg_basebackup")
    with PgServer("primary") as primary:
        primary.create_database(DATABASE)
        # Replication through a Switch (standby.link): a test can cut it to lose commits.
        with primary.standby(sync=sync, name="standby", link=True) as standby:
            yield Pair(primary, standby)


@pytest.fixture
def pg_pair_sync() -> Iterator[Pair]:
    """A primary (database ``slotcron``) and a synchronous standby (``pg_stat_replication``
    shows it ``sync``; a commit on the primary returns once the standby has flushed it),
    replicating through ``standby.link``."""
    yield from _pair(sync=True)


@pytest.fixture
def pg_pair_async() -> Iterator[Pair]:
    """A primary (database ``slotcron``) and an asynchronous standby streaming from it through
    ``standby.link``."""
    yield from _pair(sync=False)


PgBouncerFactory = Callable[..., PgBouncer]


@pytest.fixture
def pgbouncer_factory() -> Iterator[PgBouncerFactory]:
    """``make(server_or_host_port, mode='session', **options)``: PgBouncer in front of it (see
    ``PgBouncer``'s options); all stopped at teardown."""
    require("pgbouncer", "psql")
    made: list[PgBouncer] = []

    def make(
        target: PgServer | tuple[str, int], mode: PoolMode = "session", **options: Any
    ) -> PgBouncer:
        bouncer = PgBouncer(target, mode, **options)
        made.append(bouncer)
        return bouncer

    yield make
    pgcluster.close_all(made)
