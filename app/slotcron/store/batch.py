"""Claiming many slots in one transaction: what makes a burst of jobs due together cheap.

The rules are those of the single claim (:func:`slotcron.store.claims.judge`); the transaction's
round trips do not grow with the batch. Rows another claimer holds are skipped
(``SKIP LOCKED``) and handed back in :attr:`Decided.held`, to be retried, never dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from slotcron.errors import RowBusy
from slotcron.status import Status
from slotcron.store.batch_statements import (
    BatchStatements,
    batch_statements,
    open_among_statement,
    run_params,
)
from slotcron.store.claims import Claim, Fate, judge
from slotcron.store.database import Database
from slotcron.store.execution_rows import execution_row
from slotcron.store.start_keys import key_for


@dataclass(frozen=True)
class Due:
    """One job's slot to decide in a :func:`claim_many` batch."""

    job_name: str
    slot: datetime
    following: datetime
    trigger: str
    lease_ms: int
    forbid_overlap: bool
    missed_reason: str | None = None
    """Record the slot ``MISSED`` with this reason instead of running it (misfire)."""
    excluded: str | None = None
    """Record the slot ``SKIPPED`` with this reason: the job's calendar excludes its day."""
    max_runs: int | None = None
    """The job's bound on completed runs: such a job is claimed one by one, never in a batch
    (its runs in flight are counted under its row lock: :mod:`slotcron.store.counted`)."""
    check_gap: bool = True
    """False when deciding late slots in order: earlier ones were passed over on purpose."""
    fingerprint: str | None = None
    """The schedule the claimer fires (:func:`slotcron.store.claims.judge`): refused if another is
    in
    force. None presents none."""


@dataclass
class Decided:
    """What one :func:`claim_many` transaction decided, job by job."""

    claims: dict[str, Claim] = field(default_factory=dict)
    taken: set[str] = field(default_factory=set)
    """Already decided by someone else: the slot is closed."""
    held: list[Due] = field(default_factory=list)
    """Rows another claimer held at that moment: not decided, to be tried again."""
    deferred: list[Due] = field(default_factory=list)
    """Claimed ahead of their time while a run still held the job's lease (``forbid``): not
    decided, to be claimed when their time comes (the run may have ended by then)."""
    undecided: list[Due] = field(default_factory=list)
    """Slots before this one were never decided: for the misfire path first."""
    expected: dict[str, datetime] = field(default_factory=dict)
    """Of each ``undecided`` job, the first slot never decided."""
    superseded: set[str] = field(default_factory=set)
    """Jobs whose schedule in force is not the claimer's (also in ``taken``: not decided by this
    claim; :meth:`slotcron.engine.supersession.Supersession.refused` says what follows)."""
    start_keys: dict[str, str] = field(default_factory=dict)
    """Of each job whose run was claimed ahead, the key its start marker is inserted under at
    the slot (:mod:`slotcron.store.markers`): one key per slot and
    :data:`slotcron.store.start_keys.MARKER_RUNS` runs (:mod:`slotcron.store.start_keys`)."""


async def claim_many(
    db: Database,
    items: list[Due],
    *,
    instance_id: str,
    now: datetime,
) -> Decided:
    """Decide every item's slot by the rules of the single claim, in one transaction.

    Round trips do not grow with the batch: lock the rows (skipping held ones), read the live
    leases of ``forbid`` jobs, insert the runs (one statement per slot and lease length), the
    slots not run, and advance the jobs. Raises :class:`RowBusy` only where the whole database
    is one lock (SQLite).

    A slot may be claimed ahead of its time (``now`` before it): its run is recorded with no
    ``started_at`` (its body has not started: its chunk's start marker goes in at the slot,
    :mod:`slotcron.store.markers`, which honours a pause committed meanwhile), and a ``forbid`` job
    whose lease is still held is deferred rather than ``SKIPPED``, since overlap is judged when
    the slot comes."""
    decided = Decided()
    by_name = {item.job_name: item for item in items}
    sql = batch_statements(db.dialect, db.server_clock)
    try:
        async with db.transaction(nowait=True) as conn:
            locked = await _lock(conn, sql, by_name, decided)
            holders = await _holders(conn, sql, locked, by_name, now)
            plan = _judge_all(locked, by_name, holders, now, decided)
            ids, tokens, keys = await _write(conn, sql, plan, instance_id, now)
    except IntegrityError:
        # Only a claimer that skipped our locks could collide: let each job retry on its own.
        return Decided(held=list(items))
    except DBAPIError as exc:
        if db.dialect.is_lock_unavailable(exc):
            raise RowBusy(f"{len(items)} jobs") from None
        raise
    decided.claims = _claims(plan, by_name, ids, tokens, now)
    decided.start_keys = {
        name: keys[c.scheduled_at]
        for name, c in decided.claims.items()
        if c.scheduled_at in keys and c.status == Status.RUNNING
    }
    return decided


