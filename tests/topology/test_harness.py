"""The topology harness itself (tests/pgcluster.py): what a test built on it relies on.

Every wait in the harness has a deadline, so each test here is bounded (a few seconds each).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import asyncpg
import pytest

from tests import pgcluster
from tests.pgcluster import Pair, PgServer, Switch
from tests.topology.conftest import DATABASE, PgBouncerFactory, require

TABLE = "CREATE TABLE marks (id int PRIMARY KEY)"


def marks(server: PgServer) -> list[int]:
    return [row[0] for row in server.fetch("SELECT id FROM marks ORDER BY id", database=DATABASE)]


def test_a_sync_standby_has_every_acknowledged_commit(pg_pair_sync: Pair) -> None:
    primary, standby = pg_pair_sync
    assert primary.fetch("SELECT sync_state FROM pg_stat_replication") == [("sync",)]
    primary.execute(TABLE, database=DATABASE)
    # remote_apply: the commit returns once the standby has replayed it, so it is visible there.
    primary.execute(
        "BEGIN; SET LOCAL synchronous_commit = remote_apply; INSERT INTO marks VALUES (1); COMMIT",
        database=DATABASE,
    )
    assert marks(standby) == [1]
    # on (the harness's setting): the commit returns once the standby has flushed it; the
    # primary crashing right after, the promoted standby has it.
    primary.execute("INSERT INTO marks VALUES (2)", database=DATABASE)
    primary.stop("immediate")
    assert not primary.is_running()
    standby.promote()
    assert not standby.in_recovery()
    assert marks(standby) == [1, 2]
    standby.execute("INSERT INTO marks VALUES (3)", database=DATABASE)
    assert marks(standby) == [1, 2, 3]


def test_paused_replay_alone_loses_nothing(pg_pair_async: Pair) -> None:
    """PostgreSQL 15: a standby with replay paused still receives and flushes WAL, and a
    promotion ends the pause and replays everything received before it finishes. So pausing
    replay does not make a lossy failover; cutting the link does (next test)."""
    primary, standby = pg_pair_async
    primary.execute(TABLE, database=DATABASE)
    standby.wait_for_lsn(primary.current_lsn())
    standby.pause_replay()
    primary.execute("INSERT INTO marks VALUES (1)", database=DATABASE)
    standby.wait_for_lsn(primary.current_lsn(), replayed=False)  # received, flushed
    assert marks(standby) == []  # not replayed
    primary.stop("immediate")
    standby.promote()
    assert marks(standby) == [1]


def test_a_cut_replication_link_makes_a_lossy_failover(pg_pair_async: Pair) -> None:
    """The reliable way to lose an acknowledged commit: cut the standby's replication link (a
    Switch: once cut() returns, no byte reaches the standby and its reconnections are reset),
    commit on the primary (asynchronous: acknowledged at once), crash the primary, promote."""
    primary, standby = pg_pair_async
    assert standby.link is not None
    primary.execute(TABLE, database=DATABASE)
    primary.execute("INSERT INTO marks VALUES (1)", database=DATABASE)
    standby.wait_for_lsn(primary.current_lsn())
    standby.link.cut()
    primary.execute("INSERT INTO marks VALUES (2)", database=DATABASE)  # acknowledged
    assert marks(primary) == [1, 2]
    primary.stop("immediate")
    standby.promote()
    assert marks(standby) == [1]  # the acknowledged commit is gone
    standby.execute("INSERT INTO marks VALUES (2)", database=DATABASE)
    assert marks(standby) == [1, 2]


@pytest.mark.parametrize("mode", ["session", "transaction"])
async def test_pgbouncer(
    mode: str, pg_primary: PgServer, pgbouncer_factory: PgBouncerFactory
) -> None:
    bouncer = pgbouncer_factory(pg_primary, mode)
    options = {"statement_cache_size": 0} if mode == "transaction" else {}
    # What the application sends in its start-up packet (application_name) is accepted...
    conns = [
        await asyncpg.connect(
            **bouncer.connect_kwargs(DATABASE),
            server_settings={"application_name": "slotcron"},
            **options,
        )
        for _ in range(3)
    ]
    try:
        for conn in conns:
            assert await conn.fetchval("SELECT 1") == 1
        servers = await asyncio.to_thread(bouncer.server_connections, DATABASE)
        # Session mode: a server connection per client; transaction mode: one, shared by
        # clients taking turns.
        assert servers == (3 if mode == "session" else 1), bouncer.pools()
        rows = await asyncio.to_thread(bouncer.servers)
        assert len([r for r in rows if r["database"] == DATABASE]) == servers
    finally:
        for conn in conns:
            await conn.close()
    # ...anything else is refused: no ignore_startup_parameters by default.
    with pytest.raises(asyncpg.PostgresError, match="unsupported startup parameter"):
        await asyncpg.connect(
            **bouncer.connect_kwargs(DATABASE), server_settings={"jit": "off"}, **options
        )


async def test_a_switch_moves_new_connections(pg_primary: PgServer) -> None:
    with PgServer("other") as other, Switch(pg_primary.port) as switch:
        kwargs = {**pg_primary.connect_kwargs(), "port": switch.port}
        before = await asyncpg.connect(**kwargs)
        try:
            assert await before.fetchval("SELECT inet_server_port()") == pg_primary.port
            switch.switch_to(other.port)
            # The open connection is reset, as by a moved virtual IP.
            with pytest.raises((asyncpg.PostgresConnectionError, ConnectionError, OSError)):
                await before.fetchval("SELECT 1")
        finally:
            before.terminate()
        after = await asyncpg.connect(**kwargs)
        try:
            assert await after.fetchval("SELECT inet_server_port()") == other.port
        finally:
            await after.close()
        # It forwards for blocking code and subprocesses too, the event loop blocked meanwhile.
        assert other.fetchval("SELECT 1") == 1
        assert _psql_port(switch.port, timeout=10) == other.port


def _psql_port(port: int, timeout: float) -> int:
    argv = [_psql(), "-X", "-At", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres"]
    out = subprocess.run(
        [*argv, "-d", "postgres", "-c", "SELECT inet_server_port()"],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=True,
    ).stdout
    return int(out.strip())


def _psql() -> str:
    path = pgcluster.tool("psql")
    assert path is not None
    return path


def test_a_frozen_switch_holds_bytes_and_thaw_delivers_them(pg_primary: PgServer) -> None:
    require("psql")
    with Switch(pg_primary.port) as switch:
        switch.freeze()
        argv = [_psql(), "-X", "-At", "-h", "127.0.0.1", "-p", str(switch.port), "-U", "postgres"]
        query = subprocess.Popen(
            [*argv, "-d", "postgres", "-c", "SELECT 42"], stdout=subprocess.PIPE, text=True
        )
        try:
            time.sleep(0.5)
            assert query.poll() is None  # held
            switch.thaw()
            out, _ = query.communicate(timeout=10)
        finally:
            query.kill()
            query.wait()
        assert out.strip() == "42"
        switch.cut()
        with pytest.raises(subprocess.CalledProcessError):
            _psql_port(switch.port, timeout=10)
        switch.restore()
        assert _psql_port(switch.port, timeout=10) == pg_primary.port


def test_close_leaves_nothing_even_when_stuck_or_failing(
    pgbouncer_factory: PgBouncerFactory,
) -> None:
    """Closing (here: leaving the with blocks by an exception) ends every process of the
    servers, their link and PgBouncer, even SIGSTOPped ones, and deletes the temp dirs."""
    require("initdb", "postgres", "pg_ctl", "pg_basebackup")
    made: list[Path] = []
    refs: list[pgcluster.ProcessRef] = []
    with (
        pytest.raises(RuntimeError, match="the test failed"),
        PgServer() as primary,
        primary.standby(sync=True, link=True) as standby,
    ):
        bouncer = pgbouncer_factory(primary, "session")
        made += [primary.dir, standby.dir, bouncer.dir]
        primary.execute("SELECT 1")
        refs += primary.pids() + standby.pids() + bouncer.pids()
        assert len(primary.pids()) > 3  # the postmaster and its children
        for ref in primary.pids():  # a hung server: close must wake it to stop it
            os.kill(ref.pid, signal.SIGSTOP)
        bouncer.close()
        raise RuntimeError("the test failed")
    assert refs
    assert [ref for ref in refs if pgcluster.is_alive(ref)] == []
    for path in made:
        assert not path.exists()
        assert pgcluster.processes_matching(path.name) == []
        if shutil.which("pgrep"):
            found = subprocess.run(["pgrep", "-af", path.name], capture_output=True, text=True)
            assert found.stdout == "", found.stdout
    assert not [obj for obj in pgcluster.live() if isinstance(obj, PgServer | Switch)]
