"""slotcron.store.membership on every backend: the members are the running instances with the
same job digest and a recent heartbeat; the overdue read finds the slots nobody claimed in
time (newest first, a paused job's too: its slot is recorded SKIPPED by whoever claims it), and
the next one due."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from slotcron.store import membership, registrations, runs
from slotcron.store.database import Database
from slotcron.store.runs import IncarnationLost
from slotcron.store.tables import instances, jobs
from sqlalchemy import select, update

from tests.integration.test_batch_claims import register

NOW = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
SECOND = timedelta(seconds=1)


async def instance(db: Database, name: str, digest: str | None, beat: datetime) -> None:
    await registrations.register_instance(
        db, instance_id=name, host="h", pid=1, version="v", now=beat, jobs_digest=digest
    )


async def test_members_share_a_digest_run_and_heartbeat(db: Database) -> None:
    await instance(db, "a", "d1", NOW)
    await instance(db, "b", "d1", NOW - 2 * SECOND)
    await instance(db, "c", "d2", NOW)  # another deploy's jobs
    await instance(db, "d", "d1", NOW - 10 * SECOND)  # silent
    await instance(db, "e", None, NOW)  # an earlier version: shares with nobody
    await instance(db, "f", "d1", NOW)
    await registrations.set_instance_state(db, instance_id="f", state="draining", now=NOW)
    found = await membership.members(db, jobs_digest="d1", alive_after=NOW - 5 * SECOND)
    assert sorted(found) == ["a", "b"]
    assert await membership.members(db, jobs_digest="d2", alive_after=NOW - SECOND) == ["c"]


async def flags(db: Database) -> dict[str, bool]:
    async with db.read() as conn:
        rows = await conn.execute(select(instances.c.instance_id, instances.c.reshare))
        return {r.instance_id: bool(r.reshare) for r in rows}


async def test_a_member_that_joins_flags_the_others_and_their_heartbeat_finds_it(
    db: Database,
) -> None:
    for name, digest in (("a", "d1"), ("b", "d1"), ("c", "d2"), ("joiner", None)):
        await instance(db, name, digest, NOW)
    await registrations.set_instance_state(db, instance_id="b", state="draining", now=NOW)
    # Registered without a digest, a starting instance is nobody's member until it joins.
    assert await membership.members(db, jobs_digest="d1", alive_after=NOW - SECOND) == ["a"]
    await membership.join(db, jobs_digest="d1", instance_id="joiner", now=NOW + SECOND / 2)
    assert sorted(await membership.members(db, jobs_digest="d1", alive_after=NOW - SECOND)) == [
        "a",
        "joiner",
    ]
    # The running members with its digest, not itself, not another deploy's, not a leaving one.
    assert await flags(db) == {"a": True, "b": False, "c": False, "joiner": False}
    found: list[str] = []

    async def beat(name: str, busy: bool, incarnation: str | None = None) -> None:
        await runs.renew(
            db,
            instance_id=name,
            now=NOW + SECOND,
            lease_counts={60_000: 0} if busy else {},
            instance_state="running",
            incarnation=incarnation,
            on_reshare=lambda: found.append(name),
        )

    await beat("a", busy=False)
    await beat("a", busy=False)  # found once: the renewal cleared it
    await beat("c", busy=True)
    assert found == ["a"]
    await membership.join(db, jobs_digest="d1", instance_id="joiner", now=NOW + SECOND / 2)
    await beat("a", busy=True)  # a renewal with runs finds it too
    assert found == ["a", "a"]
    assert await flags(db) == {"a": False, "b": False, "c": False, "joiner": False}
    async with db.read() as conn:
        rows = await conn.execute(select(instances.c.instance_id, instances.c.heartbeat_at))
        beats = {r.instance_id: r.heartbeat_at for r in rows}
    assert beats["a"] == beats["c"] == NOW + SECOND  # each flagged or not, renewed
    assert beats["joiner"] == NOW + SECOND / 2  # alive as it joined
    # Another incarnation's row, flagged or not: lost, and nothing is cleared or called.
    await membership.join(db, jobs_digest="d1", instance_id="joiner", now=NOW + SECOND / 2)
    with pytest.raises(IncarnationLost):
        await beat("a", busy=False, incarnation="not-a's")
    assert found == ["a", "a"]
    assert (await flags(db))["a"] is True


async def test_the_overdue_read_and_the_next_slot_due(db: Database) -> None:
    await register(db, ["late", "later", "old", "paused", "future", "soon"])
    nexts = {
        "late": NOW - SECOND,
        "later": NOW - 2 * SECOND,
        "old": NOW - 120 * SECOND,  # out of the window
        "paused": NOW - SECOND,
        "future": NOW + 30 * SECOND,
        "soon": NOW + 5 * SECOND,
    }
    async with db.transaction() as conn:
        for name, at in nexts.items():
            await conn.execute(
                update(jobs)
                .where(jobs.c.name == name)
                .values(next_slot_at=at, paused=name == "paused")
            )
    found = await membership.overdue(
        db, before=NOW - 0.3 * SECOND, after=NOW - 60 * SECOND, limit=10
    )
    assert found == [
        ("late", None, NOW - SECOND),
        ("paused", None, NOW - SECOND),
        ("later", None, NOW - 2 * SECOND),
    ]
    assert await membership.overdue(
        db, before=NOW - 0.3 * SECOND, after=NOW - 60 * SECOND, limit=1
    ) == [("late", None, NOW - SECOND)]
    assert await membership.next_due(db, after=NOW - 0.3 * SECOND) == NOW + 5 * SECOND
    # A schedule's slot is found only when its task is given (one no live instance registers
    # waits, and must not hide the others).
    async with db.transaction() as conn:
        await conn.execute(update(jobs).where(jobs.c.name == "late").values(task="report"))
    found = await membership.overdue(db, before=NOW, after=NOW - 60 * SECOND, limit=10)
    assert [name for name, *_ in found] == ["paused", "later"]
    found = await membership.overdue(
        db, before=NOW, after=NOW - 60 * SECOND, limit=10, tasks=["report"]
    )
    assert found[0] == ("late", "report", NOW - SECOND)
    assert await membership.next_due(db, after=NOW + 60 * SECOND) is None
    assert await membership.next_slots(db, ["late", "future", "unknown"]) == {
        "late": NOW - SECOND,
        "future": NOW + 30 * SECOND,
    }
    assert await membership.next_slots(db, []) == {}
