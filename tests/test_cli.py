"""The ``slotcron`` command line, run as the real console script against SQLite in a temp dir.

Every command runs in a process of its own (forked with the CLI imported: tests/cli.py) with no
``SCHEDULER_*`` variable but the ones the test sets, with the test's temp directory as working
directory (so job modules written there import).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import sqlite3
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from tests import backends
from tests.cli import Cli, one_line, poll, stop

ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")
EXAMPLE_JOBS = ("examples.heartbeat", "examples.report", "examples.flaky", "examples.every_minute")
HISTORY_FIELDS = {
    "id",
    "job",
    "scheduled_at",
    "trigger",
    "status",
    "attempt",
    "instance_id",
    "started_at",
    "finished_at",
    "duration_ms",
    "error",
    "params",
    "state",
    "until",
}
PASSWORD = "hunter2"


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    """The console script in the test's temp directory, on the SQLite file ``x.db`` there."""
    return Cli(cwd=tmp_path, url=f"sqlite+aiosqlite:///{tmp_path / 'x.db'}", timeout=30)


def db_path(cli: Cli) -> Path:
    """The SQLite file ``cli`` runs against."""
    database = make_url(cli.url).database
    assert database, cli.url
    return Path(database)


def parse_utc(text: str) -> datetime:
    assert ISO_UTC.match(text), f"{text!r} is not ISO-8601 UTC ending in Z"
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


# --- version and usage ----------------------------------------------------------------------


def test_the_console_script_and_python_m_app_report_the_same_version(cli: Cli) -> None:
    module = cli.ok("--version")  # tests/cli.py runs python -m slotcron
    script = subprocess.run(
        ["slotcron", "--version"],
        cwd=cli.cwd,
        env=cli.env(),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )

    assert script.returncode == 0, script.stderr
    assert script.stdout.strip().startswith("slotcron ")
    assert module.stdout == script.stdout


@pytest.mark.parametrize(
    "argv",
    [
        [b"--help"],
        [b"frobnicate"],
        [b"check", b"--jobs", b"no_such_module"],
        [b"history", b"--job", b"caf\xe9\xff"],  # not UTF-8: decoded as Python decodes argv
        [b"jobs", b"--json"],
    ],
    ids=["help", "unknown", "no-module", "bytes", "jobs"],
)
def test_a_forked_command_says_and_exits_as_a_new_interpreter_does(
    cli: Cli, argv: list[bytes]
) -> None:
    # tests/cli.py forks commands from a process with the CLI imported (tests/cli_zygote.py);
    # the suite's CLI tests hold only if that changes nothing a user would see.
    env = {"SCHEDULER_LOG_LEVEL": "WARNING"}
    forked = cli.run_bytes(list(argv), env)

    assert forked == cli.run_started(list(argv), cli.env(env))
    assert forked[0] in (0, 1, 2) and (forked[1] or forked[2])


def test_an_unknown_command_is_bad_usage(cli: Cli) -> None:
    done = cli("frobnicate")

    assert done.returncode == 2
    assert "frobnicate" in done.stderr


def test_an_unknown_option_is_bad_usage(cli: Cli) -> None:
    done = cli("history", "--bogus")

    assert done.returncode == 2
    assert "--bogus" in done.stderr


# --- check ----------------------------------------------------------------------------------


def test_check_prints_the_next_five_future_utc_slots_of_every_example_job(cli: Cli) -> None:
    before = datetime.now(UTC)
    done = cli.ok("check", "--jobs", "slotcron.examples")

    lines = done.stdout.splitlines()
    for job in EXAMPLE_JOBS:
        headers = [i for i, line in enumerate(lines) if line.split()[:1] == [job]]
        assert len(headers) == 1, f"{job} is not listed once in:\n{done.stdout}"
        following = lines[headers[0] + 1 : headers[0] + 6]
        assert len(following) == 5, f"{job}: fewer than 5 slot lines in:\n{done.stdout}"
        slots = [parse_utc(line.strip()) for line in following]
        assert slots[0] > before, f"{job}: first slot {slots[0]} is not in the future"
        assert all(a < b for a, b in itertools.pairwise(slots)), f"{job}: {slots}"


def test_check_names_the_job_and_the_field_of_a_bad_cron_expression(cli: Cli) -> None:
    module = cli.write_module(
        "badcron",
        """
        from slotcron import cron

        @cron("61 * * * *", name="broken_minute")
        async def broken() -> None: ...
        """,
    )

    done = cli("check", "--jobs", module)

    assert done.returncode == 2
    line = one_line(done.stderr)
    assert "broken_minute" in line
    assert "schedule" in line


