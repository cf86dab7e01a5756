"""The instance id, held by one live process at a time: each process writes its own random
incarnation on the instance row, taken over only from a clean shutdown or a lapsed heartbeat."""

from __future__ import annotations

import logging
import os
import secrets
import socket
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import insert, or_, select, update
from sqlalchemy.exc import IntegrityError

from slotcron.clock import Clock
from slotcron.errors import ConfigError
from slotcron.store.database import Database
from slotcron.store.tables import instances
from slotcron.version import __version__

log = logging.getLogger("slotcron.service")


@dataclass(frozen=True)
class _Holder:
    host: str
    pid: int
    heartbeat_at: datetime
    incarnation: str | None


async def hold_instance_id(
    db: Database,
    *,
    instance_id: str,
    lapse: float,
    clock: Clock,
    incarnation: str | None = None,
) -> str:
    """Make this process the one live holder of ``instance_id``; return its incarnation.

    Each process draws a random incarnation (``incarnation``, drawn here when not given) and
    writes it on the instance row, taken over in
    one conditional UPDATE judged by the database's clock (``clock`` is synchronised to it):
    only a row that is new, marked ``stopped`` (a clean shutdown) or whose heartbeat is older
    than ``lapse`` seconds (a dead predecessor) is taken. A row with a recent heartbeat is
    watched: if its heartbeat moves, another live process holds the id and start-up is refused
    with :class:`ConfigError` naming its host and pid (two live processes under one id take
    each other's runs for orphans); if it lapses instead, its process is gone (killed, so it
    never said ``stopped``) and the row is taken then. A row already naming ``incarnation`` is
    this process's own: a start-up retried after a later step failed (or after a commit whose
    answer was lost) takes it back at once instead of waiting a lease for itself.
    """
    incarnation = incarnation or secrets.token_hex(16)
    first: _Holder | None = None
    while True:
        now = clock.now()
        holder = await _take(db, instance_id, incarnation, now, now - timedelta(seconds=lapse))
        if holder is None:
            return incarnation
        if first is None:
            first = holder
            log.info(
                "instance id %s was heartbeating %.1f s ago (host %s, pid %s): waiting up to "
                "%g s to see whether that process is alive",
                instance_id,
                max((now - holder.heartbeat_at).total_seconds(), 0),
                holder.host,
                holder.pid,
                lapse,
            )
        elif (holder.heartbeat_at, holder.incarnation) != (first.heartbeat_at, first.incarnation):
            raise ConfigError(
                "SCHEDULER_INSTANCE_ID",
                f"instance id {instance_id!r} is held by a live process: host {holder.host}, "
                f"pid {holder.pid} (it heartbeats); give each process its own id, or leave "
                "it unset",
            )
        await clock.sleep(min(0.25, lapse / 8))


async def _take(
    db: Database, instance_id: str, incarnation: str, now: datetime, lapsed_before: datetime
) -> _Holder | None:
    """Take the row if free; else return who holds it."""
    values = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "version": __version__,
        "started_at": now,
        "heartbeat_at": now,
        "state": "running",
        "incarnation": incarnation,
    }
    async with db.transaction() as conn:
        taken = await conn.execute(
            update(instances)
            .where(
                instances.c.instance_id == instance_id,
                or_(
                    instances.c.state == "stopped",
                    instances.c.heartbeat_at < lapsed_before,
                    instances.c.incarnation == incarnation,
                ),
            )
            .values(**values)
        )
        if taken.rowcount == 1:
            return None
        row = (
            await conn.execute(
                select(
                    instances.c.host,
                    instances.c.pid,
                    instances.c.heartbeat_at,
                    instances.c.incarnation,
                ).where(instances.c.instance_id == instance_id)
            )
        ).one_or_none()
    if row is not None:
        return _Holder(row.host, row.pid, row.heartbeat_at, row.incarnation)
    try:
        async with db.transaction() as conn:
            await conn.execute(
                insert(instances).values(instance_id=instance_id, is_leader=False, **values)
            )
    except IntegrityError:
        # Another process inserted it just now: its row is judged on the next look.
        return _Holder("?", 0, now, None)
    return None
