"""No traceback for bad input: every case of issue 13 exits 2 with one line naming what is
wrong, job-written text reaches the terminal as text, and read-only commands create no file.

Run as the real console script (see ``tests/test_cli.py``) against SQLite in a temp dir.
"""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path

import pytest

from tests.cli import Cli, one_line
from tests.test_cli import PASSWORD, cli, db_path

__all__ = ["cli"]  # the fixture, shared with test_cli.py

RED = "\x1b[31m"
TITLE = "\x1b]0;pwned\x07"

# (arguments, environment, what the one line must say). Arguments are bytes where the case is
# an argument that is not valid UTF-8.
BAD_INPUT: list[tuple[list[str | bytes], dict[str, str], str]] = [
    (["history", "--limit", "99999999999999999999"], {}, "--limit: must be between 1 and 10000"),
    (["history", "--limit", "0"], {}, "--limit: must be between 1 and 10000"),
    (["history", "--limit", "ten"], {}, "--limit: expected a whole number"),
    (["restart", "99999999999999999999"], {}, "EXECUTION_ID: must be between 1 and"),
    (["restart", "-5"], {}, "EXECUTION_ID"),
    (["history", b"job\xff"], {}, "JOB: job name 'job\ufffd' is not valid UTF-8"),
    (["trigger", b"\xc3"], {}, "is not valid UTF-8"),
    (["trigger", "x" * 201], {}, "JOB: job name has at most 200 characters"),
    (["trigger", "j", "--param", b"k=\xff"], {}, "--param"),
    (["pause", "j", "--reason", "r" * 401], {}, "--reason has at most 400 characters"),
    (["history", "--since", "yesterday"], {}, "--since"),
    (["history", "--since", "9999-12-31T23:59:59-05:00"], {}, "later than the year 9999"),
    (["history", "--status", "BOGUS"], {}, "unknown status"),
    (["check"], {"SCHEDULER_LEASE_SECONDS": "inf"}, "SCHEDULER_LEASE_SECONDS"),
    (["check"], {"SCHEDULER_LEASE_SECONDS": "1e308"}, "SCHEDULER_LEASE_SECONDS"),
    (["check"], {"SCHEDULER_HISTORY_RETENTION_DAYS": "inf"}, "SCHEDULER_HISTORY_RETENTION_DAYS"),
    (["check"], {"SCHEDULER_HISTORY_RETENTION_DAYS": "1e9"}, "SCHEDULER_HISTORY_RETENTION_DAYS"),
    (["check"], {"SCHEDULER_HEARTBEAT_SECONDS": "1e-9"}, "SCHEDULER_HEARTBEAT_SECONDS"),
    (["check"], {"SCHEDULER_ADMIN_TOKEN": "   "}, "SCHEDULER_ADMIN_TOKEN: is blank"),
    (["check"], {"SCHEDULER_ADMIN_TOKEN": "tökén"}, "SCHEDULER_ADMIN_TOKEN: must be printable"),
    (
        ["run"],
        {"SCHEDULER_DATABASE_URL": "sqlite+aiosqlite:///./no/such/dir/x.db"},
        "SCHEDULER_DATABASE_URL: the directory of the SQLite file",
    ),
    (
        ["check"],
        {"SCHEDULER_DATABASE_URL": f"postgresql+asyncpg://app:p@{PASSWORD}-2026@db.example/x"},
        "percent-encode an '@'",
    ),
]


def _id(case: tuple[list[str | bytes], dict[str, str], str]) -> str:
    args, env, _ = case
    text = " ".join(a if isinstance(a, str) else repr(a) for a in args)[:40]
    return text + (" " + " ".join(f"{k}={v}" for k, v in env.items()) if env else "")


@pytest.mark.parametrize("case", BAD_INPUT, ids=[_id(c) for c in BAD_INPUT])
def test_every_bad_input_of_the_issue_exits_2_with_one_line_naming_it(
    cli: Cli, case: tuple[list[str | bytes], dict[str, str], str]
) -> None:
    args, env, expected = case
    status, out, err = cli.run_bytes(args, env)

    assert status == 2, f"exit {status}:\n{out}\n{err}"
    line = one_line(err)
    assert expected in line, line
    assert "Traceback" not in out + err
    assert PASSWORD not in out + err


@pytest.mark.parametrize(
    "since", ["999999999d", "0001-01-01T00:00:00+01:00", "99999999999999999999999s"]
)
def test_a_since_reaching_before_any_datetime_means_everything(cli: Cli, since: str) -> None:
    cli.ok("migrate")
    done = cli("history", "--since", since)

    assert done.returncode == 0, done.stderr
    assert "no executions match" in done.stdout


def insert_failed(cli: Cli, error: str) -> None:
    with sqlite3.connect(db_path(cli)) as conn:
        conn.execute(
            "INSERT INTO scheduler_executions (job_name, scheduled_at, trigger, status, attempt,"
            " created_at, error, params, state) VALUES ('evil', '2030-01-01 00:00:00.000000',"
            " 'cron', 'FAILED', 1, '2030-01-01 00:00:00.000000', ?, '{}', '{}')",
            (error,),
        )
    conn.close()


def test_history_shows_a_jobs_error_text_as_text_never_as_markup_or_terminal_codes(
    cli: Cli,
) -> None:
    cli.ok("migrate")
    insert_failed(cli, f"boom [/something] [bold]x[/bold] {RED}red{TITLE}\rgone")

    done = cli.ok("history")

    assert "[/something]" in done.stdout
    assert "[bold]x[/bold]" in done.stdout
    assert "\x1b" not in done.stdout and "\x07" not in done.stdout and "\r" not in done.stdout
    assert "\\x1b[31mred" in done.stdout


def test_history_json_keeps_the_error_text_exactly(cli: Cli) -> None:
    import json

    cli.ok("migrate")
    text = f"boom [/x] {RED}red"
    insert_failed(cli, text)

    done = cli.ok("history", "--json")

    assert json.loads(done.stdout)[0]["error"] == text
    assert "\x1b" not in done.stdout, "JSON escapes control characters itself"


@pytest.mark.parametrize("command", [["history"], ["jobs"], ["instances"], ["restart", "1"]])
def test_commands_that_only_read_or_queue_create_no_database_or_side_file(
    cli: Cli, command: list[str]
) -> None:
    done = cli(*command)

    assert done.returncode == 2
    assert "no database at" in one_line(done.stderr)
    assert sorted(p.name for p in cli.cwd.iterdir()) == []


def test_database_files_are_created_private(cli: Cli) -> None:
    os.umask(0o022)
    cli.ok("migrate")
    cli.ok("jobs")  # the clock file beside the database

    for path in cli.cwd.iterdir():
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode & 0o077 == 0, f"{path.name} is {oct(mode)}"
    assert (cli.cwd / "x.db").exists() and (cli.cwd / "x.db-clock").exists()


def test_the_clock_file_is_never_followed_through_a_symlink_nor_truncated(
    cli: Cli, tmp_path: Path
) -> None:
    cli.ok("migrate")
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (cli.cwd / "x.db-clock").unlink(missing_ok=True)
    (cli.cwd / "x.db-clock").symlink_to(victim)

    done = cli("jobs")

    assert victim.read_text() == "precious\n"
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
