"""Schedules at runtime through ``slotcron.Client`` and the store, on every backend (issue 15).

Tasks are recorded the way an instance records them at start (``register_tasks``), so the
client, which imports no task code here, knows them; the local-registry path is tested too.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from slotcron import Client, InvalidJobError, JobContext
from slotcron.errors import NotFound, Refused
from slotcron.jobs.registry import Registry, cron, task
from slotcron.jobs.schedules import IdTaken
from slotcron.store import operations
from slotcron.store import schedules as store
from slotcron.store.database import Database
from slotcron.store.registrations import JobRow, register_jobs
from slotcron.store.tables import executions, jobs
from sqlalchemy import func, select, update

from tests.conftest import Services

TASK = "tests.send_report"
CODE_JOB = "tests.code-job"


def tasks() -> Registry:
    registry = Registry()

    @task(name=TASK, max_attempts=3, registry=registry)
    async def send_report(ctx: JobContext) -> None:
        pass

    @task(name="tests.seoul", timezone="Asia/Seoul", registry=registry)
    async def seoul(ctx: JobContext) -> None:
        pass

    return registry


async def record_tasks(db: Database) -> None:
    """What an instance of the task code does at start."""
    now = datetime.now(UTC)
    await store.register_tasks(db, tasks().tasks(), now=now, instance_id="test", version="0")


async def add_code_job(db: Database) -> None:
    row = JobRow(CODE_JOB, "cron", "0 0 1 1 *", "UTC", {}, datetime(2030, 1, 1, tzinfo=UTC))
    await register_jobs(db, [row], now=datetime.now(UTC), instance_id="test", version="0")


async def schedule_rows(db: Database) -> int:
    async with db.read() as conn:
        count = await conn.scalar(
            select(func.count()).select_from(jobs).where(jobs.c.task.is_not(None))
        )
    return int(count or 0)


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


async def test_a_schedule_is_added_read_changed_and_removed_through_the_client(
    db: Database, db_url: str
) -> None:
    await record_tasks(db)
    async with Client(db_url) as client:
        added = await client.add_schedule(
            TASK, cron="0 9 * * *", timezone="Asia/Seoul", params={"tenant_id": 42}
        )
        assert added["id"].startswith(f"{TASK}/") and len(added["id"]) == len(TASK) + 13
        assert added["task"] == TASK and added["cron"] == "0 9 * * *" and added["every"] is None
        assert added["params"] == {"tenant_id": 42} and added["paused"] is False
        # 09:00 in Seoul is 00:00 UTC.
        slot = utc(added["next_slot"])
        assert (slot.hour, slot.minute) == (0, 0) and slot > utc(added["created_at"])
        assert await client.get_schedule(added["id"]) == added

        changed = await client.update_schedule(added["id"], every=30, params={"tenant_id": 43})
        assert changed["cron"] is None and changed["every"] == 30
        assert changed["params"] == {"tenant_id": 43}
        assert utc(changed["next_slot"]).timestamp() % 30 == 0
        assert changed["created_at"] == added["created_at"]

        await client.remove_schedule(added["id"])
        with pytest.raises(NotFound):
            await client.get_schedule(added["id"])
        assert await client.list_schedules() == []
    assert await schedule_rows(db) == 0


async def test_a_schedule_without_a_zone_takes_its_tasks_zone_then_the_default(
    db: Database, db_url: str
) -> None:
    await record_tasks(db)
    async with Client(db_url, timezone="Europe/Paris") as client:
        seoul = await client.add_schedule("tests.seoul", cron="0 9 * * *")
        paris = await client.add_schedule(TASK, cron="0 9 * * *")
    assert seoul["timezone"] == "Asia/Seoul"
    assert paris["timezone"] == "Europe/Paris"


async def test_add_schedules_stores_a_batch_in_id_order_and_lists_it_by_task_and_page(
    db: Database, db_url: str
) -> None:
    await record_tasks(db)
    async with Client(db_url) as client:
        batch = [{"task": TASK, "every": 60, "id": f"tenant-{i:04d}"} for i in range(2500)]
        batch.append({"task": "tests.seoul", "cron": "0 9 * * *", "id": "seoul-1"})
        added = await client.add_schedules(batch)
        assert [a["id"] for a in added] == [b["id"] for b in batch]
        assert len(await client.list_schedules(TASK)) == 2500
        page = await client.list_schedules(TASK, limit=3, offset=10)
        assert [p["id"] for p in page] == ["tenant-0010", "tenant-0011", "tenant-0012"]
        assert [s["id"] for s in await client.list_schedules("tests.seoul")] == ["seoul-1"]
    assert await schedule_rows(db) == 2501


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"task": "tests.nobody-registers-this", "every": 10}, "task"),
        ({"task": TASK, "cron": "61 * * * *"}, "cron"),
        ({"task": TASK, "cron": "* * * *"}, "cron"),
        ({"task": TASK, "cron": "0 9 * * *", "timezone": "Mars/Olympus"}, "timezone"),
        ({"task": TASK, "every": 0}, "every"),
        ({"task": TASK, "every": -5}, "every"),
        ({"task": TASK}, "cron"),
        ({"task": TASK, "every": 5, "cron": "* * * * *"}, "cron"),
        ({"task": TASK, "every": 5, "params": [1, 2]}, "params"),
        ({"task": TASK, "every": 5, "params": {"when": datetime.now(UTC)}}, "params"),
        ({"task": TASK, "every": 5, "jitter": -1}, "jitter"),
        ({"task": TASK, "every": 5, "jitter": "soon"}, "jitter"),
        ({"task": TASK, "every": 5, "id": ""}, "id"),
        ({"task": TASK, "every": 5, "id": "x" * 201}, "id"),
        ({"task": TASK, "every": 5, "colour": "red"}, "colour"),
        # Issue 26: the limits, the same here as in the API, the CLI and the decorators.
        ({"task": TASK, "every": 0.001}, "every"),
        ({"task": TASK, "every": 0.5}, "every"),
        ({"task": TASK, "cron": "0 9 * * *", "timezone": "America"}, "timezone"),
        ({"task": TASK, "cron": "0 9 * * *", "timezone": ""}, "timezone"),
        ({"task": TASK, "cron": "0 9 * * *", "timezone": "../zoneinfo/UTC"}, "timezone"),
        ({"task": TASK, "every": 5, "id": "tenant\n42"}, "id"),
        ({"task": TASK, "every": 5, "id": "tenant\x1b[2J"}, "id"),
        ({"task": TASK, "every": 5, "id": "tenant\x85"}, "id"),
        ({"task": TASK, "every": 5, "params": {"n": 10**64}}, "params"),
        ({"task": TASK, "every": 5, "params": {"p": "x" * 70_000}}, "params"),
    ],
)
async def test_bad_input_is_refused_naming_the_field_and_nothing_is_written(
    db: Database, db_url: str, fields: dict[str, Any], field: str
) -> None:
    await record_tasks(db)
    async with Client(db_url) as client:
        with pytest.raises(InvalidJobError) as refused:
            # The good schedule first: a refused batch writes none of it.
            await client.add_schedules([{"task": TASK, "every": 5, "id": "good"}, fields])
    assert refused.value.field == field, refused.value
    assert await schedule_rows(db) == 0


async def test_an_id_taken_by_a_job_or_a_schedule_refuses_the_whole_batch(
    db: Database, db_url: str
) -> None:
    await record_tasks(db)
    await add_code_job(db)
    async with Client(db_url) as client:
        await client.add_schedule(TASK, every=5, id="taken")
        for clash in ("taken", CODE_JOB):
            batch = [{"task": TASK, "every": 5, "id": f"new-{i}"} for i in range(1500)]
            batch.append({"task": TASK, "every": 5, "id": clash})
            with pytest.raises(InvalidJobError, match=f"'{clash}': id: already taken"):
                await client.add_schedules(batch)
        with pytest.raises(InvalidJobError, match="given twice"):
            await client.add_schedules([{"task": TASK, "every": 5, "id": "twin"}] * 2)
        assert [s["id"] for s in await client.list_schedules()] == ["taken"]


async def test_ids_differing_in_case_accents_or_trailing_spaces_are_different_schedules(
    db: Database, db_url: str
) -> None:
    """Issue 26, item 4: on MariaDB the default collation matched ``tenant/alpha`` to
    ``Tenant/Alpha``; ids now compare byte for byte on every backend."""
    await record_tasks(db)
    variants = ["tenant/alpha", "Ténant/Alpha", "Tenant/Alpha ", "TENANT/ALPHA"]
    async with Client(db_url) as client:
        await client.add_schedule(TASK, every=60, id="Tenant/Alpha", params={"key": "alpha-1"})
        for i, variant in enumerate(variants[:3]):
            added = await client.add_schedule(TASK, every=60, id=variant, params={"i": i})
            assert added["id"] == variant
        assert [(await client.get_schedule(v))["params"] for v in variants[:3]] == [
            {"i": 0},
            {"i": 1},
            {"i": 2},
        ]
        with pytest.raises(NotFound):
            await client.get_schedule(variants[3])
        with pytest.raises(NotFound):
            await client.update_schedule(variants[3], params={"overwritten": True})
        with pytest.raises(NotFound):
            await client.remove_schedule(variants[3])
        await client.update_schedule("tenant/alpha", params={"changed": True})
        await client.remove_schedule("Tenant/Alpha ")
        original = await client.get_schedule("Tenant/Alpha")
        assert original["params"] == {"key": "alpha-1"}
        ids = sorted(s["id"] for s in await client.list_schedules())
        assert ids == sorted(["Tenant/Alpha", "tenant/alpha", "Ténant/Alpha"])


async def test_an_exact_duplicate_id_is_a_clean_refusal_holding_no_other_rows_data(
    db: Database, db_url: str
) -> None:
    await record_tasks(db)
    async with Client(db_url) as client:
        await client.add_schedule(TASK, every=60, id="Tenant/Alpha", params={"key": "alpha-1"})
        await client.add_schedule(TASK, every=60, id="other", params={"key": "other-secret"})
        for batch in (
            [{"task": TASK, "every": 60, "id": "Tenant/Alpha", "params": {"k": "mine"}}],
            [{"task": TASK, "every": 60, "id": f"n-{i}", "params": {"k": i}} for i in range(300)]
            + [{"task": TASK, "every": 60, "id": "other"}],
        ):
            with pytest.raises(InvalidJobError) as refused:
                await client.add_schedules(batch)
            assert refused.value.field == "id"
            assert type(refused.value) is InvalidJobError, "not a driver's error"
            assert "secret" not in str(refused.value) and "alpha-1" not in str(refused.value)
            assert "INSERT" not in str(refused.value)
    # The store's own refusal is a conflict (exit 1, HTTP 409), not bad input.
    with pytest.raises(IdTaken) as taken:
        await store.create(
            db,
            [{"task": TASK, "every": 60, "id": "Tenant/Alpha"}],
            default_timezone="UTC",
            by="test",
            registry=tasks(),
        )
    assert isinstance(taken.value, Refused) and taken.value.id == "Tenant/Alpha"
    assert await schedule_rows(db) == 2


async def test_triggering_a_variant_of_an_id_queues_nothing(db: Database, db_url: str) -> None:
    """A manual run of ``tenant/alpha`` used to be queued when only ``Tenant/Alpha`` existed
    (MariaDB), and waited QUEUED forever: no instance knows a job of that name."""
    await record_tasks(db)
    async with Client(db_url) as client:
        await client.add_schedule(TASK, every=60, id="Tenant/Alpha")
    for variant in ("tenant/alpha", "Ténant/Alpha", "Tenant/Alpha "):
        with pytest.raises(NotFound):
            await operations.trigger(db, job=variant, params={}, now=datetime.now(UTC))
    async with db.read() as conn:
        assert await conn.scalar(select(func.count()).select_from(executions)) == 0


async def test_a_code_job_cannot_be_updated_or_removed_at_runtime(
    db: Database, db_url: str
) -> None:
    await add_code_job(db)
    async with Client(db_url) as client:
        with pytest.raises(Refused, match="owned by its code"):
            await client.update_schedule(CODE_JOB, every=5)
        with pytest.raises(Refused, match="owned by its code"):
            await client.remove_schedule(CODE_JOB)
        with pytest.raises(NotFound):
            await client.get_schedule(CODE_JOB)
        with pytest.raises(NotFound):
            await client.remove_schedule("no-such-schedule")
    async with db.read() as conn:
        row = (await conn.execute(select(jobs).where(jobs.c.name == CODE_JOB))).one()
    assert row.schedule == "0 0 1 1 *"


async def test_a_bad_update_writes_nothing(db: Database, db_url: str) -> None:
    await record_tasks(db)
    async with Client(db_url) as client:
        before = await client.add_schedule(TASK, cron="0 9 * * *", id="steady")
        with pytest.raises(InvalidJobError) as refused:
            await client.update_schedule("steady", cron="nope")
        assert refused.value.field == "cron"
        with pytest.raises(InvalidJobError) as refused:
            await client.update_schedule("steady", every=60, timezone="Nowhere/X")
        assert refused.value.field == "timezone"
        assert await client.get_schedule("steady") == before


async def test_an_update_never_reopens_a_decided_slot(db: Database, db_url: str) -> None:
    await record_tasks(db)
    decided = datetime.now(UTC).replace(second=0, microsecond=0) + timedelta(hours=2)
    async with Client(db_url) as client:
        await client.add_schedule(TASK, every=60, id="decided")
        # As if a claim had decided the slots up to two hours from now (a catch-up, a trigger).
        async with db.transaction() as conn:
            await conn.execute(
                update(jobs).where(jobs.c.name == "decided").values(last_slot_at=decided)
            )
        changed = await client.update_schedule("decided", every=10)
    assert utc(changed["next_slot"]) == decided + timedelta(seconds=10)


async def test_a_task_registered_in_this_process_is_known_before_any_instance_records_it(
    db: Database,
) -> None:
    registry = tasks()
    [record] = await store.create(
        db, [{"task": TASK, "every": 5}], default_timezone="UTC", by="test", registry=registry
    )
    assert record.spec.task == TASK
    async with db.read() as conn:
        options = await conn.scalar(select(jobs.c.options).where(jobs.c.name == record.spec.id))
    # The task's options travel with its schedules.
    assert options is not None and options["max_attempts"] == 3


async def test_a_schedule_is_paused_and_resumed_by_its_id_like_a_job(
    db: Database, db_url: str
) -> None:
    await record_tasks(db)
    async with Client(db_url) as client:
        await client.add_schedule(TASK, every=5, id="pausable", paused=True)
        assert (await client.get_schedule("pausable"))["paused"] is True
        assert await operations.set_paused(db, job="pausable", paused=False, reason=None)
        assert (await client.get_schedule("pausable"))["paused"] is False
        # and it is not listed among the code jobs
        listed = await operations.list_jobs(db, now=datetime.now(UTC), live_within=60)
        assert "pausable" not in [j.name for j in listed]


async def test_a_write_is_announced_when_it_commits_on_postgresql(
    backend: str, db: Database, db_url: str
) -> None:
    if backend != "postgresql":
        pytest.skip("only PostgreSQL has notifications; other backends' instances poll")
    await record_tasks(db)
    heard: asyncio.Queue[str] = asyncio.Queue()
    listening = await db.dialect.listen(db.engine, store.CHANNEL, heard.put_nowait)
    assert listening is not None
    try:
        async with Client(db_url) as client:
            added = await client.add_schedule(TASK, every=5, id="announced")
            assert await asyncio.wait_for(heard.get(), 1) == f"add {added['next_slot']}"
            changed = await client.update_schedule("announced", every=7)
            expected = f"update announced {changed['next_slot']}"
            assert await asyncio.wait_for(heard.get(), 1) == expected
            # Slots hours away need no word: the firing's range query finds them in time.
            await client.add_schedule(TASK, cron="0 0 1 1 *", id="far")
            await client.update_schedule("far", cron="0 0 2 1 *")
            await client.remove_schedule("far")
            await client.remove_schedule("announced")
            assert await asyncio.wait_for(heard.get(), 1) == "remove announced"
            assert heard.empty()
    finally:
        await listening.close()


async def test_an_instance_records_its_tasks_so_a_client_without_the_code_knows_them(
    db_url: str, services: Services
) -> None:
    async with Client(db_url) as client:
        with pytest.raises(InvalidJobError, match="unknown task"):
            await client.add_schedule(TASK, every=5)
    await services.start(tasks=tasks().tasks())
    async with Client(db_url) as client:
        added = await client.add_schedule(TASK, every=5)
    assert added["task"] == TASK


async def test_a_code_job_named_like_a_schedule_refuses_to_start_and_leaves_it_alone(
    db: Database, db_url: str, services: Services
) -> None:
    await record_tasks(db)
    async with Client(db_url) as client:
        before = await client.add_schedule(TASK, cron="0 9 * * *", id="clash")
    registry = Registry()

    @cron("* * * * *", name="clash", registry=registry)
    async def clash() -> None:
        pass

    service = services.make(list(registry), tasks=[])
    try:
        with pytest.raises(InvalidJobError, match="'clash': name: is the id of a runtime"):
            await service.start()
    finally:
        await service.stop()
    async with Client(db_url) as client:
        assert await client.get_schedule("clash") == before
