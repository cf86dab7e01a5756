"""``slotcron schedules add|list|show|update|remove`` through the real console script, on every
backend. The task is known the way the CLI knows it: ``SCHEDULER_JOBS`` names its module.
"""

from __future__ import annotations

from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path

import pytest
from slotcron.config import Settings
from slotcron.store.database import Database
from slotcron.store.registrations import JobRow, register_jobs
from slotcron.store.tables import jobs
from sqlalchemy import func, select

from tests.cli import Cli

TASKS = """
    from slotcron import JobContext, task

    @task(name="reports.send", max_attempts=2)
    async def send(ctx: JobContext) -> None:
        pass
"""
CODE_JOB = "reports.nightly"


@pytest.fixture
def cli(db_url: str, tmp_path: Path) -> Cli:
    """``slotcron schedules`` with ``SCHEDULER_JOBS`` naming the module of ``TASKS``."""
    cli = Cli(tmp_path, db_url, prefix=("schedules",), extra_env={"SCHEDULER_JOBS": "cli_tasks"})
    cli.write_module("cli_tasks", TASKS)
    return cli


async def schedule_rows(url: str) -> int:
    db = Database.connect(Settings(database_url=url).url, 1)
    try:
        async with db.read() as conn:
            count = await conn.scalar(
                select(func.count()).select_from(jobs).where(jobs.c.task.is_not(None))
            )
    finally:
        await db.close()
    return int(count or 0)


async def add_code_job(url: str) -> None:
    db = Database.connect(Settings(database_url=url).url, 1)
    try:
        row = JobRow(CODE_JOB, "cron", "0 3 * * *", "UTC", {}, datetime(2030, 1, 1, tzinfo=UTC))
        await register_jobs(db, [row], now=datetime.now(UTC), instance_id="t", version="0")
    finally:
        await db.close()


async def test_schedules_are_added_listed_shown_updated_and_removed_from_the_command_line(
    cli: Cli,
) -> None:
    new_id = cli.text("add", "reports.send", "--cron", "0 9 * * *", "--timezone", "Asia/Seoul",
                      "--param", "tenant=7").strip()  # fmt: skip
    assert new_id.startswith("reports.send/")
    added = cli.json("add", "reports.send", "--every", "30", "--id", "tenant-8",
                     "--params-json", '{"tenant": 8, "tier": "gold"}', "--param", "tier=free",
                     "--jitter", "2", "--paused")  # fmt: skip
    assert added["id"] == "tenant-8" and added["every"] == 30 and added["paused"] is True
    assert added["params"] == {"tenant": 8, "tier": "free"} and added["jitter"] == 2.0

    listed = cli.json("list")
    assert [s["id"] for s in listed] == sorted([new_id, "tenant-8"])
    assert cli.json("list", "--task", "nobody") == []
    assert len(cli.json("list", "--limit", "1")) == 1
    assert "tenant-8" in cli.text("list")

    shown = cli.json("show", new_id)
    assert shown["timezone"] == "Asia/Seoul" and shown["params"] == {"tenant": "7"}
    slots = [datetime.fromisoformat(s.replace("Z", "+00:00")) for s in shown["next_slots"]]
    assert len(slots) == 5 and all((s.hour, s.minute) == (0, 0) for s in slots)
    assert all((b - a).days == 1 for a, b in pairwise(slots))
    assert cli.text("show", new_id).count("T00:00:00Z") == 5

    changed = cli.json("update", "tenant-8", "--cron", "*/10 * * * * *")
    assert changed["cron"] == "*/10 * * * * *" and changed["every"] is None
    assert changed["params"] == added["params"]  # what was not given stays
    assert cli.text("remove", "tenant-8").strip() == "removed tenant-8"
    assert [s["id"] for s in cli.json("list")] == [new_id]


async def test_a_schedules_own_calendar_window_and_max_runs_from_the_command_line(
    cli: Cli,
) -> None:
    added = cli.json("add", "reports.send", "--cron", "0 9 * * *", "--id", "bounded",
                     "--timezone", "America/New_York", "--calendar", "holidays:US",
                     "--exclude-date", "2031-11-26", "--start-at", "2031-11-24T00:00:00Z",
                     "--end-at", "2031-12-01T00:00:00Z", "--max-runs", "3")  # fmt: skip
    assert (added["calendar"], added["exclude_dates"], added["max_runs"]) == (
        "holidays:US",
        ["2031-11-26"],
        3,
    )
    shown = cli.json("show", "bounded")
    days = [s[:10] for s in shown["next_slots"]]
    assert days == ["2031-11-24", "2031-11-25", "2031-11-28", "2031-11-29", "2031-11-30"]
    changed = cli.json("update", "bounded", "--max-runs", "5", "--exclude-date", "2031-11-28")
    assert (changed["max_runs"], changed["exclude_dates"]) == (5, ["2031-11-28"])
    assert changed["calendar"] == "holidays:US", "what is not given stays"


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["add", "reports.unknown", "--every", "5"], "task:"),
        (["add", "reports.send", "--cron", "0 9 * *"], "cron:"),
        (["add", "reports.send", "--cron", "0 9 * * *", "--timezone", "Nowhere/X"], "timezone:"),
        (["add", "reports.send", "--every", "0"], "every:"),
        (["add", "reports.send", "--every", "soon"], "--every"),
        (["add", "reports.send", "--every", "5", "--params-json", "[1]"], "params:"),
        (["add", "reports.send", "--every", "5", "--params-json", "{oops"], "params:"),
        (["add", "reports.send", "--every", "5", "--calendar", "holidays:XX"], "calendar:"),
        (["add", "reports.send", "--every", "5", "--exclude-date", "soon"], "exclude_dates:"),
        (["add", "reports.send", "--every", "5", "--start-at", "2031-01-01"], "start_at:"),
        (["add", "reports.send", "--every", "5", "--max-runs", "0"], "--max-runs"),
        (["add", "reports.send", "--every", "5", "--jitter", "-1"], "jitter:"),
        (["add", "reports.send"], "--cron"),
    ],
)
async def test_bad_input_exits_2_naming_the_field_and_writes_nothing(
    cli: Cli, db_url: str, args: list[str], field: str
) -> None:
    await add_code_job(db_url)
    done = cli(*args)
    assert done.returncode == 2, done
    assert field in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert await schedule_rows(db_url) == 0


async def test_an_id_already_taken_is_refused_with_exit_1_naming_the_field(
    cli: Cli, db_url: str
) -> None:
    """Issue 26, item 4: a duplicate is a refusal (exit 1), never a driver error."""
    await add_code_job(db_url)
    done = cli("add", "reports.send", "--every", "5", "--id", CODE_JOB)
    assert done.returncode == 1, done
    assert "id: already taken" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert await schedule_rows(db_url) == 0


async def test_a_code_job_is_refused_with_exit_1_and_an_unknown_id_is_exit_2(
    cli: Cli, db_url: str
) -> None:
    await add_code_job(db_url)
    for args in (["update", CODE_JOB, "--every", "5"], ["remove", CODE_JOB]):
        done = cli(*args)
        assert done.returncode == 1 and "owned by its code" in done.stderr, done
    done = cli("remove", "no-such-schedule")
    assert done.returncode == 2 and "no schedule with id" in done.stderr, done
