"""What happens to a run after its claim: heartbeats, checkpoints, its one finishing write.

Every write here is conditional on ``status = 'RUNNING' AND instance_id = :me``: a run can
never overwrite what another instance (or the leader) recorded about it. And every write finds
its row by the run's whole key (:data:`~slotcron.store.claims.RunKey`: id, job, slot, attempt),
never
by its id alone: after a failover that lost the last commits, the id sequence starts behind,
and an id of ours may now name another run's row.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Text, bindparam, false, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from slotcron.status import Status
from slotcron.store import markers
from slotcron.store.claims import RunKey
from slotcron.store.counted import count_completed
from slotcron.store.database import Database
from slotcron.store.dialects import Dialect
from slotcron.store.lifeline import queue_retry
from slotcron.store.tables import UTCDateTime, executions, guard, instances


class IncarnationLost(Exception):
    """The instance row names another incarnation: another process took this instance id over
    (this one was paused or cut off past its lease, and judged dead). Nothing was renewed."""


RUN_KEY = (
    executions.c.id,
    executions.c.job_name,
    executions.c.scheduled_at,
    executions.c.attempt,
)
"""The columns of a :data:`RunKey`, in its order."""


def _mine(run: RunKey, instance_id: str) -> Any:
    execution_id, job_name, scheduled_at, attempt = run
    return (
        (executions.c.id == execution_id)
        & (executions.c.job_name == job_name)
        & (executions.c.scheduled_at == scheduled_at)
        & (executions.c.attempt == attempt)
        & (executions.c.status == "RUNNING")
        & (executions.c.instance_id == instance_id)
    )


def runs_among(dialect: Dialect, name: str) -> Any:
    """The rows of the runs bound as ``name`` (:func:`run_keys`), each by its whole key."""
    return dialect.among_rows(RUN_KEY, name)


def run_keys(dialect: Dialect, name: str, runs: Iterable[RunKey]) -> dict[str, Any]:
    return dialect.rows(name, list(runs), len(RUN_KEY))


ERROR_HEAD, ERROR_TAIL = 4_000, 12_000
"""Characters of a longer error text kept from its start and from its end (where a traceback
names its exception): about 16,000 in all, under MariaDB's TEXT (65,535 bytes) at 4 bytes each."""


def storable_error(error: str | None) -> str | None:
    """An outcome's error text as every backend stores it: a NUL shown as ``\\x00`` (PostgreSQL
    text cannot hold one), a lone surrogate as its escape, a long text cut in the middle. A job's
    traceback can hold anything; an outcome that cannot be written would be retried for good."""
    if error is None:
        return None
    text = error.replace("\x00", "\\x00")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) > ERROR_HEAD + ERROR_TAIL + 64:  # room for the note: a cut text stays as it is
        left_out = len(text) - ERROR_HEAD - ERROR_TAIL
        text = (
            f"{text[:ERROR_HEAD]}\n[... {left_out} characters left out ...]\n{text[-ERROR_TAIL:]}"
        )
    return text


async def finish(
    db: Database,
    *,
    run: RunKey,
    instance_id: str,
    status: str,
    now: datetime,
    error: str | None,
    retry_backoff: float | None = None,
    counted: Collection[str] = (),
) -> bool:
    """Record a run's outcome; False when the record was no longer ours to write.

    With ``retry_backoff``, the next attempt of the slot is queued in the same transaction,
    carrying the params and the last checkpointed state. A ``COMPLETED`` run of a job among
    ``counted`` (those with ``max_runs``) is counted in the same transaction
    (:mod:`slotcron.store.counted`).
    """
    async with db.transaction() as conn:
        result = await conn.execute(
            update(executions)
            .where(_mine(run, instance_id))
            .values(
                status=status,
                finished_at=now,
                error=storable_error(error),
                lease_until=now,
                started_at=markers.started_at(),
            )
        )
        if result.rowcount != 1:
            return False
        if status == Status.COMPLETED:
            await count_completed(conn, [run[1]], counted)
        if retry_backoff is not None:
            row = (await conn.execute(select(executions).where(executions.c.id == run[0]))).one()
            await queue_retry(conn, row=row, now=now, backoff=retry_backoff, dialect=db.dialect)
    return True


@dataclass(frozen=True)
class OursUpdate:
    """An UPDATE of many runs bound by key (``p_runs``), made only to those still ours
    (``RUNNING`` on ``p_instance``): with RETURNING where the dialect has it, else a locking
    read of which are still ours and an update of those by id (MariaDB/MySQL)."""

    lock_mine: Any
    write: Any
    write_returning: Any
    returning: bool
    """Whether the dialect it was built for has ``UPDATE ... RETURNING``."""

    async def apply(self, conn: AsyncConnection, params: dict[str, Any]) -> list[int]:
        """Run it with ``params``; return the ids of the runs updated."""
        if self.returning:
            return list((await conn.execute(self.write_returning, params)).scalars())
        ours = list((await conn.execute(self.lock_mine, params)).scalars())
        if ours:
            await conn.execute(self.write, {**params, "p_ids": ours})
        return ours


