"""slotcron.store.housekeeping: what the leader finds to do, asked in one statement."""

from __future__ import annotations

from collections.abc import Awaitable
from datetime import timedelta

from slotcron.store import housekeeping, leadership, registrations
from slotcron.store.database import Database
from slotcron.store.housekeeping import Pending

from tests.store.common import (
    LEASE,
    NOW,
    SLOT,
    TASK,
    add_run,
    add_schedules,
    record_tasks,
    register,
)

LATER = NOW + LEASE + timedelta(seconds=1)
"""Past the leases of runs claimed at NOW."""


async def make_work(db: Database) -> None:
    """One of each: a lapsed run, an unstarted run, a silent instance, an overdue job (and a
    schedule overdue, which its loader decides, not the leader)."""
    await add_run(db, "lapsed")
    await add_run(db, "unstarted", started=False, lease_ms=10 * 60_000)
    await add_run(db, "live", lease_ms=10 * 60_000)
    await registrations.register_instance(
        db, instance_id="silent", host="h", pid=1, version="t", now=NOW
    )
    await registrations.register_instance(
        db, instance_id="live", host="h", pid=1, version="t", now=LATER
    )
    await register(db, "overdue", first_slot=SLOT)
    await register(db, "due", first_slot=LATER + timedelta(minutes=1))
    await record_tasks(db, TASK)
    await add_schedules(db, {"task": TASK, "every": 60, "id": "schedule"})


async def test_pending_counts_what_there_is_to_do(db: Database) -> None:
    assert await housekeeping.pending(
        db, now=NOW, silent_before=NOW, overdue_before=NOW
    ) == Pending(0, 0, 0, 0)
    await make_work(db)
    found = await housekeeping.pending(
        db, now=LATER, silent_before=LATER - timedelta(seconds=1), overdue_before=LATER
    )
    assert found == Pending(lapsed_runs=1, silent_instances=1, overdue_jobs=1, unstarted_runs=1)
    assert await housekeeping.pending(
        db, now=NOW, silent_before=NOW, overdue_before=SLOT
    ) == Pending(0, 0, 0, 1)


async def test_renew_and_look_renews_the_holders_lease_and_looks(db: Database) -> None:
    await make_work(db)
    assert await leadership.take(db, instance_id="leader", now=NOW, lease=30)

    def look(instance: str) -> Awaitable[Pending | None]:
        return housekeeping.renew_and_look(
            db,
            instance_id=instance,
            now=LATER,
            lease=30,
            silent_before=LATER - timedelta(seconds=1),
            overdue_before=LATER,
        )

    assert await look("leader") == Pending(1, 1, 1, 1)
    assert await leadership.current(db) == ("leader", LATER + timedelta(seconds=30))
    assert await look("Leader") is None
    assert await look("other") is None
    assert await leadership.current(db) == ("leader", LATER + timedelta(seconds=30))
