"""Reading executions back, for ``slotcron history`` and the API."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import RowMapping, or_, select

from slotcron.store import markers
from slotcron.store.database import Database
from slotcron.store.tables import executions


@dataclass(frozen=True)
class ExecutionRecord:
    id: int
    job: str
    scheduled_at: datetime
    trigger: str
    status: str
    attempt: int
    instance_id: str | None
    started_at: datetime | None
    finished_at: datetime | None
    heartbeat_at: datetime | None
    lease_until: datetime | None
    error: str | None
    params: dict[str, Any]
    state: dict[str, Any]
    until: datetime | None = None
    """The last slot of a ``MISSED`` record that stands for a passed-over range (its
    ``scheduled_at`` is the first); None on every other record."""

    @property
    def duration_ms(self) -> int | None:
        if self.started_at is None or self.finished_at is None:
            return None
        return round((self.finished_at - self.started_at).total_seconds() * 1000)


RECORD_COLUMNS = tuple(
    markers.started_at().label("started_at") if column.name == "started_at" else column
    for column in executions.c
)
"""An execution row as read for a record: a run in flight, claimed ahead in a chunk, shows
its chunk's start (its own ``started_at`` is written when it finishes)."""


async def list_executions(
    db: Database,
    *,
    job: str | None = None,
    status: str | None = None,
    since: datetime | None = None,
    limit: int = 50,
    offset: int = 0,
    before: tuple[datetime, int] | None = None,
) -> list[ExecutionRecord]:
    """Executions, newest slot first (read off the ``(scheduled_at, id)`` index); ``offset``
    skips that many, ``before`` (the slot and id of the last row of the previous page) starts
    right after it, at the cost of one index seek however deep the page."""
    query = select(*RECORD_COLUMNS)
    if before is not None:
        slot, row_id = before
        # The bound on scheduled_at alone is what the index range starts from (an OR of the
        # two cases is read from the top of the index on PostgreSQL: 389 ms at 1 M rows).
        query = query.where(
            executions.c.scheduled_at <= slot,
            or_(executions.c.scheduled_at < slot, executions.c.id < row_id),
        )
    if job is not None:
        query = query.where(executions.c.job_name == job)
    if status is not None:
        query = query.where(executions.c.status == status)
    if since is not None:
        query = query.where(executions.c.scheduled_at >= since)
    query = query.order_by(executions.c.scheduled_at.desc(), executions.c.id.desc()).limit(limit)
    if offset:
        query = query.offset(offset)
    async with db.read() as conn:
        rows = (await conn.execute(query)).mappings().all()
    return [execution_record(r) for r in rows]


def execution_record(r: RowMapping) -> ExecutionRecord:
    """An execution row (as a mapping) as a record."""
    return ExecutionRecord(
        id=int(r["id"]),
        job=r["job_name"],
        scheduled_at=r["scheduled_at"],
        trigger=r["trigger"],
        status=r["status"],
        attempt=r["attempt"],
        instance_id=r["instance_id"],
        started_at=r["started_at"],
        finished_at=r["finished_at"],
        heartbeat_at=r["heartbeat_at"],
        lease_until=r["lease_until"],
        error=r["error"],
        params=r["params"] or {},
        state=r["state"] or {},
        until=r.get("until"),
    )