def ours_update(dialect: Dialect, values: dict[str, Any]) -> OursUpdate:
    """The statements of an :class:`OursUpdate` setting ``values``."""
    ids = dialect.among(executions.c.id, "p_ids", executions.c.id.type)
    mine = (
        runs_among(dialect, "p_runs"),
        guard(executions.c.status) == "RUNNING",
        guard(executions.c.instance_id) == bindparam("p_instance"),
    )
    return OursUpdate(
        lock_mine=select(executions.c.id).where(*mine).with_for_update(),
        write=update(executions).where(ids).values(**values),
        write_returning=update(executions).where(*mine).values(**values).returning(executions.c.id),
        returning=dialect.update_returning,
    )


@functools.cache
def _finish(dialect: Dialect) -> OursUpdate:
    """:func:`finish_many`'s statement for one dialect."""
    now = bindparam("p_now", type_=UTCDateTime())
    return ours_update(
        dialect,
        {
            "status": bindparam("p_status"),
            "error": bindparam("p_error", type_=Text()),
            "finished_at": now,
            "lease_until": now,
            # A run claimed ahead in a chunk: its start, held by the chunk's marker until now.
            "started_at": markers.started_at(),
        },
    )


async def finish_many(
    db: Database,
    outcomes: Sequence[tuple[RunKey, str, str | None]],
    *,
    instance_id: str,
    now: datetime,
    counted: Collection[str] = (),
) -> set[int]:
    """Record many runs' outcomes ``(run, status, error)`` in one transaction; return the ids
    of the runs recorded (the others were no longer ours). One UPDATE per distinct outcome. The
    ``COMPLETED`` runs of jobs among ``counted`` are counted in the same transaction. One
    UPDATE with nothing to count is sent alone where that spares BEGIN and COMMIT (PostgreSQL:
    one round trip instead of three, the writer's cost at every second's end)."""
    groups: dict[tuple[str, str | None], list[RunKey]] = {}
    for run, status, error in outcomes:
        groups.setdefault((status, storable_error(error)), []).append(run)
    recorded: set[int] = set()
    sql = _finish(db.dialect)
    counts = bool(counted) and any(
        status == Status.COMPLETED and run[1] in counted for run, status, _ in outcomes
    )
    one_statement = len(groups) == 1 and sql.returning and not counts
    async with db.alone(write=True) if one_statement else db.transaction() as conn:
        for (status, error), runs in groups.items():
            params = {
                **run_keys(db.dialect, "p_runs", runs),
                "p_instance": instance_id,
                "p_status": status,
                "p_error": error,
                "p_now": now,
            }
            recorded.update(await sql.apply(conn, params))
        if counts:
            done = [
                run[1]
                for run, status, _ in outcomes
                if status == Status.COMPLETED and run[0] in recorded
            ]
            await count_completed(conn, done, counted)
    return recorded


async def rehearse(conn: AsyncConnection, dialect: Dialect) -> None:
    """Run :func:`finish_many`'s statements once, writing nothing (see ``claims.rehearse``)."""
    sql = _finish(dialect)
    params: dict[str, Any] = {
        **run_keys(dialect, "p_runs", []),
        "p_ids": [],
        "p_instance": "",
        "p_status": "COMPLETED",
        "p_error": None,
        "p_now": datetime(2000, 1, 1, tzinfo=UTC),
    }
    if sql.returning:
        await conn.execute(sql.write_returning, params)
    else:
        await conn.execute(sql.lock_mine, params)
        await conn.execute(sql.write, params)


async def stop_all(
    db: Database, *, runs: Iterable[RunKey], instance_id: str, now: datetime, reason: str
) -> int:
    """Record every listed run of this instance still ``RUNNING`` as ``STOPPED``; release leases."""
    keys = list(runs)
    if not keys:
        return 0
    async with db.transaction() as conn:
        result = await conn.execute(
            update(executions)
            .where(
                runs_among(db.dialect, "p_runs"),
                guard(executions.c.status) == "RUNNING",
                guard(executions.c.instance_id) == instance_id,
            )
            .values(
                status="STOPPED",
                finished_at=now,
                error=reason,
                lease_until=now,
                started_at=markers.started_at(),
            ),
            run_keys(db.dialect, "p_runs", keys),
        )
    return int(result.rowcount)


