"""slotcron.store.registrations: job rows and instance rows, and what the leader reads of them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from slotcron.schedule.slots import IntervalSchedule, shared
from slotcron.store import leadership, registrations
from slotcron.store.database import Database
from slotcron.store.registrations import JobRow
from slotcron.store.tables import instances, jobs

from tests.store.common import (
    NEXT,
    NOW,
    SLOT,
    TASK,
    add_schedules,
    job_row,
    record_tasks,
    set_job,
    table_rows,
)

LATER = NOW + timedelta(minutes=5)


def row(name: str, schedule: str = "* * * * *", first: datetime = NEXT) -> JobRow:
    return JobRow(
        name=name,
        kind="cron",
        schedule=schedule,
        timezone="UTC",
        options={"max_attempts": 2},
        first_slot=first,
        slots=shared(schedule, "UTC"),
    )


async def test_register_jobs_inserts_new_rows_and_keeps_the_clusters_columns(
    db: Database,
) -> None:
    names = ["job", "Job", "job ", "JOB"]
    first = await registrations.register_jobs(
        db, [row(n) for n in names], now=NOW, instance_id="a", version="1"
    )
    assert set(first.stored) == set(names) and first.took_over == set()
    assert set(first.fingerprints) == set(names)
    assert [r["name"] for r in await table_rows(db, jobs)] == sorted(names)
    stored = await job_row(db, "job")
    assert (stored["kind"], stored["schedule"], stored["options"], stored["next_slot_at"]) == (
        "cron",
        "* * * * *",
        {"max_attempts": 2},
        NEXT,
    )
    assert stored["schedules"] == {"1": "* * * * * (UTC)"}
    assert stored["fingerprint"] == first.fingerprints["job"]
    await set_job(db, "job", paused=True, last_slot_at=SLOT, next_slot_at=SLOT)

    same = await registrations.register_jobs(
        db, [row("job", "*/1 * * * *", LATER)], now=LATER, instance_id="b", version="2"
    )
    assert same.took_over == set(), "the same slots, written otherwise: the one in force stays"
    assert same.fingerprints["job"] == first.fingerprints["job"]
    assert same.stored["job"].schedule == "* * * * *" and same.stored["job"].updated_by == "a"
    stored = await job_row(db, "job")
    assert (stored["paused"], stored["last_slot_at"], stored["next_slot_at"]) == (
        True,
        SLOT,
        SLOT,
    )
    assert (stored["schedule"], stored["updated_by"], stored["registered_at"]) == (
        "*/1 * * * *",
        "b",
        NOW,
    )
    assert stored["schedules"] == {"1": "* * * * * (UTC)", "2": "*/1 * * * * (UTC)"}


async def test_a_changed_schedule_takes_over_with_a_new_fingerprint(db: Database) -> None:
    await registrations.register_jobs(db, [row("job")], now=NOW, instance_id="a", version="1")
    hourly = JobRow(
        "job", "interval", "3600", "UTC", {}, LATER, IntervalSchedule(timedelta(hours=1))
    )
    changed = await registrations.register_jobs(db, [hourly], now=NOW, instance_id="b", version="2")
    assert changed.took_over == {"job"}
    stored = await job_row(db, "job")
    assert (stored["kind"], stored["next_slot_at"], stored["fingerprint"]) == (
        "interval",
        LATER,
        changed.fingerprints["job"],
    )
    assert changed.stored["job"].fingerprint != changed.fingerprints["job"]


async def test_mark_superseded_records_who_stopped_firing_a_job(db: Database) -> None:
    await registrations.register_jobs(
        db, [row("job"), row("Job")], now=NOW, instance_id="a", version="1"
    )
    await registrations.mark_superseded(
        db, ["job", "gone"], instance_id="old", schedules={"job": "0 * * * * (UTC)"}
    )
    await registrations.mark_superseded(db, ["job"], instance_id="older", schedules={})
    assert (await job_row(db, "job"))["superseded"] == {"old": "0 * * * * (UTC)", "older": "?"}
    assert (await job_row(db, "Job"))["superseded"] == {}
    # Registering again ends that instance's supersession.
    await registrations.register_jobs(db, [row("job")], now=NOW, instance_id="old", version="1")
    assert (await job_row(db, "job"))["superseded"] == {"older": "?"}


async def instance_rows(db: Database) -> dict[str, tuple[object, ...]]:
    return {
        r["instance_id"]: (r["host"], r["pid"], r["state"], r["started_at"], r["heartbeat_at"])
        for r in await table_rows(db, instances)
    }


async def test_register_instance_and_set_instance_state(db: Database) -> None:
    for name in ("a", "A"):
        await registrations.register_instance(
            db, instance_id=name, host="h1", pid=1, version="1", now=NOW
        )
    await registrations.set_instance_state(db, instance_id="a", state="draining", now=LATER)
    assert await instance_rows(db) == {
        "a": ("h1", 1, "draining", NOW, LATER),
        "A": ("h1", 1, "running", NOW, NOW),
    }
    await registrations.register_instance(
        db, instance_id="a", host="h2", pid=2, version="2", now=LATER
    )
    assert (await instance_rows(db))["a"] == ("h2", 2, "running", LATER, LATER)


async def test_list_instances_newest_heartbeat_first_with_the_live_leader(db: Database) -> None:
    now = datetime.now(UTC)
    for n, name in enumerate(("old", "new", "leader")):
        await registrations.register_instance(
            db, instance_id=name, host="h", pid=n, version="1", now=now - timedelta(seconds=9 - n)
        )
    assert await leadership.take(db, instance_id="leader", now=now, lease=60)
    listed = await registrations.list_instances(db)
    assert [(i.instance_id, i.leader, i.pid) for i in listed] == [
        ("leader", True, 2),
        ("new", False, 1),
        ("old", False, 0),
    ]
    assert listed[0].heartbeat_at == now - timedelta(seconds=7)
    await leadership.resign(db, instance_id="leader")
    assert not any(i.leader for i in await registrations.list_instances(db))


async def test_overdue_jobs_are_code_jobs_whose_expected_slot_passed(db: Database) -> None:
    await registrations.register_jobs(
        db,
        [row("late", first=SLOT), row("later", first=NEXT), row("Late", first=SLOT - timedelta(1))],
        now=NOW,
        instance_id="a",
        version="1",
    )
    await record_tasks(db, TASK)
    await add_schedules(db, {"task": TASK, "every": 60, "id": "schedule"}, now=SLOT - timedelta(1))
    before = NEXT + timedelta(seconds=1)
    assert await registrations.overdue_jobs(db, before=before) == [
        ("Late", SLOT - timedelta(1)),
        ("late", SLOT),
        ("later", NEXT),
    ]
    assert await registrations.overdue_jobs(db, before=before, limit=1) == [
        ("Late", SLOT - timedelta(1))
    ]
    assert await registrations.overdue_jobs(db, before=SLOT - timedelta(2)) == []


async def test_mark_silent_instances_records_the_dead_stopped(db: Database) -> None:
    for name, beat in (("silent", NOW), ("live", LATER), ("Silent", NOW - timedelta(1))):
        await registrations.register_instance(
            db, instance_id=name, host="h", pid=1, version="1", now=beat
        )
    await registrations.set_instance_state(
        db, instance_id="Silent", state="stopped", now=NOW - timedelta(1)
    )
    assert await registrations.mark_silent_instances(db, before=LATER) == ["silent"]
    assert await registrations.mark_silent_instances(db, before=LATER) == []
    states = {i: s[2] for i, s in (await instance_rows(db)).items()}
    assert states == {"silent": "stopped", "live": "running", "Silent": "stopped"}
