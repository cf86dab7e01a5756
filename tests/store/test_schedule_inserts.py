"""slotcron.store.schedule_inserts: new schedules written a page of rows per INSERT, every value
through its column's type."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from slotcron.jobs.schedules import ScheduleRecord, ScheduleSpec, TaskInfo, task_bounds
from slotcron.store import schedule_inserts
from slotcron.store.database import Database
from slotcron.store.tables import jobs

from tests.store.common import ODD, TASK, is_utc, register, table_rows

INFO = TaskInfo(TASK, {"max_attempts": 2, "alert": False}, None)


def record(schedule_id: str, n: int) -> ScheduleRecord:
    spec = ScheduleSpec(
        id=schedule_id,
        task=TASK,
        kind="interval" if n % 2 else "cron",
        expression="60" if n % 2 else "*/5 * * * *",
        timezone="UTC",
        params={"n": n, "text": "é\u00fc/\"'"},
        jitter=None if n % 3 else 0.5,
        paused=n % 4 == 0,
    )
    return ScheduleRecord(spec, ODD, ODD, ODD + timedelta(minutes=n))


async def test_insert_rows_writes_pages_of_rows_as_their_columns_type_them(
    db: Database,
) -> None:
    for count in (1, 7, 21):  # pages of 1; of 4 and 1; of 16, 4 and 1
        records = [record(f"s{count}-{n:02d}", n) for n in range(count)]
        rows = [schedule_inserts.insert_row(r, INFO, "me", f"v:{count}") for r in records]
        assert rows[0][0] == records[0].spec.id and len(rows[0]) == 15
        async with db.transaction() as conn:
            await schedule_inserts.insert_rows(conn, rows)
        stored = await table_rows(db, jobs, jobs.c.name.like(f"s{count}-%"))
        assert [r["name"] for r in stored] == [r.spec.id for r in records]
        for n, row in enumerate(stored):
            spec = records[n].spec
            assert (row["task"], row["kind"], row["schedule"], row["params"]) == (
                TASK,
                spec.kind,
                spec.expression,
                spec.params,
            )
            assert (row["jitter"], bool(row["paused"]), row["options"]) == (
                spec.jitter,
                spec.paused,
                INFO.options,
            )
            assert (row["registered_at"], row["next_slot_at"]) == (ODD, ODD + timedelta(minutes=n))
            assert is_utc(row["next_slot_at"]) and row["next_slot_at"].microsecond == 123457
            assert (row["updated_by"], row["fencing_token"], row["fingerprint"]) == (
                "me",
                0,
                f"v:{count}",
            )
            assert row["last_slot_at"] is None and row["updated_at"] == ODD


async def test_taken_ids_names_the_ids_a_job_or_schedule_holds(db: Database) -> None:
    await register(db, "code-job")
    async with db.transaction() as conn:
        await schedule_inserts.insert_rows(
            conn, [schedule_inserts.insert_row(record("s", 1), INFO, "me", "v:1")]
        )
    asked = ["x", "s", "S", "s ", "code-job", "Code-job", "s"]
    assert await schedule_inserts.taken_ids(db, asked) == ["s", "code-job", "s"]
    assert await schedule_inserts.taken_ids(db, []) == []


def test_a_rows_options_are_its_tasks_unless_it_has_bounds_of_its_own() -> None:
    task_options = {"overlap": "allow", "calendar": "holidays:US", "max_runs": None}
    spec = ScheduleSpec(
        "s", TASK, "interval", "60", "UTC", {}, None, False,
        bounds=task_bounds(task_options),
    )  # fmt: skip
    assert schedule_inserts.options_of(spec, task_options) is task_options, "shared, not copied"
    own = replace(spec, bounds={**spec.bounds, "max_runs": 3, "calendar": None})
    assert schedule_inserts.options_of(own, task_options) == {
        **task_options,
        **own.bounds,
    }
    assert schedule_inserts.changed_options('{"overlap": "allow"}', spec, spec) == {}
    changed = schedule_inserts.changed_options('{"overlap": "allow"}', spec, own)
    assert changed == {"options": {"overlap": "allow", **own.bounds}}
