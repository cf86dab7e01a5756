"""What an instance asks of a database it reached again: did it keep what we wrote?

After a failover the new primary knows what its standby had replayed. With synchronous
replication that is every commit acknowledged to us; with asynchronous replication the last
ones can be gone (a claim, a start marker, an outcome). Each function here reads or writes by a
run's whole key (:data:`~slotcron.store.claims.RunKey`), never by its id alone: the id sequence of a
primary that lost commits starts behind, and hands ids out again.

- :func:`replication`: whether commits wait for a standby (PostgreSQL; None elsewhere).
- :func:`find_runs`: the rows of runs this instance holds in flight, and their chunk markers.
- :func:`restore_markers`: put back start markers the new primary lost.
- :func:`restore_rows`: put back rows the new primary lost entirely, as recorded (the outcome of
  a run that ended, or ``STOPPED`` for a run fenced because its claim was lost), moving the
  job's high-water mark past their slots as the claim had.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import and_, case, literal, or_, select, text, update

from slotcron.status import Status, Trigger
from slotcron.store.claims import RunKey
from slotcron.store.counted import count_completed
from slotcron.store.database import Database
from slotcron.store.runs import run_keys, runs_among, storable_error
from slotcron.store.skips import moved_on
from slotcron.store.tables import UTCDateTime, executions, jobs, start_markers

_REPLICATION = text(
    "SELECT current_setting('synchronous_standby_names') AS names, "
    "(SELECT count(*) FROM pg_stat_replication) AS standbys, "
    "(SELECT count(*) FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum')) "
    "AS synchronous"
)

# The triggers whose slot the job row's high-water mark covers (a manual run, a restart or a
# retry is guarded by the unique key alone).
_MARKED = (Trigger.CRON.value, Trigger.INTERVAL.value, Trigger.CATCHUP.value)


@dataclass(frozen=True)
class Replication:
    """Whether a commit acknowledged to us is on a standby too (PostgreSQL)."""

    standby_names: str
    """``synchronous_standby_names``: empty when no commit waits for a standby."""
    standbys: int | None
    """Streaming standbys of this server (None: ``pg_stat_replication`` was not readable)."""
    synchronous_standbys: int | None

    @property
    def synchronous(self) -> bool:
        """Commits wait for a standby: a failover to it keeps every acknowledged claim."""
        return bool(self.standby_names.strip())

    @property
    def mode(self) -> str:
        """``synchronous``, ``asynchronous`` (standbys that commits do not wait for), ``none``
        (no standby streams from this server), or ``unknown``."""
        if self.synchronous:
            return "synchronous"
        if self.standbys is None:
            return "unknown"
        return "asynchronous" if self.standbys else "none"

    def describe(self) -> str:
        if self.mode == "synchronous":
            connected = (
                f"; {self.synchronous_standbys} synchronous standby(s) streaming"
                if self.synchronous_standbys is not None
                else ""
            )
            return (
                f"synchronous (synchronous_standby_names = {self.standby_names!r}{connected}): "
                "a failover to a synchronous standby keeps every acknowledged claim"
            )
        if self.mode == "asynchronous":
            return (
                f"asynchronous ({self.standbys} standby(s) streaming, none synchronous): a "
                "failover can lose the last claims and run their slots twice"
            )
        if self.mode == "none":
            return "no standby streams from this server: nothing to fail over to"
        return (
            "unknown (pg_stat_replication not readable) and synchronous_standby_names is "
            "empty: a failover can lose the last claims and run their slots twice"
        )


async def replication(db: Database) -> Replication | None:
    """How this PostgreSQL server replicates our commits; None for other databases."""
    if db.dialect.name != "postgresql":
        return None
    async with db.read() as conn:
        row = (await conn.execute(_REPLICATION)).one()
    return Replication(str(row.names or ""), int(row.standbys), int(row.synchronous))


@dataclass(frozen=True)
class Found:
    """A run's row as the database has it now."""

    status: str
    instance_id: str | None
    start_key: str | None
    started: bool
    """``started_at`` is stamped on the row itself."""
    marker: str | None
    """Its chunk's marker: ``started``, ``handed back`` (a tombstone), or None (absent)."""


async def find_runs(db: Database, runs: Sequence[RunKey]) -> dict[RunKey, Found]:
    """The rows of ``runs`` (absent: the database has none under that key)."""
    if not runs:
        return {}
    marker = case(
        (start_markers.c.handed_back, "handed back"),
        (start_markers.c.start_key.is_not(None), "started"),
        else_=None,
    )
    query = (
        select(
            executions.c.id,
            executions.c.job_name,
            executions.c.scheduled_at,
            executions.c.attempt,
            executions.c.status,
            executions.c.instance_id,
            executions.c.start_key,
            executions.c.started_at.is_not(None).label("started"),
            marker.label("marker"),
        )
        .select_from(
            executions.outerjoin(start_markers, start_markers.c.start_key == executions.c.start_key)
        )
        .where(runs_among(db.dialect, "p_runs"))
    )
    found: dict[RunKey, Found] = {}
    async with db.read() as conn:
        rows = await conn.execute(query, run_keys(db.dialect, "p_runs", runs))
        for r in rows:
            key = (int(r.id), r.job_name, r.scheduled_at, int(r.attempt))
            found[key] = Found(r.status, r.instance_id, r.start_key, bool(r.started), r.marker)
    return found