@dataclass
class _Plan:
    """What one batch writes: runs grouped by (slot, trigger, lease), slots not run, and the
    jobs' high-water marks grouped by (slot, next slot)."""

    runs: dict[tuple[datetime, str, int], list[str]] = field(default_factory=dict)
    not_run: list[tuple[Due, Status, str]] = field(default_factory=list)
    advance: dict[tuple[datetime, datetime], list[str]] = field(default_factory=dict)


async def _lock(
    conn: AsyncConnection, sql: BatchStatements, by_name: dict[str, Due], decided: Decided
) -> dict[str, Any]:
    """Lock the jobs' rows, skipping those another claimer holds (handed back as ``held``)."""
    locked = {row.name: row for row in await conn.execute(sql.lock, {"p_names": list(by_name)})}
    if len(locked) < len(by_name):
        unlocked = [name for name in by_name if name not in locked]
        known = {row.name for row in await conn.execute(sql.high_water, {"p_names": unlocked})}
        # A row gone is a runtime schedule removed: none of its slots is open.
        decided.taken.update(name for name in unlocked if name not in known)
        decided.held = [by_name[name] for name in unlocked if name in known]
    return locked


async def _holders(
    conn: AsyncConnection,
    sql: BatchStatements,
    locked: dict[str, Any],
    by_name: dict[str, Due],
    now: datetime,
) -> dict[str, Any]:
    """Of the ``forbid`` jobs, the run holding each one's lease (a paused job's too: claimed
    ahead, its slot runs if it is resumed before its time)."""
    forbid = [n for n, r in locked.items() if by_name[n].forbid_overlap]
    holders: dict[str, Any] = {}
    if forbid:
        if sql.custom_plans is not None:
            # The live leases are read off the (status, lease_until) index, as the statistics
            # say RUNNING rows are few; a burst claimed ahead makes them thousands within
            # seconds, each tested against the chunk's names: with the generic plan of a
            # prepared statement, one by one along the list (100,000 claims spent 88 s of the
            # database here); with a plan for the names as bound, by a hash.
            await conn.execute(sql.custom_plans)
        for h in await conn.execute(sql.holders, {"p_names": forbid, "p_now": now}):
            holders.setdefault(h.job_name, h)
    return holders


def _judge_all(
    locked: dict[str, Any],
    by_name: dict[str, Due],
    holders: dict[str, Any],
    now: datetime,
    decided: Decided,
) -> _Plan:
    plan = _Plan()
    for name, row in locked.items():
        item = by_name[name]
        if item.max_runs is not None:
            decided.held.append(item)
            continue
        verdict = judge(
            row,
            slot=item.slot,
            now=now,
            check_gap=item.check_gap,
            missed_reason=item.missed_reason,
            holder=holders.get(name),
            may_defer=True,
            fingerprint=item.fingerprint,
            excluded=item.excluded,
        )
        if verdict.fate is Fate.SUPERSEDED:
            decided.superseded.add(name)
            decided.taken.add(name)
            continue
        if verdict.fate is Fate.TAKEN:
            decided.taken.add(name)
            continue
        if verdict.fate is Fate.UNDECIDED:
            decided.undecided.append(item)
            decided.expected[name] = row.next_slot_at
            continue
        if verdict.fate is Fate.DEFERRED:
            decided.deferred.append(item)
            continue
        if verdict.fate is Fate.NOT_RUN:
            assert verdict.status is not None and verdict.reason is not None
            plan.not_run.append((item, verdict.status, verdict.reason))
        else:
            plan.runs.setdefault((item.slot, item.trigger, item.lease_ms), []).append(name)
        plan.advance.setdefault((item.slot, item.following), []).append(name)
    return plan


async def _write(
    conn: AsyncConnection,
    sql: BatchStatements,
    plan: _Plan,
    instance_id: str,
    now: datetime,
) -> tuple[dict[str, int], dict[str, int], dict[datetime, str]]:
    """Insert the plan's rows and advance its jobs; return each job's new execution id, and
    each run's fencing token (the job's counter, taken). Runs claimed ahead of their slot get
    their slot's start key (returned too): one start marker per slot and
    :data:`slotcron.store.start_keys.MARKER_RUNS`, whatever the chunks."""
    ids: dict[str, int] = {}
    tokens: dict[str, int] = {}
    start_keys = _ahead_keys(plan, instance_id, now)
    for (slot, trigger, lease_ms), names in plan.runs.items():
        ahead = slot > now
        params = run_params(
            names,
            slot=slot,
            trigger=trigger,
            instance_id=instance_id,
            now=now,
            # Claimed ahead: not started until its slot (slotcron.store.starts).
            started=None if ahead else now,
            start_key=start_keys[slot] if ahead else None,
            lease_ms=lease_ms,
        )
        for row in await conn.execute(sql.insert_runs, params):
            ids[row.job_name] = int(row.id)
            tokens[row.job_name] = int(row.fencing_token)
    if plan.not_run:
        ids.update(await _insert_not_run(conn, sql, plan, instance_id, now))
    await _advance(conn, sql, plan, tokens)
    return ids, tokens, start_keys


