"""``max_runs``: a job's completed runs, counted exactly across the cluster.

A job with ``max_runs`` has its ``scheduler_jobs.runs_completed`` raised in the very transaction
that records one of its runs ``COMPLETED`` (:func:`count_completed`, called by every writer of
that outcome: :func:`slotcron.store.runs.finish`, :func:`~slotcron.store.runs.finish_many`, a
failover's rows put back), so the count survives the history's retention and a lost commit
loses both. A claim of such a job (one at a time, under the job's row lock) reads the count and
the runs in flight (:func:`room_for_one`): none is started that could make one more.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable
from typing import Any

from sqlalchemy import BigInteger, bindparam, func, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from slotcron.errors import RunsExhausted
from slotcron.status import Status
from slotcron.store.tables import executions, jobs

_BUMP = (
    update(jobs)
    .where(jobs.c.name == bindparam("p_job"))
    .values(runs_completed=jobs.c.runs_completed + bindparam("p_n", type_=BigInteger()))
)
_IN_FLIGHT = (
    select(func.count())
    .select_from(executions)
    .where(
        executions.c.job_name == bindparam("p_job"),
        executions.c.status.in_([Status.RUNNING, Status.QUEUED]),
    )
)


async def count_completed(
    conn: AsyncConnection, names: Iterable[str], counted: Collection[str]
) -> None:
    """Count one completed run for each of ``names`` (a job's name once per run) that is among
    ``counted`` (the jobs with ``max_runs``); nothing for the others, so nothing at all on a
    cluster without such jobs."""
    if not counted:
        return
    runs = Counter(name for name in names if name in counted)
    for name, n in sorted(runs.items()):  # in name order, as locks are taken elsewhere
        await conn.execute(_BUMP, {"p_job": name, "p_n": n})


async def _in_flight(conn: AsyncConnection, job: str) -> int:
    """The job's runs that may still complete: running, or queued (a retry, a manual run)."""
    return int((await conn.execute(_IN_FLIGHT, {"p_job": job})).scalar_one())


def exhausted(row: Any, job: str, max_runs: int | None) -> None:
    """Raise :class:`RunsExhausted` when the job's locked ``row`` counts ``max_runs`` completed
    runs: no slot of it is run or recorded any more."""
    if max_runs is not None and row.runs_completed >= max_runs:
        raise RunsExhausted(f"{job}: {row.runs_completed} runs completed (max_runs={max_runs})")


async def room_for_one(conn: AsyncConnection, row: Any, job: str, max_runs: int) -> str | None:
    """None when one more run of the job cannot exceed ``max_runs`` whatever its runs in flight
    do; else why the slot is recorded SKIPPED instead."""
    running = await _in_flight(conn, job)
    if row.runs_completed + running < max_runs:
        return None
    return (
        f"max_runs={max_runs}: {row.runs_completed} completed and {running} in flight, "
        "which may complete"
    )
