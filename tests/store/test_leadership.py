"""slotcron.store.leadership: a lease on one row, taken by one instance at a time."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from slotcron.store import leadership, registrations
from slotcron.store.database import Database
from slotcron.store.tables import instances, leader

from tests.store.common import NOW, ODD, is_utc, table_rows

LEASE = 30.0


async def leaders(db: Database) -> dict[str, bool]:
    return {r["instance_id"]: bool(r["is_leader"]) for r in await table_rows(db, instances)}


async def test_the_lease_is_taken_by_one_instance_until_it_lapses(db: Database) -> None:
    for name in ("a", "b", "A"):
        await registrations.register_instance(
            db, instance_id=name, host="h", pid=1, version="t", now=NOW
        )
    assert await leadership.current(db) == (None, leadership.EPOCH)
    assert await leadership.take(db, instance_id="a", now=NOW, lease=LEASE)
    assert await leadership.current(db) == ("a", NOW + timedelta(seconds=LEASE))
    assert await leaders(db) == {"a": True, "b": False, "A": False}
    live = NOW + timedelta(seconds=LEASE - 1)
    assert not await leadership.take(db, instance_id="b", now=live, lease=LEASE)
    assert not await leadership.take(db, instance_id="A", now=live, lease=LEASE)
    # The holder takes it again (a renewal by take): its `since` stays.
    assert await leadership.take(db, instance_id="a", now=live, lease=LEASE)
    row = (await table_rows(db, leader))[0]
    assert (row["instance_id"], row["since"], row["lease_until"]) == (
        "a",
        NOW,
        live + timedelta(seconds=LEASE),
    )
    lapsed = live + timedelta(seconds=LEASE + 1)
    assert await leadership.take(db, instance_id="b", now=lapsed, lease=LEASE)
    row = (await table_rows(db, leader))[0]
    assert (row["instance_id"], row["since"]) == ("b", lapsed)
    assert await leaders(db) == {"a": False, "b": True, "A": False}


async def test_instances_racing_for_the_lease_leave_one_leader(db: Database) -> None:
    names = [f"i{n}" for n in range(6)]
    taken = await asyncio.gather(
        *(leadership.take(db, instance_id=n, now=NOW, lease=LEASE) for n in names)
    )
    assert sum(taken) == 1
    holder, _ = await leadership.current(db)
    assert holder == names[taken.index(True)]


async def test_renew_extends_only_the_holders_lease_and_resign_gives_it_up(db: Database) -> None:
    await registrations.register_instance(
        db, instance_id="a", host="h", pid=1, version="t", now=NOW
    )
    assert not await leadership.renew(db, instance_id="a", now=NOW, lease=LEASE)
    assert await leadership.take(db, instance_id="a", now=NOW, lease=LEASE)
    assert await leadership.renew(db, instance_id="a", now=ODD, lease=LEASE)
    holder, until = await leadership.current(db)
    assert holder == "a" and until == ODD + timedelta(seconds=LEASE)
    assert is_utc(until) and until is not None and until.microsecond == 123457
    assert not await leadership.renew(db, instance_id="A", now=ODD, lease=LEASE)
    assert not await leadership.renew(db, instance_id="a ", now=ODD, lease=LEASE)

    await leadership.resign(db, instance_id="b")  # not the holder: nothing changes
    assert (await leadership.current(db))[0] == "a"
    await leadership.resign(db, instance_id="a")
    assert await leadership.current(db) == ("a", leadership.EPOCH)
    assert await leaders(db) == {"a": False}
    assert await leadership.take(db, instance_id="b", now=NOW, lease=LEASE), "lapsed at once"


async def test_renewal_is_the_statement_that_matches_only_our_lease(db: Database) -> None:
    assert await leadership.take(db, instance_id="a", now=NOW, lease=LEASE)
    async with db.transaction() as conn:
        theirs = await conn.execute(leadership.renewal(instance_id="b", now=ODD, lease=LEASE))
        ours = await conn.execute(leadership.renewal(instance_id="a", now=ODD, lease=1))
        assert (theirs.rowcount, ours.rowcount) == (0, 1)
    assert await leadership.current(db) == ("a", ODD + timedelta(seconds=1))
