"""slotcron.store.schedules: runtime schedules stored, changed, removed and read, each a row of
the jobs table, and the tasks instances record."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from slotcron.errors import InvalidJobError, NotFound, Refused
from slotcron.jobs.registry import Registry
from slotcron.jobs.schedules import IdTaken, ScheduleSpec, TaskInfo, new_spec
from slotcron.store import schedules
from slotcron.store.database import Database
from slotcron.store.tables import jobs, tasks

from tests.store.common import (
    NEXT,
    NOW,
    ODD,
    SLOT,
    TASK,
    add_run,
    add_schedules,
    differs_on,
    is_utc,
    job_row,
    record_tasks,
    register,
    run_row,
    table_rows,
    task_registry,
)

LATER = NOW + timedelta(seconds=5)


async def test_register_tasks_records_and_refreshes_what_known_tasks_reads(db: Database) -> None:
    await record_tasks(db, TASK, "tests.Report", max_attempts=3)
    await record_tasks(db, "tests.seoul", timezone="Asia/Seoul")
    await schedules.register_tasks(db, [], now=NOW, instance_id="x", version="x")
    rows = {r["name"]: r for r in await table_rows(db, tasks)}
    assert sorted(rows) == ["tests.Report", "tests.report", "tests.seoul"]
    assert (rows[TASK]["updated_by"], rows[TASK]["version"], rows[TASK]["registered_at"]) == (
        "test",
        "test",
        NOW,
    )
    known = await schedules.known_tasks(db, [TASK, "tests.seoul", "tests.none"], Registry())
    assert set(known) == {TASK, "tests.seoul"}
    assert known[TASK].options["max_attempts"] == 3 and known[TASK].timezone is None
    assert known["tests.seoul"].timezone == "Asia/Seoul"

    # A newer instance's registration refreshes the row (its creation stays).
    await record_tasks(db, TASK, instance="newer", now=LATER, max_attempts=5)
    row = next(r for r in await table_rows(db, tasks) if r["name"] == TASK)
    assert (row["registered_at"], row["updated_at"], row["updated_by"]) == (NOW, LATER, "newer")
    assert row["options"]["max_attempts"] == 5
    # This process's own @task comes first.
    local = await schedules.known_tasks(db, [TASK], task_registry(TASK, max_attempts=9))
    assert local[TASK].options["max_attempts"] == 9


async def test_create_checks_and_stores_schedules_and_remembers_their_tasks(
    db: Database,
) -> None:
    await record_tasks(db, TASK)
    await record_tasks(db, "tests.seoul", timezone="Asia/Seoul")
    remembered: dict[str, TaskInfo] = {}
    made = await schedules.create(
        db,
        [
            {"task": TASK, "every": 60, "id": "tenant/1", "params": {"tenant": 1}},
            {"task": "tests.seoul", "cron": "0 9 * * *"},
        ],
        default_timezone="Europe/Paris",
        by="cli",
        registry=Registry(),
        now=NOW,
        remembered=remembered,
    )
    assert set(remembered) == {TASK, "tests.seoul"}
    first, second = made
    assert (first.spec.id, first.spec.kind, first.spec.expression, first.next_slot) == (
        "tenant/1",
        "interval",
        "60",
        NEXT,
    )
    assert re.fullmatch(r"tests\.seoul/[0-9a-f]{12}", second.spec.id)
    assert second.spec.timezone == "Asia/Seoul", "the task's zone before the default"
    row = await job_row(db, "tenant/1")
    assert (row["task"], row["kind"], row["schedule"], row["timezone"], row["params"]) == (
        TASK,
        "interval",
        "60",
        "Europe/Paris",
        {"tenant": 1},
    )
    assert (row["next_slot_at"], row["registered_at"], row["updated_by"]) == (NEXT, NOW, "cli")
    assert row["fingerprint"].startswith("v:") and row["options"]["max_attempts"] == 1
    with pytest.raises(InvalidJobError):  # an unknown task: refused, nothing written
        await add_schedules(db, {"task": "tests.none", "every": 60})
    assert len(await schedules.list_schedules(db)) == 2


async def test_add_and_add_many_store_all_or_none(db: Database) -> None:
    await record_tasks(db, TASK)
    await register(db, "code-job")
    info = (await schedules.known_tasks(db, [TASK], Registry()))[TASK]

    def spec(schedule_id: str, every: int = 60) -> ScheduleSpec:
        fields = {"task": TASK, "every": every, "id": schedule_id}
        return new_spec(fields, task=info, default_timezone="UTC")

    one = await schedules.add(db, spec("one", 30), task=info, now=NOW, by="me")
    assert (one.spec.id, one.created_at, one.updated_at) == ("one", NOW, NOW)
    # Ids that differ only by case or trailing spaces are distinct schedules.
    ids = ["tenant/a", "Tenant/a", "tenant/a ", "TENANT/A", "tenant/b"]  # 5 rows: a transaction
    batch = [spec(i) for i in ids]
    added = await schedules.add_many(db, batch, tasks={TASK: info}, now=NOW, by="me")
    assert [r.spec.id for r in added] == ids
    assert [r.spec.id for r in await schedules.list_schedules(db)] == sorted(["one", *ids])

    for taken in (["new-1", "new-2", "tenant/a", "new-3"], ["new-1", "code-job"], ["one"]):
        specs = [spec(i) for i in taken]
        with pytest.raises(IdTaken) as refused:
            await schedules.add_many(db, specs, tasks={TASK: info}, now=NOW, by="me")
        assert refused.value.id in ("tenant/a", "code-job", "one")
    twice = [batch[0], batch[0]]
    with pytest.raises(InvalidJobError, match="given twice"):
        await schedules.add_many(db, twice, tasks={TASK: info}, now=NOW, by="me")
    assert len(await schedules.list_schedules(db)) == 6, "a refused batch stored none"


async def test_update_moves_the_next_slot_only_for_a_new_timing(db: Database) -> None:
    await record_tasks(db, TASK)
    await register(db, "code-job")
    (added,) = await add_schedules(db, {"task": TASK, "every": 60, "id": "s"})
    mark = (await job_row(db, "s"))["fingerprint"]

    params = await schedules.update(db, "s", {"params": {"v": 2}}, now=LATER, by="api")
    assert (params.next_slot, params.spec.params, params.created_at) == (NEXT, {"v": 2}, NOW)
    row = await job_row(db, "s")
    assert (row["params"], row["updated_at"], row["updated_by"]) == ({"v": 2}, LATER, "api")
    assert row["fingerprint"] != mark, "a new version: a claim presenting the old is refused"

    timing = await schedules.update(db, "s", {"every": 3600, "paused": True}, now=LATER, by="api")
    assert timing.next_slot == SLOT.replace(minute=0) + timedelta(hours=1)
    row = await job_row(db, "s")
    assert (row["schedule"], row["paused"], row["next_slot_at"]) == ("3600", True, timing.next_slot)

    with pytest.raises(NotFound):
        await schedules.update(db, "S", {"paused": False}, now=LATER, by="api")
    with pytest.raises(Refused):
        await schedules.update(db, "code-job", {"paused": True}, now=LATER, by="api")
    assert added.spec.id == "s"


async def test_remove_deletes_the_schedule_settles_its_queue_and_keeps_history(
    db: Database,
) -> None:
    await record_tasks(db, TASK)
    await register(db, "code-job")
    await add_schedules(
        db, {"task": TASK, "every": 60, "id": "s"}, {"task": TASK, "every": 60, "id": "S"}
    )
    done = await add_run(db, "s", status="COMPLETED")
    waiting = await add_run(db, "s", NEXT, status="QUEUED", trigger="manual")
    await schedules.remove(db, "s", now=LATER)
    with pytest.raises(NotFound):
        await schedules.get(db, "s")
    assert (await schedules.get(db, "S")).spec.id == "S"
    assert (await run_row(db, done))["status"] == "COMPLETED"
    row = await run_row(db, waiting)
    assert (row["status"], row["finished_at"]) == ("SKIPPED", LATER)
    with pytest.raises(NotFound):
        await schedules.remove(db, "s", now=LATER)
    with pytest.raises(Refused):
        await schedules.remove(db, "code-job", now=LATER)
    assert [r["name"] for r in await table_rows(db, jobs)] == ["S", "code-job"]


async def test_get_reads_a_schedule_back_as_written(db: Database) -> None:
    await record_tasks(db, TASK)
    await register(db, "code-job")
    (added,) = await add_schedules(
        db,
        {"task": TASK, "cron": "*/5 * * * *", "id": "é/ü", "jitter": 1.5, "params": {"k": [1]}},
        now=ODD,
    )
    got = await schedules.get(db, "é/ü")
    assert got == added
    assert got.created_at == ODD and is_utc(got.created_at) and got.created_at.microsecond == 123457
    assert got.next_slot is not None and is_utc(got.next_slot)
    assert (got.spec.jitter, got.spec.params, got.spec.paused) == (1.5, {"k": [1]}, False)
    with pytest.raises(NotFound):
        await schedules.get(db, "code-job")
    with pytest.raises(NotFound):
        await schedules.get(db, "É/ü")


async def test_list_schedules_by_task_and_page(db: Database) -> None:
    await record_tasks(db, TASK, "tests.other")
    await register(db, "code-job")
    ids = [f"t-{n:02d}" for n in range(7)]
    await add_schedules(db, *({"task": TASK, "every": 60, "id": i} for i in reversed(ids)))
    await add_schedules(db, {"task": "tests.other", "every": 60, "id": "o"})
    assert [r.spec.id for r in await schedules.list_schedules(db)] == ["o", *ids]
    assert [r.spec.id for r in await schedules.list_schedules(db, task=TASK)] == ids
    pages = [
        [r.spec.id for r in await schedules.list_schedules(db, task=TASK, limit=3, offset=o)]
        for o in (0, 3, 6, 9)
    ]
    assert pages == [ids[:3], ids[3:6], ids[6:], []]
    assert await schedules.list_schedules(db, task="tests.none") == []


async def test_last_runs_is_each_schedules_latest_run_not_queued(db: Database) -> None:
    await record_tasks(db, TASK)
    await add_schedules(
        db, *({"task": TASK, "every": 60, "id": i} for i in ("ran", "Ran", "queued", "never"))
    )
    await add_run(db, "ran", SLOT, status="FAILED")
    await add_run(db, "ran", NEXT, status="COMPLETED")
    await add_run(db, "ran", NEXT + timedelta(minutes=1), status="QUEUED", trigger="manual")
    await add_run(db, "Ran", SLOT, status="RUNNING")
    await add_run(db, "queued", SLOT, status="QUEUED", trigger="manual")
    last = await schedules.last_runs(db, ["ran", "Ran", "queued", "never", "gone"])
    assert last == {
        "ran": schedules.LastRun("COMPLETED", NEXT),
        "Ran": schedules.LastRun("RUNNING", SLOT),
    }
    assert await schedules.last_runs(db, []) == {}
    with pytest.raises(ValueError):
        await schedules.last_runs(db, ["x"] * (schedules.CHUNK + 1))


async def test_schedule_ids_among_tells_schedules_from_code_jobs(db: Database) -> None:
    await record_tasks(db, TASK)
    await register(db, "code-job")
    await add_schedules(db, {"task": TASK, "every": 60, "id": "s"})
    found = await schedules.schedule_ids_among(db, ["s", "S", "code-job", "none"])
    assert found == ["s"]
    assert await schedules.schedule_ids_among(db, []) == []


async def test_version_mark_is_new_with_every_write(db: Database) -> None:
    marks = {schedules.version_mark() for _ in range(50)}
    assert len(marks) == 50 and all(re.fullmatch(r"v:[0-9a-f]{16}", m) for m in marks)
    await record_tasks(db, TASK)
    await add_schedules(db, {"task": TASK, "every": 60, "id": "s"})
    seen = {(await job_row(db, "s"))["fingerprint"]}
    for n in range(3):
        await schedules.update(db, "s", {"params": {"n": n}}, now=NOW, by="t")
        seen.add((await job_row(db, "s"))["fingerprint"])
    assert len(seen) == 4


async def test_a_schedules_jitter_reads_back_as_written(
    db: Database, backend: str, request: pytest.FixtureRequest
) -> None:
    differs_on(
        request,
        backend,
        "mariadb",
        "scheduler_jobs.jitter is sa.Float() without precision: FLOAT, single precision, on "
        "MariaDB (1.2345678 reads back 1.23457)",
    )
    await record_tasks(db, TASK)
    (added,) = await add_schedules(db, {"task": TASK, "every": 60, "id": "s", "jitter": 1.2345678})
    assert added.spec.jitter == 1.2345678
    assert (await schedules.get(db, "s")).spec.jitter == 1.2345678
