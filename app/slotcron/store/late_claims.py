"""Claims that committed past their slot's grace, recorded many per transaction.

A claim that commits late (its transaction waited, the loop was behind) is not started as if on
time: ``misfire="skip"`` records it ``MISSED``, ``once`` and ``all`` run it as a ``catchup``. An
instance that falls behind has thousands of such claims a second; written one transaction each,
they put it further behind. Here one UPDATE per distinct reason decides a whole batch, and is
conditional (``status = 'RUNNING' AND instance_id = :me``) like every write after a claim
(:mod:`slotcron.store.runs`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import Text, bindparam

from slotcron.status import Status, Trigger
from slotcron.store.claims import RunKey
from slotcron.store.database import Database
from slotcron.store.dialects import Dialect
from slotcron.store.runs import OursUpdate, ours_update, run_keys
from slotcron.store.tables import UTCDateTime


@functools.cache
def _late(dialect: Dialect, missed: bool) -> OursUpdate:
    """The statement that records late claims MISSED, or makes them catch-ups."""
    if not missed:
        return ours_update(dialect, {"trigger": Trigger.CATCHUP.value})
    now = bindparam("p_now", type_=UTCDateTime())
    return ours_update(
        dialect,
        {
            "status": Status.MISSED.value,
            "started_at": None,
            "start_key": None,  # never started: no chunk's marker is its start
            "finished_at": now,
            "error": bindparam("p_error", type_=Text()),
            "lease_until": now,
        },
    )


async def claimed_late(
    db: Database,
    runs: Sequence[tuple[RunKey, str | None]],
    *,
    instance_id: str,
    now: datetime,
) -> set[int]:
    """Decide each late claim ``(run, missed_reason)``: with a reason it is recorded MISSED (its
    lease released), without one it becomes a ``catchup`` run. Returns the ids of the runs so
    decided; the others were no longer ours (fenced, or recorded by the leader)."""
    groups: dict[str | None, list[RunKey]] = {}
    for run, reason in runs:
        groups.setdefault(reason, []).append(run)
    decided: set[int] = set()
    async with db.transaction() as conn:
        for reason, keys in groups.items():
            sql = _late(db.dialect, reason is not None)
            params = {**run_keys(db.dialect, "p_runs", keys), "p_instance": instance_id}
            if reason is not None:
                params.update(p_error=reason, p_now=now)
            decided.update(await sql.apply(conn, params))
    return decided
