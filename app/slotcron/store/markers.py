"""Start markers: the start of a whole chunk of runs claimed ahead, written once at its slot.

A burst's runs are claimed ahead of their slot with no ``started_at`` and, per chunk and slot,
one ``start_key`` (:mod:`slotcron.store.batch`). At the slot their instance inserts the chunk's row
in ``scheduler_starts`` (:func:`mark`): one row, whatever the number of runs, and the bodies
start. The leader, finding such runs whose lease lapsed, inserts the same key as a tombstone
(``handed_back``, :func:`settle`) before handing them back: the primary key lets only one of
the two in, so a chunk is either started by its instance or handed back, never both.

The marker holds the chunk's start; each run's own ``started_at`` is filled from it by the
write that finishes the run (:func:`started_at`), and readers show the marker's while the run
is in flight. A paused job's run is recorded ``SKIPPED`` by the same round trip (rare: only
those rows are written). Lone claims and queue takes still stamp ``started_at`` themselves
(:mod:`slotcron.store.starts`).
"""

from __future__ import annotations

import functools
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    String,
    and_,
    bindparam,
    delete,
    exists,
    false,
    func,
    literal,
    select,
    true,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from slotcron.status import Status
from slotcron.store import held as held_store
from slotcron.store.database import Database, now_in_sql
from slotcron.store.dialects import Dialect
from slotcron.store.held import Held
from slotcron.store.starts import SCHEDULED, paused_reason
from slotcron.store.tables import UTCDateTime, executions, guard, jobs, start_markers


def started_at() -> ColumnElement[Any]:
    """A run's ``started_at``: its own, else its chunk's marker's (a tombstone has none).
    Correlated to ``executions``: for a SELECT listing runs or an UPDATE finishing them."""
    marker = (
        select(start_markers.c.started_at)
        .where(start_markers.c.start_key == executions.c.start_key)
        .correlate(executions)
        .scalar_subquery()
    )
    return func.coalesce(executions.c.started_at, marker)


@dataclass(frozen=True)
class _Mark:
    insert: Any
    paused_jobs: Any
    runs_of: Any
    skip: Any
    state: Any
    ours: Any
    one_trip: Any


@functools.cache
def _mark(dialect: Dialect, server_clock: bool) -> _Mark:
    db_now = now_in_sql(dialect, server_clock)
    key = bindparam("p_key", type_=String())
    me = bindparam("p_instance", type_=String())
    now = bindparam("p_now", type_=UTCDateTime())
    slot = bindparam("p_slot", type_=UTCDateTime())
    # Each part reads the chunk's rows by id (``p_ids``):
    # a key or an instance's RUNNING rows can be thousands, never to be scanned at the slot.
    chunk = dialect.among(executions.c.id, "p_ids", executions.c.id.type)
    mine = and_(
        chunk,
        guard(executions.c.start_key) == key,
        guard(executions.c.status) == Status.RUNNING.value,
        guard(executions.c.instance_id) == me,
    )
    # The marker goes in only once the slot has come by the database's clock, and while the
    # chunk's leases are live: their first lapse as claimed (``p_lease_until``; renewals only
    # push it later). Its rows are handed back only after that (by the leader, under a
    # tombstone), so no marker can go in for a chunk handed back, even once its tombstone is gone.
    due = slot <= db_now
    live = bindparam("p_lease_until", type_=UTCDateTime()) > db_now
    marker = select(key, me, bindparam("p_started", type_=UTCDateTime()), false(), now).where(
        due, live
    )
    insert = dialect.insert_new(start_markers).from_select(
        ["start_key", "instance_id", "started_at", "handed_back", "created_at"], marker
    )
    paused_jobs = _paused_jobs(chunk)
    scheduled = executions.c.trigger.in_(SCHEDULED)
    skipped = {
        executions.c.status: Status.SKIPPED.value,
        executions.c.finished_at: now,
        executions.c.lease_until: now,
        executions.c.start_key: None,  # never started: the marker is not its start
    }
    one_trip = None
    if dialect.modifying_cte:
        one_trip = _one_trip(insert, paused_jobs, mine, scheduled, skipped, due, live, key)
    return _Mark(
        insert=insert,
        paused_jobs=paused_jobs,
        runs_of=select(executions.c.id, executions.c.job_name).where(
            mine, scheduled, dialect.among(executions.c.job_name, "p_paused", String())
        ),
        skip=update(executions)
        .where(mine, dialect.among(executions.c.id, "p_skip", executions.c.id.type))
        .values({**skipped, executions.c.error: bindparam("p_error", type_=String())}),
        state=select(*_key_state(key, due, live)),
        ours=select(executions.c.id).where(mine),
        one_trip=one_trip,
    )