def test_check_says_which_day_rule_applies_to_a_job_restricting_both_day_fields(cli: Cli) -> None:
    module = cli.write_module(
        "dayrules",
        """
        from slotcron import cron

        @cron("0 0 9 1-7 * MON", name="spring_first_monday")
        async def spring() -> None: ...

        @cron("0 9 1-7 * MON", name="classic_first_week_or_monday")
        async def classic() -> None: ...

        @cron("0 0 9 * * MON", name="every_monday")
        async def monday() -> None: ...
        """,
    )

    lines = cli.ok("check", "--jobs", module).stdout.splitlines()

    def block(job: str) -> list[str]:
        start = next(i for i, line in enumerate(lines) if line.split()[:1] == [job])
        end = next((i for i in range(start + 1, len(lines)) if not lines[i].startswith(" ")), None)
        return [line.strip() for line in lines[start + 1 : end]]

    spring, classic, monday = (
        block(job)
        for job in ("spring_first_monday", "classic_first_week_or_monday", "every_monday")
    )
    assert "Spring" in spring[0] and "AND" in spring[0], spring
    assert "classic cron" in classic[0] and "OR" in classic[0], classic
    assert len(monday) == 5 and all(ISO_UTC.match(line) for line in monday), monday
    # The rule line comes once, before the five slots: Spring's first Mondays are all Mondays
    # in the 1st to 7th; classic cron's include days that are not Mondays.
    spring_slots = [parse_utc(line) for line in spring[1:]]
    classic_slots = [parse_utc(line) for line in classic[1:]]
    assert len(spring_slots) == 5 and len(classic_slots) == 5
    assert all(s.weekday() == 0 and s.day <= 7 for s in spring_slots), spring_slots
    assert any(s.weekday() != 0 for s in classic_slots), classic_slots


def test_check_names_a_jobs_module_that_does_not_exist(cli: Cli) -> None:
    done = cli("check", "--jobs", "no_such_jobs_module")

    assert done.returncode == 2
    assert "no_such_jobs_module" in one_line(done.stderr)


# --- configuration --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("SCHEDULER_LEASE_SECONDS", "-1"),
        ("SCHEDULER_TIMEZONE", "Mars/Base"),
        ("SCHEDULER_DATABASE_URL", f"postgresql+asyncpg://u:{PASSWORD}@:5432/"),
        ("SCHEDULER_DATABASE_URL", f"oracle://u:{PASSWORD}@h/db"),
    ],
    ids=["negative-lease", "unknown-timezone", "url-without-host", "unsupported-database"],
)
def test_a_bad_configuration_value_stops_with_one_line_naming_the_variable(
    cli: Cli, variable: str, value: str
) -> None:
    done = cli("check", env={variable: value})

    assert done.returncode == 2, f"exit {done.returncode}:\n{done.stdout}\n{done.stderr}"
    assert variable in one_line(done.stderr)
    assert PASSWORD not in done.stdout + done.stderr


def database_snapshot(path: Path) -> tuple[str, int, dict[str, int], list[str]]:
    """The file's digest and mtime, each table's row count, and the Alembic revision."""
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    mtime = path.stat().st_mtime_ns
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'scheduler_%'"
            )
        ]
        counts = {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables}
        version = [r[0] for r in conn.execute("SELECT version_num FROM alembic_version")]
    conn.close()
    return digest, mtime, counts, version


def test_bad_jobs_or_bad_configuration_never_touch_the_stored_data(cli: Cli) -> None:
    cli.ok("migrate")
    with sqlite3.connect(db_path(cli)) as conn:
        conn.execute(
            "INSERT INTO scheduler_jobs (name, kind, schedule, timezone, options, paused,"
            " registered_at, updated_at) VALUES ('kept', 'cron', '* * * * *', 'UTC', '{}', 0,"
            " '2030-01-01 00:00:00.000000', '2030-01-01 00:00:00.000000')"
        )
    conn.close()
    before = database_snapshot(db_path(cli))
    assert before[2]["scheduler_jobs"] == 1
    assert before[3], "no Alembic revision after migrate"
    module = cli.write_module(
        "badjobs",
        """
        from slotcron import every

        @every(seconds=0, name="never")
        async def never() -> None: ...
        """,
    )

    attempts = [
        cli("check", "--jobs", module),
        cli("run", "--jobs", module),
        cli("run", "--jobs", "slotcron.examples", env={"SCHEDULER_LEASE_SECONDS": "-1"}),
        cli("run", "--jobs", "slotcron.examples", env={"SCHEDULER_LOG_LEVEL": "LOUD"}),
    ]

    assert [a.returncode for a in attempts] == [2, 2, 2, 2], [a.stderr for a in attempts]
    assert database_snapshot(db_path(cli)) == before


