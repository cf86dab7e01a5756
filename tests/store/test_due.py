"""slotcron.store.due: what an instance reads to fire runtime schedules, none of it growing
with the schedules it is not about to fire."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from slotcron.store import due, registrations, schedules
from slotcron.store.database import Database

from tests.store.common import (
    NEXT,
    NOW,
    SLOT,
    TASK,
    add_schedules,
    record_tasks,
    register,
)


async def pages(db: Database, tasks: list[str], before: datetime, page: int) -> list[list[str]]:
    return [[r.name for r in rows] async for rows in due.due_before(db, tasks, before, page)]


async def test_due_before_pages_by_slot_then_id_without_losing_ties(db: Database) -> None:
    await record_tasks(db, TASK, "tests.other")
    await register(db, "code-job", first_slot=SLOT)
    ids = ["b", "A", "a", "a ", "c"]  # the same next slot: paged within it by id
    await add_schedules(db, *({"task": TASK, "every": 60, "id": i} for i in ids))
    await add_schedules(db, {"task": TASK, "every": 3600, "id": "hourly"})  # 01:00
    await add_schedules(db, {"task": "tests.other", "every": 60, "id": "other"})
    await add_schedules(
        db, {"task": TASK, "every": 60, "id": "early"}, now=SLOT - timedelta(seconds=30)
    )
    order = ["early", "A", "a", "a ", "b", "c"]
    before = NEXT + timedelta(minutes=1)
    assert await pages(db, [TASK], before, 100) == [order]
    assert await pages(db, [TASK], before, 2) == [order[0:2], order[2:4], order[4:6]]
    assert await pages(db, [TASK], before, 3) == [order[0:3], order[3:6]]
    everything = [n for p in await pages(db, [TASK, "tests.other"], before, 4) for n in p]
    assert sorted(everything) == sorted([*order, "other"])
    rows = [r async for rows in due.due_before(db, [TASK], before) for r in rows]
    assert [r.next_slot_at for r in rows] == [SLOT, *[NEXT] * 5]
    assert all(r.task == TASK and r.fingerprint.startswith("v:") for r in rows)
    assert await pages(db, [TASK], NEXT, 100) == [["early"]]
    assert await pages(db, [], before, 100) == []


async def test_by_ids_reads_the_schedules_that_still_exist(db: Database) -> None:
    await record_tasks(db, TASK)
    await register(db, "code-job")
    await add_schedules(db, {"task": TASK, "every": 60, "id": "s", "params": {"k": 1}})
    await add_schedules(db, {"task": TASK, "every": 60, "id": "gone"})
    await schedules.remove(db, "gone", now=NOW)
    found = await due.by_ids(db, ["s", "S", "gone", "code-job"])
    assert list(found) == ["s"]
    row = found["s"]
    assert (row.task, row.kind, row.schedule, row.next_slot_at) == (TASK, "interval", "60", NEXT)
    assert row.fingerprint.startswith("v:") and '"k"' in row.params
    assert await due.by_ids(db, []) == {}


async def test_change_token_changes_with_each_write_touching_a_slot_soon(db: Database) -> None:
    await record_tasks(db, TASK)
    assert await due.change_token(db, schedules.CHANGES_ROW) is None
    await add_schedules(db, {"task": TASK, "every": 60, "id": "soon"})
    first = await due.change_token(db, schedules.CHANGES_ROW)
    assert first is not None and len(first) == 32
    # A schedule whose next slot is hours away needs no word: the token stays.
    await add_schedules(db, {"task": TASK, "cron": "0 0 1 1 *", "id": "far"})
    assert await due.change_token(db, schedules.CHANGES_ROW) == first
    await schedules.update(db, "soon", {"paused": True}, now=NOW, by="t")
    second = await due.change_token(db, schedules.CHANGES_ROW)
    assert second not in (None, first)
    await schedules.remove(db, "soon", now=NOW)
    assert await due.change_token(db, schedules.CHANGES_ROW) not in (None, first, second)
    assert await due.change_token(db, "other") is None


async def test_tasks_with_schedules_lists_each_task_once_in_order(db: Database) -> None:
    assert await due.tasks_with_schedules(db) == []
    names = ["t.b", "t.a", "T.a", "t.a "]
    await record_tasks(db, *names)
    await register(db, "code-job")
    await add_schedules(
        db, *({"task": n, "every": 60, "id": f"{n}/{k}"} for n in names for k in range(2))
    )
    assert await due.tasks_with_schedules(db) == sorted(names)


async def test_live_tasks_and_task_is_live_follow_the_registering_instance(
    db: Database,
) -> None:
    now = datetime.now(UTC)
    for instance, beat in (("live", now), ("silent", now - timedelta(minutes=5))):
        await registrations.register_instance(
            db, instance_id=instance, host="h", pid=1, version="t", now=beat
        )
    await registrations.register_instance(
        db, instance_id="stopped", host="h", pid=1, version="t", now=now
    )
    await registrations.set_instance_state(db, instance_id="stopped", state="stopped", now=now)
    await record_tasks(db, "t.live", instance="live", now=now)
    await record_tasks(db, "t.silent", instance="silent", now=now)
    await record_tasks(db, "t.stopped", instance="stopped", now=now)
    await record_tasks(db, "t.nobody", instance="nobody", now=now)
    names = ["t.live", "t.silent", "t.stopped", "t.nobody", "t.unknown"]
    assert await due.live_tasks(db, names, alive_since=now - timedelta(minutes=1)) == {"t.live"}
    assert await due.live_tasks(db, names, alive_since=now - timedelta(minutes=10)) == {
        "t.live",
        "t.silent",
    }
    assert await due.live_tasks(db, [], alive_since=now) == set()
    assert await due.task_is_live(db, "t.live", lapse=60)
    assert not await due.task_is_live(db, "t.silent", lapse=60)
    assert not await due.task_is_live(db, "T.live", lapse=60)