def _paused_jobs(chunk: Any) -> Any:
    # The chunk's paused jobs: almost always none, and then no run of the chunk is read at all.
    # Whether any job at all is paused is read first, as the top entry of the index on
    # `paused`, a one-time gate over the rest: the planner is not trusted with it at a burst's
    # slot, where the statistics do not know the burst's runs yet (it hashed 100,000 runs' job
    # names and looked each one up: 500 ms at the slot, every body's start lag). (Not by the
    # chunk's job names: binding a thousand names cost more at the slot than this statement.)
    any_paused = select(jobs.c.paused).order_by(jobs.c.paused.desc()).limit(1).scalar_subquery()
    chunk_jobs = select(executions.c.job_name).where(chunk)
    paused_jobs = select(jobs.c.name, paused_reason(jobs.c.paused_reason).label("error")).where(
        any_paused == true(), jobs.c.paused == true(), jobs.c.name.in_(chunk_jobs)
    )
    return paused_jobs


def _key_state(key: Any, due: Any, live: Any) -> list[Any]:
    """What is known of the start key: whether its slot is due, its leases live, its marker in,
    by whom, and whether it was handed back."""
    holder = (
        select(start_markers.c.instance_id)
        .where(start_markers.c.start_key == key)
        .scalar_subquery()
    )
    handed = (
        select(start_markers.c.handed_back)
        .where(start_markers.c.start_key == key)
        .scalar_subquery()
    )
    marked = exists().where(start_markers.c.start_key == key)
    return [
        due.label("due"),
        live.label("live"),
        marked.label("marked"),
        holder.label("holder"),
        handed.label("handed"),
    ]


def _one_trip(
    insert: Any,
    paused_jobs: Any,
    mine: Any,
    scheduled: Any,
    skipped: dict[Any, Any],
    due: Any,
    live: Any,
    key: Any,
) -> Any:
    # One round trip: insert the marker, record the paused jobs' runs SKIPPED if it went in,
    # and say what was found, in one statement (its parts share one snapshot).
    inserting = insert.returning(start_markers.c.start_key).cte("inserting")
    paused = paused_jobs.cte("paused_jobs")  # read twice: computed once, first
    skip = (
        update(executions)
        .where(
            exists(select(paused.c.name)),  # a one-time test: none paused, nothing read
            mine,
            executions.c.job_name == paused.c.name,
            scheduled,
            exists(select(inserting.c.start_key)),
        )
        .values({**skipped, executions.c.error: paused.c.error})
        .returning(executions.c.id, executions.c.error)
        .cte("skipped")
    )
    one = select(literal(1).label("one")).subquery("one")
    inserted = select(func.count()).select_from(inserting).scalar_subquery()
    # What was found of the key before this statement (its insert is not visible to it):
    # one join, cheaper to plan than three subqueries, and planning is most of its cost.
    found = start_markers.alias("found")
    return select(
        inserted.label("inserted"),
        due.label("due"),
        live.label("live"),
        found.c.start_key.is_not(None).label("marked"),
        found.c.instance_id.label("holder"),
        found.c.handed_back.label("handed"),
        skip.c.id,
        skip.c.error,
    ).select_from(one.outerjoin(found, found.c.start_key == key).outerjoin(skip, true()))


@dataclass
class Marked:
    """What :func:`mark` made of a chunk."""

    started: bool = False
    """The chunk's marker is ours: its runs still ours start (all of them unless ``only``)."""
    only: set[int] | None = None
    """Set when the marker was found ours from an earlier attempt: the runs still ours."""
    skipped: dict[int, str] = field(default_factory=dict)
    """Recorded ``SKIPPED`` (the job is paused), with the reason written."""
    early: bool = False
    """Not decided: the slot has not come by the database's clock (or a concurrent write is
    not visible yet): try again shortly."""


async def mark(
    db: Database,
    start_key: str,
    *,
    ids: list[int],
    slot: datetime,
    lease_until: datetime,
    instance_id: str,
    now: datetime,
    held: Held | None = None,
) -> Marked:
    """Start the runs ``ids`` of this instance's chunk ``start_key``, claimed ahead of
    ``slot``, whose leases were claimed until ``lease_until`` (the earliest): one round trip on
    PostgreSQL (a short transaction elsewhere), writing one row whatever the number of runs.
    Not started when the leader handed the chunk back first, or its leases lapsed. ``held``:
    a connection taken ahead for it (:mod:`slotcron.store.held`), marked unclean if it fails."""
    sql = _mark(db.dialect, db.server_clock)
    params = {
        "p_key": start_key,
        "p_ids": ids,
        "p_instance": instance_id,
        "p_now": now,
        "p_slot": slot,
        "p_lease_until": lease_until,
        # Never before the slot: the scheduler's clock may be a hair behind the database's.
        "p_started": max(slot, now),
    }
    out = Marked()
    if sql.one_trip is not None:
        rows = None if held is None else await held_store.execute(held, sql.one_trip, params)
        if rows is None:
            async with db.alone(write=True) as conn:
                rows = list((await conn.execute(sql.one_trip, params)).all())
        first = rows[0]
        if first.inserted:
            out.started = True
            out.skipped = {int(r.id): r.error for r in rows if r.id is not None}
            return out
        if held is not None:
            await held.release()  # what follows takes a connection of its own (a pool of one)
        return await _found(db, sql, first, params, out)
    async with db.transaction() as conn:
        if (await conn.execute(sql.insert, params)).rowcount == 1:
            out.started = True
            await _skip_paused(conn, sql, params, out)
            return out
        first = (await conn.execute(sql.state, params)).one()
    return await _found(db, sql, first, params, out)