# --- history --------------------------------------------------------------------------------


@pytest.fixture
def ticking_history(cli: Cli) -> Iterator[list[dict[str, Any]]]:
    """A database with executions written by the real service: ``tick`` completing and
    ``boom`` failing every second. Yields the final ``history --json`` after a clean SIGTERM."""
    module = cli.write_module(
        "ticks",
        """
        from slotcron import every

        @every(seconds=1, name="tick")
        async def tick() -> None:
            pass

        @every(seconds=1, name="boom")
        async def boom() -> None:
            raise RuntimeError("boom went the job on purpose")
        """,
    )
    service, log_path = cli.start(
        module, {"SCHEDULER_SHUTDOWN_DRAIN_TIMEOUT": "5", "SCHEDULER_SHUTDOWN_CANCEL_TIMEOUT": "5"}
    )
    try:

        def enough() -> list[dict[str, Any]] | None:
            assert service.poll() is None, f"service exited early:\n{log_path.read_text()}"
            done = cli("history", "--json", "--limit", "500")
            if done.returncode != 0:  # not migrated yet
                return None
            records: list[dict[str, Any]] = json.loads(done.stdout)
            ticks = [r for r in records if r["job"] == "tick" and r["status"] == "COMPLETED"]
            booms = [r for r in records if r["job"] == "boom" and r["status"] == "FAILED"]
            return records if len(ticks) >= 2 and len(booms) >= 1 else None

        poll(enough, timeout=30, what="2 COMPLETED tick and 1 FAILED boom in history")
    finally:
        stop(service, log_path)
    yield cli.json("history", "--limit", "500")


def test_history_json_lists_every_contract_field_newest_first_in_utc(
    cli: Cli, ticking_history: list[dict[str, Any]]
) -> None:
    records = ticking_history

    assert isinstance(records, list) and records
    for record in records:
        assert record.keys() >= HISTORY_FIELDS, f"missing {HISTORY_FIELDS - record.keys()}"
        for key in ("scheduled_at", "started_at", "finished_at"):
            if record[key] is not None:
                parse_utc(record[key])
        assert record["until"] is None, "only a passed-over range has an until"
    slots = [parse_utc(r["scheduled_at"]) for r in records]
    assert slots == sorted(slots, reverse=True), "history is not newest first"
    failed = [r for r in records if r["job"] == "boom" and r["status"] == "FAILED"]
    assert failed and all("boom went the job on purpose" in (r["error"] or "") for r in failed)
    completed = [r for r in records if r["job"] == "tick" and r["status"] == "COMPLETED"]
    assert len(completed) >= 2
    assert all(isinstance(r["duration_ms"], int) and r["duration_ms"] >= 0 for r in completed)

    latest = cli.json("history", "tick", "--status", "COMPLETED", "--limit", "1")
    assert len(latest) == 1
    assert (latest[0]["job"], latest[0]["status"]) == ("tick", "COMPLETED")
    assert latest[0] == completed[0]

    table = cli.ok("history").stdout
    for word in ("STATUS", "tick", "boom", "COMPLETED", "FAILED"):
        assert word in table, f"{word} not in the history table:\n{table}"

    bogus = cli("history", "--status", "bogus")
    assert bogus.returncode == 2
    assert "bogus" in bogus.stderr


def test_history_against_an_unreachable_database_says_database_error_without_the_password(
    cli: Cli,
) -> None:
    done = cli(
        "history",
        env={"SCHEDULER_DATABASE_URL": f"postgresql+asyncpg://u:{PASSWORD}@127.0.0.1:1/x"},
    )

    assert done.returncode != 0
    assert "database error" in one_line(done.stderr)
    assert PASSWORD not in done.stdout + done.stderr


@pytest.mark.parametrize("server", ["postgresql", "mariadb"])
def test_a_database_that_refuses_the_login_is_a_configuration_error_in_one_line(
    cli: Cli, server: str
) -> None:
    if not backends.AVAILABLE.ok.get(server):
        pytest.skip(f"{server} unreachable")
    base = make_url(backends.POSTGRES_URL if server == "postgresql" else backends.MARIADB_URL)
    url = base.set(username="slotcron_no_such_role", password=PASSWORD, database="x")

    done = cli("history", env={"SCHEDULER_DATABASE_URL": url.render_as_string(hide_password=False)})

    # Wrong credentials are not an outage to wait out: exit 2, naming the variable.
    assert done.returncode == 2
    line = one_line(done.stderr)
    assert "SCHEDULER_DATABASE_URL" in line and "refused" in line
    assert PASSWORD not in done.stdout + done.stderr
