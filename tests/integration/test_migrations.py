"""The Alembic history, driven through the real ``slotcron`` command on every backend.

Each test gets a fresh, empty database of its backend (``empty_db_url``) and migrates it the
way an operator would: ``slotcron migrate`` in a subprocess with ``SCHEDULER_DATABASE_URL``.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from slotcron.store.database import Database
from slotcron.store.migrate import HEAD, head_revision
from slotcron.store.tables import executions, jobs, metadata
from sqlalchemy import Table, func, insert, inspect, select, text
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.exc import IntegrityError

from tests.cli import Cli, one_line

T = TypeVar("T")

TABLES = {"scheduler_jobs", "scheduler_executions", "scheduler_instances"}
CONTRACT_COLUMNS = {
    "scheduler_jobs": {"name", "schedule", "options", "paused"},
    "scheduler_executions": {
        "id",
        "job_name",
        "scheduled_at",
        "trigger",
        "status",
        "attempt",
        "instance_id",
        "started_at",
        "heartbeat_at",
        "lease_until",
        "finished_at",
        "error",
        "params",
        "state",
    },
    "scheduler_instances": {
        "instance_id",
        "host",
        "pid",
        "version",
        "started_at",
        "heartbeat_at",
        "state",
    },
}
SLOT = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
KEPT_JOB = {
    "name": "kept",
    "kind": "cron",
    "schedule": "* * * * *",
    "timezone": "UTC",
    "options": {},
    "paused": False,
    "registered_at": SLOT,
    "updated_at": SLOT,
}


def migrate(url: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return Cli(cwd, url).ok("migrate")


def on_database(url: str, work: Callable[[Connection], T]) -> T:
    """Run ``work`` on a sync view of one connection to ``url``, in one committed transaction."""

    async def go() -> T:
        db = Database.connect(make_url(url), 1)
        try:
            async with db.engine.begin() as conn:
                return await conn.run_sync(work)
        finally:
            await db.close()

    return asyncio.run(go())


def table_names(url: str) -> set[str]:
    return set(on_database(url, lambda conn: inspect(conn).get_table_names()))


def revision(url: str) -> list[str]:
    query = text("SELECT version_num FROM alembic_version")
    return on_database(url, lambda conn: list(conn.execute(query).scalars()))


def execution_row(attempt: int) -> dict[str, Any]:
    return {
        "job_name": "nightly",
        "scheduled_at": SLOT,
        "trigger": "cron",
        "status": "COMPLETED",
        "attempt": attempt,
        "created_at": SLOT,
    }


def test_migrate_creates_the_three_tables_with_the_contract_columns_on_an_empty_database(
    empty_db_url: str, tmp_path: Path
) -> None:
    assert not table_names(empty_db_url) & TABLES
    done = migrate(empty_db_url, tmp_path)
    assert f"to revision {head_revision()}" in done.stdout

    def columns(conn: Connection) -> dict[str, set[str]]:
        inspector = inspect(conn)
        return {t: {c["name"] for c in inspector.get_columns(t)} for t in TABLES}

    found = on_database(empty_db_url, columns)
    for table, wanted in CONTRACT_COLUMNS.items():
        assert wanted <= found[table], f"{table} lacks {sorted(wanted - found[table])}"
    assert revision(empty_db_url) == [head_revision()]


def test_one_attempt_of_one_slot_of_one_job_can_be_recorded_only_once(
    empty_db_url: str, tmp_path: Path
) -> None:
    migrate(empty_db_url, tmp_path)
    # A second attempt of the same slot is a row of its own; only the triple is unique.
    on_database(empty_db_url, lambda conn: conn.execute(insert(executions), [execution_row(1)]))
    on_database(empty_db_url, lambda conn: conn.execute(insert(executions), [execution_row(2)]))
    with pytest.raises(IntegrityError):
        on_database(empty_db_url, lambda conn: conn.execute(insert(executions), [execution_row(1)]))
    count = on_database(
        empty_db_url,
        lambda conn: conn.execute(select(func.count()).select_from(executions)).scalar_one(),
    )
    assert count == 2


def test_migrating_a_database_already_at_head_changes_nothing(
    empty_db_url: str, tmp_path: Path
) -> None:
    migrate(empty_db_url, tmp_path)
    at = revision(empty_db_url)
    on_database(
        empty_db_url,
        lambda conn: conn.execute(
            insert(jobs),
            [dict(KEPT_JOB)],
        ),
    )

    again = migrate(empty_db_url, tmp_path)

    assert f"already at revision {head_revision()}" in again.stdout
    assert revision(empty_db_url) == at == [head_revision()]
    names = on_database(
        empty_db_url, lambda conn: list(conn.execute(select(jobs.c.name)).scalars())
    )
    assert names == ["kept"]


def test_head_is_the_newest_revision_of_the_migrations() -> None:
    """HEAD is what lets a service skip Alembic: a new migration must move it too."""
    assert head_revision() == HEAD


def test_a_service_on_a_migrated_database_never_loads_alembic(
    empty_db_url: str, tmp_path: Path
) -> None:
    migrate(empty_db_url, tmp_path)
    probe = (
        "import asyncio, sys\n"
        "from sqlalchemy.engine import make_url\n"
        "from slotcron.store import migrate\n"
        "from slotcron.store.database import Database\n"
        "async def main():\n"
        "    db = Database.connect(make_url(sys.argv[1]), 1)\n"
        "    try:\n"
        "        print(await migrate.upgrade(db.engine, db.dialect))\n"
        "    finally:\n"
        "        await db.close()\n"
        "asyncio.run(main())\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'alembic'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, empty_db_url],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"('{HEAD}', '{HEAD}')", "[]"]


def test_migrate_sql_prints_the_schema_and_leaves_the_database_untouched(
    backend: str, empty_db_url: str, tmp_path: Path
) -> None:
    done = Cli(tmp_path, empty_db_url)("migrate", "--sql")

    assert done.returncode == 0, done.stderr
    for table in sorted(TABLES):
        assert f"CREATE TABLE {table}" in done.stdout, f"no CREATE TABLE {table} in:\n{done.stdout}"
    if backend == "sqlite":
        database = make_url(empty_db_url).database
        assert database and not Path(database).exists(), "--sql created the SQLite file"
    assert table_names(empty_db_url) == set()


def test_the_tables_the_migrations_create_are_the_tables_the_app_queries(
    empty_db_url: str, tmp_path: Path
) -> None:
    migrate(empty_db_url, tmp_path)

    differences = on_database(
        empty_db_url, lambda conn: compare_metadata(MigrationContext.configure(conn), metadata)
    )

    assert differences == [], f"slotcron.store.tables and the migrations disagree: {differences}"


def test_ids_compare_byte_for_byte_after_the_migration_which_keeps_every_row(
    backend: str, empty_db_url: str, tmp_path: Path
) -> None:
    """Migration 0008 (issue 26): a database holding rows at 0007 is migrated; every row stays,
    and ids that differ in case, accents or trailing spaces are different ids, on every backend
    (a binary collation on MariaDB; PostgreSQL and SQLite compared bytes already)."""
    from alembic import command
    from slotcron.store.migrate import alembic_config

    def to_0007(conn: Connection) -> None:
        config = alembic_config()
        config.attributes["connection"] = conn
        command.upgrade(config, "0007")

    def add(table: Table, row: dict[str, Any]) -> None:
        on_database(empty_db_url, lambda conn: conn.execute(insert(table), [row]))

    on_database(empty_db_url, to_0007)
    schedule = {**KEPT_JOB, "name": "Tenant/Alpha", "task": "t", "params": {"key": "alpha"}}
    run = {**execution_row(1), "job_name": "Tenant/Alpha", "instance_id": "Instance-A"}
    add(jobs, dict(KEPT_JOB))
    add(jobs, schedule)
    add(executions, run)

    done = migrate(empty_db_url, tmp_path)

    assert "from 0007" in done.stdout and revision(empty_db_url) == [HEAD]
    variants = ["tenant/alpha", "Ténant/Alpha", "Tenant/Alpha "]
    for variant in variants:
        add(jobs, {**schedule, "name": variant})
        add(executions, {**run, "job_name": variant})

    def count(condition: Any) -> Any:
        return select(func.count()).select_from(executions).where(condition)

    def stored(conn: Connection) -> Any:
        return (
            sorted(conn.execute(select(jobs.c.name)).scalars()),
            conn.execute(select(jobs.c.params).where(jobs.c.name == "Tenant/Alpha")).scalar(),
            conn.execute(count(executions.c.job_name == "tenant/alpha")).scalar(),
            conn.execute(count(executions.c.instance_id == "instance-a")).scalar(),
        )

    names, params, variant_runs, runs_of_a = on_database(empty_db_url, stored)
    assert names == sorted(["kept", "Tenant/Alpha", *variants])
    assert params == {"key": "alpha"}
    assert (variant_runs, runs_of_a) == (1, 0)
    if backend == "mariadb":

        def collations(conn: Connection) -> set[str]:
            query = text(
                "SELECT DISTINCT collation_name FROM information_schema.columns WHERE "
                "table_schema = DATABASE() AND column_name IN ('name', 'job_name', "
                "'instance_id', 'task', 'start_key')"
            )
            return set(conn.execute(query).scalars())

        assert on_database(empty_db_url, collations) == {"utf8mb4_nopad_bin"}


def test_run_refuses_an_unmigrated_database_when_auto_migrate_is_off(
    empty_db_url: str, tmp_path: Path
) -> None:
    done = Cli(tmp_path, empty_db_url)(
        "run", "--jobs", "slotcron.examples", env={"SCHEDULER_AUTO_MIGRATE": "false"}, timeout=20
    )

    assert done.returncode == 2, f"exit {done.returncode}:\n{done.stdout}\n{done.stderr}"
    line = one_line(done.stderr)
    assert "SCHEDULER_AUTO_MIGRATE" in line
    assert "slotcron migrate" in line
    assert not table_names(empty_db_url) & TABLES