async def save_state(
    db: Database, *, run: RunKey, instance_id: str, state: Mapping[str, Any]
) -> bool:
    async with db.transaction() as conn:
        result = await conn.execute(
            update(executions).where(_mine(run, instance_id)).values(state=dict(state))
        )
    return result.rowcount == 1


async def renew(
    db: Database,
    *,
    instance_id: str,
    now: datetime,
    lease_counts: Mapping[int, int],
    instance_state: str,
    incarnation: str | None = None,
    ours: Collection[RunKey] | None = None,
    on_reshare: Callable[[], None] | None = None,
) -> set[int] | None:
    """Renew the leases of all this instance's running executions and its own instance row.

    One statement per distinct lease length (almost always one), whatever the number of runs.
    ``lease_counts`` maps a lease length (ms) to how many runs we hold with it. Returns None
    when every lease was renewed, else the ids still ours (the others were taken from us).
    With ``incarnation`` (this process's,
    :func:`slotcron.store.instance_ids.hold_instance_id`), raises :class:`IncarnationLost`,
    renewing nothing, when the instance row names another.
    With ``ours`` (the ids of the runs this process holds; the heartbeat and the watchdog
    always give them), only those are renewed: a run under our id that is not among them was
    claimed by an older incarnation after we took the id over (it resumed from a pause and has
    not noticed yet), and must lapse, to be recorded ABANDONED, rather than be kept alive by us.
    Still one statement per lease length: the ids are one list parameter (one array on
    PostgreSQL).
    With ``on_reshare``, the instance row is renewed only while its ``reshare`` flag is clear;
    when it was set (an instance joined this one's members) the row is renewed again with the
    flag cleared, and ``on_reshare`` called: a second statement only then.
    """
    if not lease_counts:  # idle: the instance row alone
        async with db.alone(write=True) as conn:
            await _beat(conn, instance_id, incarnation, now, instance_state, on_reshare)
        return None
    complete = True
    # Only leases still live are extended (judged by the database's clock): a lapsed lease is
    # never revived, since another instance may already have judged its run ABANDONED.
    mine, params = _running(db, instance_id, ours)
    params["p_now"] = now
    async with db.transaction() as conn:
        for lease_ms, expected in lease_counts.items():
            result = await conn.execute(
                update(executions)
                .where(
                    *mine,
                    executions.c.lease_ms == lease_ms,
                    executions.c.lease_until > db.now_in_sql(),
                )
                .values(heartbeat_at=now, lease_until=now + timedelta(milliseconds=lease_ms)),
                params,
            )
            complete = complete and result.rowcount == expected
        # Raised inside the transaction: its lease renewals are rolled back with it.
        await _beat(conn, instance_id, incarnation, now, instance_state, on_reshare)
        if complete:
            return None
        rows = await conn.execute(
            select(executions.c.id).where(*mine, executions.c.heartbeat_at == now), params
        )
        return {int(r.id) for r in rows}


async def _beat(
    conn: Any,
    instance_id: str,
    incarnation: str | None,
    now: datetime,
    state: str,
    on_reshare: Callable[[], None] | None,
) -> None:
    """Renew the instance row (see :func:`renew`); raise :class:`IncarnationLost` when it
    names another incarnation."""
    # Row counts are rows matched, not changed, on every backend (SQLAlchemy's MySQL drivers ask
    # for FOUND_ROWS): 0 means the row is not this incarnation's, or its flag is set.
    beat = _heartbeat(instance_id, incarnation, now=now, state=state)
    if on_reshare is not None:
        if (await conn.execute(beat.where(instances.c.reshare == false()))).rowcount:
            return
        beat = beat.values(reshare=False)  # set, or another incarnation's row: tell which
    if (await conn.execute(beat)).rowcount:
        if on_reshare is not None:
            on_reshare()
    elif incarnation is not None:
        raise IncarnationLost(instance_id)


def _heartbeat(instance_id: str, incarnation: str | None, *, now: datetime, state: str) -> Any:
    """The instance row's heartbeat (of this incarnation only, when given)."""
    beat = update(instances).where(instances.c.instance_id == instance_id)
    if incarnation is not None:
        beat = beat.where(instances.c.incarnation == incarnation)
    return beat.values(heartbeat_at=now, state=state)


def _running(
    db: Database, instance_id: str, ours: Collection[RunKey] | None
) -> tuple[list[Any], dict[str, Any]]:
    """What selects this instance's running executions (``ours`` only, when given), and the
    parameters it binds."""
    if ours is None:
        return [executions.c.instance_id == instance_id, executions.c.status == "RUNNING"], {}
    # Found by key: the instance and the status only guard them.
    mine = [
        runs_among(db.dialect, "p_ours"),
        guard(executions.c.instance_id) == instance_id,
        guard(executions.c.status) == "RUNNING",
    ]
    return mine, dict(run_keys(db.dialect, "p_ours", ours))