async def restore_markers(
    db: Database, markers: Mapping[str, datetime], *, instance_id: str, now: datetime
) -> set[str]:
    """Insert the start markers ``{start_key: started_at}`` of chunks this instance started,
    where the database has no row under the key; returns the keys now started by us (put back,
    or found there already). A key found handed back (the leader's tombstone went in first)
    is not among them: those runs went back to the queue."""
    if not markers:
        return set()
    rows = [
        {
            "start_key": key,
            "instance_id": instance_id,
            "started_at": started,
            "handed_back": False,
            "created_at": now,
        }
        for key, started in markers.items()
    ]
    async with db.transaction() as conn:
        await conn.execute(db.dialect.insert_new(start_markers), rows)
        ours = await conn.execute(
            select(start_markers.c.start_key).where(
                start_markers.c.start_key.in_(list(markers)),
                start_markers.c.instance_id == instance_id,
                start_markers.c.handed_back.is_(False),
            )
        )
        return {str(key) for key in ours.scalars()}


@dataclass(frozen=True)
class Lost:
    """A row to put back as recorded: a run the database lost entirely."""

    run: RunKey
    trigger: str
    status: str
    error: str | None
    started_at: datetime | None
    finished_at: datetime
    lease_ms: int | None
    fencing_token: int | None
    params: dict[str, Any]
    next_slot: datetime | None
    """The job's slot after this one (None: unknown here): the job row expects it next."""


async def restore_rows(
    db: Database, lost: Sequence[Lost], *, instance_id: str, counted: Collection[str] = ()
) -> int:
    """Insert ``lost`` rows where their key is free, and move each job's high-water mark (and
    the slot it expects next) past a cron, interval or catch-up slot put back, as the claim that
    the database lost had: the slot stays decided. Returns how many rows went in (a key taken
    meanwhile, by another instance's claim of the slot, is left to it)."""
    if not lost:
        return 0
    rows = [_restored_row(item, instance_id) for item in lost]
    async with db.transaction() as conn:
        # The jobs' rows first, in name order, as a claim locks its job's row before it inserts
        # its execution: taken the other way round, a claim of one of these slots and this
        # write deadlocked (seen after a lossy failover, PostgreSQL).
        names = sorted({item.run[1] for item in lost})
        await conn.execute(
            select(jobs.c.name)
            .where(jobs.c.name.in_(names))
            .order_by(jobs.c.name)
            .with_for_update()
        )
        # A key taken meanwhile (another instance claimed the slot) is left to its holder.
        # Row by row (a rare path): a multi-row insert's count of rows is not reliable.
        inserted, completed = 0, []
        for row in rows:
            went_in = (await conn.execute(db.dialect.insert_new(executions), row)).rowcount
            inserted += went_in
            if went_in and row["status"] == Status.COMPLETED:
                completed.append(row["job_name"])
        await count_completed(conn, completed, counted)  # lost with the row, counted again
        for item in lost:
            if item.trigger in _MARKED:
                await _move_marks(conn, item)
    return int(inserted)


def _restored_row(item: Lost, instance_id: str) -> dict[str, Any]:
    """The execution row that puts ``item`` back, as ``instance_id``'s."""
    return {
        # A fresh id: the one the lost row had may be another run's now.
        "job_name": item.run[1],
        "scheduled_at": item.run[2],
        "attempt": item.run[3],
        "trigger": item.trigger,
        "status": item.status,
        "instance_id": instance_id,
        "created_at": item.finished_at,
        "started_at": item.started_at,
        "heartbeat_at": item.finished_at,
        "lease_until": item.finished_at,
        "lease_ms": item.lease_ms,
        "finished_at": item.finished_at,
        "error": storable_error(item.error),
        "params": item.params,
        "state": {},
        "fencing_token": item.fencing_token,
    }


async def _move_marks(conn: Any, item: Lost) -> None:
    """Move the job's high-water mark (and the slot it expects next) past ``item``'s slot,
    never back."""
    job_name, slot = item.run[1], item.run[2]
    values: dict[str, Any] = {
        "last_slot_at": case(
            (or_(jobs.c.last_slot_at.is_(None), jobs.c.last_slot_at < slot), slot),
            else_=jobs.c.last_slot_at,
        )
    }
    if item.next_slot is not None:
        values["next_slot_at"] = case(
            (
                or_(jobs.c.next_slot_at.is_(None), jobs.c.next_slot_at < item.next_slot),
                item.next_slot,
            ),
            else_=jobs.c.next_slot_at,
        )
    pairs = [(jobs.c[name], value) for name, value in values.items()]
    passed = moved_on(literal(slot, UTCDateTime()))  # a skip at or before it is decided
    await conn.execute(update(jobs).where(jobs.c.name == job_name).ordered_values(*pairs, *passed))


async def settle_lost_takes(
    db: Database, runs: Sequence[RunKey], *, reason: str, now: datetime
) -> int:
    """Record ``STOPPED`` the runs this instance took from the queue whose take the database
    lost (their rows are ``QUEUED`` again): fenced here, they are not to be taken again by
    another instance without an operator's restart."""
    if not runs:
        return 0
    async with db.transaction() as conn:
        result = await conn.execute(
            update(executions)
            .where(and_(runs_among(db.dialect, "p_runs"), executions.c.status == "QUEUED"))
            .values(status="STOPPED", error=reason, finished_at=now),
            run_keys(db.dialect, "p_runs", runs),
        )
    return int(result.rowcount)
