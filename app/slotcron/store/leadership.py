"""Leadership: a lease on one row, taken by a conditional update and renewed only by its holder."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import Update, case, select, update

from slotcron.store.database import Database
from slotcron.store.tables import LEADER_ROW, instances, leader

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def renewal(*, instance_id: str, now: datetime, lease: float) -> Update:
    """The update that extends our lease: it matches no row once the lease is not ours."""
    return (
        update(leader)
        .where(leader.c.name == LEADER_ROW, leader.c.instance_id == instance_id)
        .values(lease_until=now + timedelta(seconds=lease))
    )


async def renew(db: Database, *, instance_id: str, now: datetime, lease: float) -> bool:
    """Extend our lease; False when it is no longer ours. One statement, in autocommit."""
    async with db.alone(write=True) as conn:
        result = await conn.execute(renewal(instance_id=instance_id, now=now, lease=lease))
    return result.rowcount == 1


async def take(db: Database, *, instance_id: str, now: datetime, lease: float) -> bool:
    """Take the lease if it lapsed (or is ours); True when we hold it after. The instances
    table shows the new leader in the same transaction.

    A node that lost the lease cannot renew it: the update only matches our own lease or a
    lapsed one, so two nodes never both believe they lead for longer than clock error allows.
    """
    async with db.transaction() as conn:
        result = await conn.execute(
            update(leader)
            .where(
                leader.c.name == LEADER_ROW,
                # Whether another's lease lapsed is judged by the database's clock.
                (leader.c.instance_id == instance_id) | (leader.c.lease_until < db.now_in_sql()),
            )
            # MariaDB/MySQL evaluate SET left to right, reading values already assigned:
            # `since` must be computed before `instance_id` changes.
            .ordered_values(
                (
                    leader.c.since,
                    case((leader.c.instance_id == instance_id, leader.c.since), else_=now),
                ),
                (leader.c.instance_id, instance_id),
                (leader.c.lease_until, now + timedelta(seconds=lease)),
            ),
            {"p_now": now},
        )
        took = result.rowcount == 1
        if took:
            await conn.execute(
                update(instances)
                .where(instances.c.is_leader != (instances.c.instance_id == instance_id))
                .values(is_leader=instances.c.instance_id == instance_id)
            )
    return took


async def resign(db: Database, *, instance_id: str) -> None:
    async with db.transaction() as conn:
        await conn.execute(
            update(leader)
            .where(leader.c.name == LEADER_ROW, leader.c.instance_id == instance_id)
            .values(lease_until=EPOCH)
        )
        await conn.execute(
            update(instances).where(instances.c.instance_id == instance_id).values(is_leader=False)
        )


async def current(db: Database) -> tuple[str | None, datetime | None]:
    """``(instance_id, lease_until)`` of the leadership lease."""
    async with db.alone(write=False) as conn:
        row = (
            await conn.execute(
                select(leader.c.instance_id, leader.c.lease_until).where(
                    leader.c.name == LEADER_ROW
                )
            )
        ).one_or_none()
    return (None, None) if row is None else (row.instance_id, row.lease_until)
