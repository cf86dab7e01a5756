"""slotcron.store.operations: what operators ask of the cluster, each one transaction writing a
row the instances act on."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from slotcron.errors import MAX_QUEUED, InvalidJobError, NotFound, QueueFull, Refused
from slotcron.jobs.checks import MAX_JSON_DEPTH
from slotcron.store import operations, registrations
from slotcron.store.database import Database
from slotcron.store.tables import executions
from sqlalchemy import insert

from tests.store.common import (
    NEXT,
    NOW,
    ODD,
    SLOT,
    TASK,
    add_run,
    add_schedules,
    job_row,
    nested,
    record_tasks,
    register,
    run_row,
    table_rows,
)

LATER = NOW + timedelta(seconds=5)


async def instance(db: Database, name: str, beat: datetime, version: str = "1") -> None:
    await registrations.register_instance(
        db, instance_id=name, host="h", pid=1, version=version, now=beat
    )


async def test_live_instances_are_running_and_heartbeating_within(db: Database) -> None:
    await instance(db, "live", NOW)
    await instance(db, "Live", NOW - timedelta(seconds=9))
    await instance(db, "silent", NOW - timedelta(seconds=11))
    await instance(db, "draining", NOW)
    await registrations.set_instance_state(db, instance_id="draining", state="draining", now=NOW)
    assert sorted(await operations.live_instances(db, now=NOW, within=10)) == ["Live", "live"]
    assert await operations.live_instances(db, now=NOW + timedelta(minutes=1), within=10) == []


async def test_restart_queues_the_next_attempt_of_a_failed_slot_once(db: Database) -> None:
    await register(db, "job", "never", "Job")
    await registrations.register_jobs(
        db,
        [registrations.JobRow("never", "cron", "* * * * *", "UTC", {"restartable": False})],
        now=NOW,
        instance_id="t",
        version="t",
    )
    failed = await add_run(db, "job", status="FAILED", params={"p": 1}, state={"at": 3})
    queued = await operations.restart(db, execution_id=failed, now=LATER)
    assert (queued.job, queued.scheduled_at, queued.attempt, queued.trigger) == (
        "job",
        SLOT,
        2,
        "restart",
    )
    row = await run_row(db, queued.execution_id)
    assert (row["status"], row["available_at"], row["params"], row["state"]) == (
        "QUEUED",
        LATER,
        {"p": 1},
        {"at": 3},
    )
    with pytest.raises(Refused, match="already QUEUED"):
        await operations.restart(db, execution_id=failed, now=LATER)
    completed = await add_run(db, "job", NEXT, status="COMPLETED")
    with pytest.raises(Refused, match="COMPLETED"):
        await operations.restart(db, execution_id=completed, now=LATER)
    with pytest.raises(Refused, match="restartable=False"):
        await operations.restart(
            db, execution_id=await add_run(db, "never", status="STOPPED"), now=LATER
        )
    with pytest.raises(Refused, match="only FAILED"):
        await operations.restart(
            db, execution_id=await add_run(db, "Job", status="SKIPPED"), now=LATER
        )
    with pytest.raises(NotFound):
        await operations.restart(db, execution_id=10_000, now=LATER)
    with pytest.raises(NotFound):  # its job is gone
        await operations.restart(
            db, execution_id=await add_run(db, "gone", status="FAILED"), now=LATER
        )


async def test_trigger_queues_a_manual_run_at_its_own_slot(db: Database) -> None:
    await register(db, "job", "Job")
    first = await operations.trigger(db, job="job", params={"k": "é"}, now=ODD)
    second = await operations.trigger(db, job="job", params={}, now=ODD)
    assert (first.scheduled_at, second.scheduled_at) == (ODD, ODD + timedelta(microseconds=1))
    assert (first.attempt, first.trigger) == (1, "manual")
    row = await run_row(db, first.execution_id)
    assert (row["status"], row["available_at"], row["params"], row["job_name"]) == (
        "QUEUED",
        ODD,
        {"k": "é"},
        "job",
    )
    assert row["scheduled_at"].microsecond == 123457
    other = await operations.trigger(db, job="Job", params={}, now=ODD)
    assert other.scheduled_at == ODD, "another job's slots are its own"
    with pytest.raises(NotFound):
        await operations.trigger(db, job="JOB", params={}, now=ODD)
    with pytest.raises(InvalidJobError):
        await operations.trigger(db, job="job", params={"bad": float("nan")}, now=ODD)


async def test_a_job_may_have_at_most_max_queued_runs_waiting(db: Database) -> None:
    await register(db, "job")
    async with db.transaction() as conn:
        await conn.execute(
            insert(executions),
            [
                {
                    "job_name": "job",
                    "scheduled_at": SLOT + timedelta(seconds=n),
                    "trigger": "manual",
                    "status": "QUEUED",
                    "attempt": 1,
                    "created_at": NOW,
                    "available_at": NOW,
                }
                for n in range(MAX_QUEUED)
            ],
        )
    with pytest.raises(QueueFull):
        await operations.trigger(db, job="job", params={}, now=NOW)
    failed = await add_run(db, "job", NEXT + timedelta(hours=1), status="FAILED")
    with pytest.raises(QueueFull):
        await operations.restart(db, execution_id=failed, now=NOW)
    assert len(await table_rows(db, executions)) == MAX_QUEUED + 1


async def test_trigger_live_is_refused_while_no_instance_would_run_it(db: Database) -> None:
    await register(db, "job")
    with pytest.raises(Refused, match="no live instance"):
        await operations.trigger_live(db, job="job", params={}, now=NOW, live_within=10)
    assert await table_rows(db, executions) == []
    await instance(db, "live", NOW)
    queued = await operations.trigger_live(db, job="job", params={}, now=NOW, live_within=10)
    assert (await run_row(db, queued.execution_id))["status"] == "QUEUED"


async def test_set_paused_pauses_and_resumes_once(db: Database) -> None:
    await register(db, "job", "Job")
    assert await operations.set_paused(db, job="job", paused=True, reason="ops")
    assert not await operations.set_paused(db, job="job", paused=True, reason="again")
    row = await job_row(db, "job")
    assert (row["paused"], row["paused_reason"]) == (True, "ops")
    assert not (await job_row(db, "Job"))["paused"]
    assert await operations.set_paused(db, job="job", paused=False, reason="ignored")
    row = await job_row(db, "job")
    assert (row["paused"], row["paused_reason"]) == (False, None)
    with pytest.raises(NotFound):
        await operations.set_paused(db, job="JOB", paused=True, reason=None)


async def test_list_jobs_shows_code_jobs_with_their_last_outcome_and_drift(db: Database) -> None:
    now = datetime.now(UTC)
    await instance(db, "v1", now, "1")
    await instance(db, "v2", now, "2")
    await instance(db, "dead", now - timedelta(hours=1), "3")
    for version, schedule in (("1", "* * * * *"), ("2", "*/5 * * * *"), ("3", "0 * * * *")):
        await registrations.register_jobs(
            db,
            [registrations.JobRow("job", "cron", schedule, "UTC", {}, NEXT)],
            now=NOW,
            instance_id=f"v{version}",
            version=version,
        )
    await register(db, "Job", "idle")
    await registrations.mark_superseded(
        db, ["job"], instance_id="v1", schedules={"job": "* * * * * (UTC)"}
    )
    await registrations.mark_superseded(db, ["job"], instance_id="dead", schedules={})
    await add_run(db, "job", SLOT, status="FAILED", now=NOW)
    await add_run(db, "job", NEXT, status="COMPLETED", now=LATER)
    await add_run(db, "job", NEXT + timedelta(minutes=1), status="QUEUED", trigger="manual")
    await add_run(db, "Job", SLOT, status="SKIPPED")
    await record_tasks(db, TASK)
    await add_schedules(db, {"task": TASK, "every": 60, "id": "schedule"})
    await operations.set_paused(db, job="idle", paused=True, reason="ops")

    listed = {j.name: j for j in await operations.list_jobs(db, now=now, live_within=60)}
    assert list(listed) == ["Job", "idle", "job"]
    job = listed["job"]
    assert (job.last_status, job.last_slot, job.last_finished) == ("COMPLETED", NEXT, LATER)
    assert (job.schedule, job.registered_by, job.version, job.next_slot) == (
        "0 * * * *",
        "v3",
        "3",
        NEXT,
    )
    assert job.drift == {"1": "* * * * * (UTC)", "2": "*/5 * * * * (UTC)"}
    assert job.superseded == {"v1": "* * * * * (UTC)"}
    assert (listed["Job"].last_status, listed["Job"].drift) == ("SKIPPED", {})
    idle = listed["idle"]
    assert (idle.last_status, idle.paused, idle.paused_reason) == (None, True, "ops")


@pytest.mark.parametrize(
    ("params", "problem"),
    [
        ({"deep": nested(MAX_JSON_DEPTH)}, "nested deeper than 31 levels"),
        ({"text": "lone \ud800 surrogate"}, "lone surrogate"),
    ],
    ids=["nested-32-deep", "lone-surrogate"],
)
async def test_a_manual_runs_params_no_backend_stores_are_refused_naming_params(
    db: Database, params: dict[str, object], problem: str
) -> None:
    # MariaDB's JSON check refuses both (error 4025): every backend refuses them the same way,
    # before anything is written.
    await register(db, "job")
    with pytest.raises(InvalidJobError, match=f"params: .*{problem}"):
        await operations.trigger(db, job="job", params=params, now=NOW)
    deepest = {"deep": nested(MAX_JSON_DEPTH - 1)}
    queued = await operations.trigger(db, job="job", params=deepest, now=NOW)
    assert (await run_row(db, queued.execution_id))["params"] == deepest
