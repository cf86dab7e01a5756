"""Issue 26 through the real console script, on every backend: the limits of a schedule (exit 2
naming the field, nothing written), an id already taken (exit 1, a conflict), ids compared byte
for byte, and an unreadable row listed with its error instead of failing the listing."""

from __future__ import annotations

import pytest
from slotcron.config import Settings
from slotcron.store.database import Database

from tests.cli import Cli
from tests.corrupt import BIG_NUMBER, corrupt
from tests.test_cli_schedules import CODE_JOB, add_code_job, cli, schedule_rows

__all__ = ["cli"]  # the fixture, shared with tests/test_cli_schedules.py


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--every", "0.001"], "every:"),
        (["--every", "0.5"], "every:"),
        (["--cron", "0 9 * * *", "--timezone", "America"], "timezone"),
        (["--cron", "0 9 * * *", "--timezone", "../zoneinfo/UTC"], "timezone"),
        (["--every", "5", "--id", "tenant\x1b[2Jforged"], "id"),
        (["--every", "5", "--id", "tenant\x85"], "id"),
        (["--every", "5", "--params-json", '{"n": ' + "9" * 65 + "}"], "params:"),
    ],
)
async def test_a_limit_exits_2_naming_the_field_and_writes_nothing(
    cli: Cli, db_url: str, args: list[str], field: str
) -> None:
    done = cli("add", "reports.send", *args)
    assert done.returncode == 2, done
    assert field in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "site-packages" not in done.stderr
    assert await schedule_rows(db_url) == 0


async def test_an_id_already_taken_exits_1_and_a_variant_is_another_schedule(
    cli: Cli, db_url: str
) -> None:
    await add_code_job(db_url)
    cli.text("add", "reports.send", "--every", "60", "--id", "Tenant/Alpha", "--param", "k=secret")
    for taken in ("Tenant/Alpha", CODE_JOB):
        done = cli("add", "reports.send", "--every", "60", "--id", taken)
        assert done.returncode == 1, done
        assert "id: already taken" in done.stderr and "secret" not in done.stderr, done.stderr
    for variant in ("tenant/alpha", "Ténant/Alpha", "Tenant/Alpha "):
        added = cli.json("add", "reports.send", "--every", "60", "--id", variant)
        assert added["id"] == variant
    assert cli.json("show", "Tenant/Alpha")["params"] == {"k": "secret"}
    assert await schedule_rows(db_url) == 4


async def test_an_unreadable_row_is_listed_with_its_error(cli: Cli, db_url: str) -> None:
    for name in ("a-good", "b-broken"):
        cli.text("add", "reports.send", "--every", "60", "--id", name)
    db = Database.connect(Settings(database_url=db_url).url, 1)
    try:
        await corrupt(db, "b-broken", params=BIG_NUMBER)
    finally:
        await db.close()
    listed = {s["id"]: s for s in cli.json("list")}
    assert "error" not in listed["a-good"]
    assert listed["b-broken"]["error"].startswith("params: ")
    table = cli.text("list")
    assert "a-good" in table and "unreadable" in table
    shown = cli.json("show", "b-broken")
    assert shown["error"].startswith("params: ") and shown["next_slots"] == []
