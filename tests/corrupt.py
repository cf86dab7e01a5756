"""Breaking a runtime schedule's row the way a writer outside slotcron can (issue 26, item 8):
raw SQL, a client that lifted Python's digit limit, an older release."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from slotcron.store.database import Database
from slotcron.store.tables import UTCDateTime
from sqlalchemy import bindparam, text

BIG_NUMBER = '{"tenant": ' + "7" * 5000 + "}"
"""Params holding a 5,000-digit integer: storable on every backend, readable by no Python with
the default digit limit."""
BROKEN = {
    "digits": {"params": BIG_NUMBER},
    "cron": {"kind": "cron", "schedule": "every other tuesday"},
    "zone": {"timezone": "Mars/Olympus"},
    "null-option": {"options": '{"max_attempts": null, "alert": true}'},
    "millisecond": {"schedule": "0.001"},
}
"""Ways to break a row on every backend, by name."""
BROKEN_SQLITE = {"json": {"params": '{"tenant": 1'}}
"""Invalid JSON: PostgreSQL's json type and MariaDB's JSON check refuse it; SQLite stores it."""


def ways(backend: str) -> dict[str, dict[str, str]]:
    return {**BROKEN, **(BROKEN_SQLITE if backend == "sqlite" else {})}


async def corrupt(db: Database, schedule_id: str, **values: str) -> None:
    """Overwrite columns of a schedule's row with raw text (JSON columns take it as written) and
    move its ``updated_at``, as any write does."""
    sets = ", ".join(f"{column} = :{column}" for column in values)
    statement = text(
        f"UPDATE scheduler_jobs SET {sets}, updated_at = :now WHERE name = :id"
    ).bindparams(bindparam("now", type_=UTCDateTime()))
    parameters: dict[str, Any] = {**values, "now": datetime.now(UTC), "id": schedule_id}
    async with db.transaction() as conn:
        result = await conn.execute(statement, parameters)
    assert result.rowcount == 1, f"no schedule {schedule_id!r} to break"