async def _skip_paused(
    conn: AsyncConnection, sql: _Mark, params: dict[str, Any], out: Marked
) -> None:
    """Record SKIPPED the runs of the chunk whose job is paused (the paused jobs are read
    first: where there are none, as nearly always, no run is read or written)."""
    paused = {r.name: r.error for r in await conn.execute(sql.paused_jobs, params)}
    if not paused:
        return
    runs = await conn.execute(sql.runs_of, {**params, "p_paused": list(paused)})
    by_reason: dict[str, list[int]] = {}
    for run in runs:
        by_reason.setdefault(paused[run.job_name], []).append(int(run.id))
    for reason, ids in by_reason.items():
        await conn.execute(sql.skip, {**params, "p_skip": ids, "p_error": reason})
        out.skipped.update(dict.fromkeys(ids, reason))


async def _found(
    db: Database, sql: _Mark, state: Any, params: dict[str, Any], out: Marked
) -> Marked:
    """The marker did not go in: judge by what was found instead."""
    if not state.marked:
        # Still ours: the slot has not come by the database's clock, or a concurrent insert of
        # the key is not visible to our snapshot yet. Else none of the chunk is ours any more.
        out.early = bool(state.live)
        return out
    if state.holder != params["p_instance"] or state.handed:
        return out  # handed back by the leader first: nothing of the chunk starts here
    # Ours already: an earlier attempt committed but its answer was lost (an outage), or these
    # runs are a chunk claimed as the slot came, after its burst's marker went in.
    async with db.transaction() as conn:
        await _skip_paused(conn, sql, params, out)
        out.only = {int(i) for i in (await conn.execute(sql.ours, params)).scalars()}
    out.started = True
    return out


async def settle(db: Database, keys: Collection[str], *, now: datetime) -> dict[str, Any]:
    """For the leader, about to hand back unstarted runs of chunks ``keys`` whose lease lapsed:
    insert a tombstone for each chunk not started (from then on its instance starts nothing of
    it), and return each key's start (None: handed back; its runs go back to the queue)."""
    if not keys:
        return {}
    rows = [
        {"start_key": key, "instance_id": None, "started_at": None, "handed_back": True}
        for key in keys
    ]
    async with db.transaction() as conn:
        await conn.execute(
            db.dialect.insert_new(start_markers).values([{**r, "created_at": now} for r in rows])
        )
        found = await conn.execute(
            select(
                start_markers.c.start_key, start_markers.c.started_at, start_markers.c.handed_back
            ).where(start_markers.c.start_key.in_(list(keys)))
        )
        return {r.start_key: None if r.handed_back else r.started_at for r in found}


async def prune(db: Database, *, before: datetime, batch: int = 500) -> int:
    """Delete up to ``batch`` markers created before ``before`` whose chunk has no run in
    flight any more (each finished run holds its own ``started_at`` by then)."""
    in_flight = exists().where(
        executions.c.start_key == start_markers.c.start_key,
        executions.c.status == Status.RUNNING.value,
    )
    async with db.transaction() as conn:
        keys = list(
            (
                await conn.execute(
                    select(start_markers.c.start_key)
                    .where(start_markers.c.created_at < before, ~in_flight)
                    .limit(batch)
                )
            ).scalars()
        )
        if keys:
            await conn.execute(delete(start_markers).where(start_markers.c.start_key.in_(keys)))
    return len(keys)


async def rehearse(db: Database, conn: AsyncConnection) -> None:
    """Run :func:`mark`'s statements once, writing nothing (see ``claims.rehearse``); on a
    connection that can be held, as it will be (:func:`slotcron.store.held.learn`)."""
    sql = _mark(db.dialect, db.server_clock)
    epoch = datetime(2000, 1, 1, tzinfo=UTC)
    # The very keys mark() binds (they are part of the compiled statement's cache key), each
    # its own value, and leases long lapsed: nothing is written.
    params: dict[str, Any] = {
        "p_key": "\x01rehearsed key",
        "p_instance": "\x01rehearsed instance",
        "p_now": epoch + timedelta(microseconds=1),
        "p_slot": epoch + timedelta(microseconds=2),
        "p_started": epoch + timedelta(microseconds=3),
        "p_lease_until": epoch + timedelta(microseconds=4),
        "p_ids": [-1],
    }
    if sql.one_trip is not None:
        if held_store.holds(db):
            await held_store.learn(db, conn, sql.one_trip, params)
        else:
            await conn.execute(sql.one_trip, params)
        return
    await conn.execute(sql.insert, params)
    await conn.execute(sql.state, params)
    await conn.execute(sql.paused_jobs, params)
