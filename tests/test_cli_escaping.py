"""What the command line prints cannot drive the terminal: ids, names and errors holding control
characters (C0, ESC, DEL, C1) come out as ``\\x1b`` escapes, each on its line, and ``--json`` stays
JSON that gives the id back exactly.

An id with control characters can no longer be created (the checks of ``slotcron.jobs.schedules``);
one
written before them, or straight into the database, is what these tests print. SQLite only: the
escaping is the CLI's, the same whatever database the row came from.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from slotcron.cli.common import say, say_json
from slotcron.config import Settings
from slotcron.store.database import Database
from slotcron.store.tables import jobs
from sqlalchemy import update

from tests.cli import Cli

# A title change (OSC ... BEL), a colour, a C1 CSI clearing the screen, DEL, a bidirectional
# override, and a newline followed by what looks like another line of output.
HOSTILE_ID = "tenant/\x1b]0;pwned\x07\x1b[31mred\x9b2J\x7f\u202e\nremoved everything"
RAW_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
TASKS = """
    from slotcron import JobContext, task

    @task(name="reports.send")
    async def send(ctx: JobContext) -> None:
        pass
"""


def tasks_cli(cwd: Path, url: str) -> Cli:
    """The console script with ``SCHEDULER_JOBS`` naming the module of ``TASKS``."""
    return Cli(cwd, url, extra_env={"SCHEDULER_JOBS": "cli_tasks"})


def assert_inert(text: str) -> None:
    """Nothing in ``text`` a terminal acts on but line ends."""
    assert not RAW_CONTROLS.search(text), repr(text)


def test_say_escapes_every_control_character_and_keeps_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    say(HOSTILE_ID)
    out = capsys.readouterr().out
    assert_inert(out)
    assert out.count("\n") == 1 and "\\x1b]0;pwned\\x07\\x1b[31m" in out
    assert "\\x9b2J\\x7f\\u202e\\x0aremoved everything" in out


def test_json_output_stays_json_and_gives_the_id_back_exactly(
    capsys: pytest.CaptureFixture[str],
) -> None:
    say_json([{"id": HOSTILE_ID}])
    out = capsys.readouterr().out
    assert_inert(out)
    assert json.loads(out) == [{"id": HOSTILE_ID}]


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_a_schedule_id_holding_terminal_escapes_is_printed_escaped_by_every_command(
    db_url: str, tmp_path: Path
) -> None:
    cli = tasks_cli(tmp_path, db_url)
    cli.write_module("cli_tasks", TASKS)
    done = cli("schedules", "add", "reports.send", "--every", "60", "--id", "t")
    assert done.returncode == 0, done.stderr
    db = Database.connect(Settings(database_url=db_url).url, 1)
    try:
        async with db.transaction() as conn:
            await conn.execute(update(jobs).where(jobs.c.name == "t").values(name=HOSTILE_ID))
    finally:
        await db.close()

    listed = cli("schedules", "list", "--json")
    assert_inert(listed.stdout)
    assert [s["id"] for s in json.loads(listed.stdout)] == [HOSTILE_ID]

    for args in (
        ["schedules", "list"],
        ["schedules", "show", HOSTILE_ID],
        ["schedules", "show", HOSTILE_ID, "--json"],
        ["jobs"],
        ["jobs", "--json"],
        ["pause", HOSTILE_ID],
        ["resume", HOSTILE_ID],
        ["schedules", "remove", HOSTILE_ID],
        ["schedules", "show", HOSTILE_ID],  # removed: the error names it
    ):
        done = cli(*args)
        assert done.returncode in (0, 2), (args, done)
        assert_inert(done.stdout)
        assert_inert(done.stderr)
        if "--json" in args:
            json.loads(done.stdout)
        elif args[-1] != "list" and args != ["jobs"]:  # tables cut long cells: not checked
            shown = done.stdout + done.stderr
            assert "\\x1b]0;pwned" in shown, (args, shown)
            # The newline of the id is escaped: no line of output starts with its tail.
            assert not any(line.startswith("removed everything") for line in shown.splitlines()), (
                args,
                shown,
            )


def test_arguments_argparse_refuses_are_echoed_escaped(tmp_path: Path) -> None:
    cli = tasks_cli(tmp_path, "sqlite+aiosqlite:///unused.db")
    done = cli("history", "--\x1b[2Jwipe\x9b")
    assert done.returncode == 2
    assert_inert(done.stderr)
    assert "\\x1b[2Jwipe\\x9b" in done.stderr and len(done.stderr.strip().splitlines()) == 1