def _ahead_keys(plan: _Plan, instance_id: str, now: datetime) -> dict[datetime, str]:
    """The start key of each slot the plan claims runs ahead of."""
    ahead_runs: dict[datetime, int] = {}
    for (slot, _, _), names in plan.runs.items():
        if slot > now:
            ahead_runs[slot] = ahead_runs.get(slot, 0) + len(names)
    return {slot: key_for(instance_id, slot, count, now) for slot, count in ahead_runs.items()}


async def _insert_not_run(
    conn: AsyncConnection, sql: BatchStatements, plan: _Plan, instance_id: str, now: datetime
) -> dict[str, int]:
    """Record the slots not run (MISSED, SKIPPED); return their execution ids by job."""
    rows = [
        execution_row(
            job_name=i.job_name,
            slot=i.slot,
            trigger=i.trigger,
            status=status,
            instance_id=instance_id,
            now=now,
            reason=reason,
        )
        for i, status, reason in plan.not_run
    ]
    inserted_ids = await conn.execute(sql.insert_rows, rows)
    return {
        item.job_name: int(execution_id)
        for (item, _, _), execution_id in zip(plan.not_run, inserted_ids.scalars(), strict=True)
    }


async def _advance(
    conn: AsyncConnection, sql: BatchStatements, plan: _Plan, tokens: dict[str, int]
) -> None:
    """Move each job's high-water mark to its slot (and a run's job's fencing counter on)."""
    for (slot, following), names in plan.advance.items():
        runs = [name for name in names if name in tokens]
        others = [name for name in names if name not in tokens] if len(runs) < len(names) else []
        for statement, which in ((sql.advance_runs, runs), (sql.advance, others)):
            if which:
                await conn.execute(
                    statement, {"p_names": which, "p_slot": slot, "p_next": following}
                )


def _claims(
    plan: _Plan,
    by_name: dict[str, Due],
    ids: dict[str, int],
    tokens: dict[str, int],
    now: datetime,
) -> dict[str, Claim]:
    claims: dict[str, Claim] = {}
    for names in plan.runs.values():
        for name in names:
            item = by_name[name]
            claims[name] = Claim(
                execution_id=ids[name],
                job_name=name,
                scheduled_at=item.slot,
                trigger=item.trigger,
                status=Status.RUNNING,
                attempt=1,
                lease_until=now + timedelta(milliseconds=item.lease_ms),
                lease_ms=item.lease_ms,
                fencing_token=tokens[name],
                started=item.slot <= now,
            )
    for item, status, reason in plan.not_run:
        claims[item.job_name] = Claim(
            execution_id=ids[item.job_name],
            job_name=item.job_name,
            scheduled_at=item.slot,
            trigger=item.trigger,
            status=status,
            attempt=1,
            lease_until=None,
            lease_ms=None,
            reason=reason,
        )
    return claims


async def still_open(db: Database, items: list[Due]) -> list[Due]:
    """The items whose slot is not closed yet, by a plain read that waits for no lock."""
    if not items:
        return []
    async with db.read() as conn:
        rows = await conn.execute(
            batch_statements(db.dialect).high_water, {"p_names": [i.job_name for i in items]}
        )
        high: dict[str, datetime | None] = {row.name: row.last_slot_at for row in rows}
    return [i for i in items if (h := high.get(i.job_name)) is None or h < i.slot]


async def open_among(db: Database, items: list[Due]) -> list[Due]:
    """The items whose slot is not closed yet and whose job still exists, by a plain read
    that waits for no lock: the database returns only those (a chunk another instance claimed
    comes back empty, with nothing to decode)."""
    by_slot: dict[datetime, list[str]] = {}
    for item in items:
        by_slot.setdefault(item.slot, []).append(item.job_name)
    open_: set[tuple[str, datetime]] = set()
    async with db.read() as conn:
        for slot, names in by_slot.items():
            rows = await conn.execute(
                open_among_statement(db.dialect), {"p_names": names, "p_slot": slot}
            )
            open_.update((name, slot) for name in rows.scalars())
    return [i for i in items if (i.job_name, i.slot) in open_]


async def rehearse(db: Database, conn: AsyncConnection) -> None:
    """Run the batch statements once, deciding nothing (see
    :func:`slotcron.store.claims.rehearse`)."""
    sql = batch_statements(db.dialect, db.server_clock)
    nobody: dict[str, Any] = {"p_names": []}
    epoch = datetime(2000, 1, 1, tzinfo=UTC)
    await conn.execute(sql.lock, nobody)
    await conn.execute(sql.high_water, nobody)
    await conn.execute(sql.holders, {**nobody, "p_now": epoch})
    params = run_params(
        [],
        slot=epoch,
        trigger="cron",
        instance_id="",
        now=epoch,
        started=epoch,
        start_key=None,
        lease_ms=0,
    )
    await conn.execute(sql.insert_runs, params)
    for statement in (sql.advance, sql.advance_runs):
        await conn.execute(statement, {**nobody, "p_slot": epoch, "p_next": epoch})
    await conn.execute(open_among_statement(db.dialect), {**nobody, "p_slot": epoch})
