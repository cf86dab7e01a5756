"""Claiming many slots in one transaction: what makes a burst of jobs due together cheap.

The rules are those of the single claim (:func:`slotcron.store.claims.judge`); the transaction's
round trips do not grow with the batch. Rows another claimer holds are skipped
(``SKIP LOCKED``) and handed back in :attr:`Decided.held`, to be retried, never dropped.
"""

from __future__ import annotations

import functools
import hashlib
import secrets
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import (
    JSON,
    Integer,
    String,
    bindparam,
    insert,
    literal,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from slotcron.errors import RowBusy
from slotcron.status import Status
from slotcron.store.claims import Claim, Fate, execution_row, judge
from slotcron.store.database import Database, now_in_sql
from slotcron.store.dialects import Dialect
from slotcron.store.tables import UTCDateTime, executions, jobs


@dataclass(frozen=True)
class _Batch:
    """The statements of :func:`claim_many`, built once per dialect. Each takes the batch's
    job names as one list parameter, ``p_names``."""

    lock: Any
    high_water: Any
    holders: Any
    insert_runs: Any
    insert_rows: Any
    advance: Any
    advance_runs: Any
    custom_plans: Any | None
    """PostgreSQL: plan the rest of the transaction for its lists as bound (see _holders)."""


@functools.cache
def _batch(dialect: Dialect, server_clock: bool = False) -> _Batch:
    names = dialect.among(jobs.c.name, "p_names", String())
    now = bindparam("p_now", type_=UTCDateTime())
    # A run's row is built by the database from each job name: one statement, whatever the
    # number of runs, and no per-row parameters to bind.
    runs = select(
        jobs.c.name,
        bindparam("p_slot", type_=UTCDateTime()),
        bindparam("p_trigger", type_=String()),
        literal(Status.RUNNING.value, String()),
        literal(1, Integer()),
        bindparam("p_instance", type_=String()),
        now,
        bindparam("p_started", type_=UTCDateTime()),
        now,
        bindparam("p_lease_until", type_=UTCDateTime()),
        bindparam("p_lease_ms", type_=Integer()),
        bindparam("p_params", type_=JSON()),
        bindparam("p_state", type_=JSON()),
        jobs.c.fencing_token + 1,  # taken by the job's counter below, in the same transaction
        bindparam("p_start_key", type_=String()),
    ).where(names)
    columns = [
        "job_name", "scheduled_at", "trigger", "status", "attempt", "instance_id", "created_at",
        "started_at", "heartbeat_at", "lease_until", "lease_ms", "params", "state",
        "fencing_token", "start_key",
    ]  # fmt: skip
    return _Batch(
        lock=select(
            jobs.c.name,
            jobs.c.paused,
            jobs.c.paused_reason,
            jobs.c.last_slot_at,
            jobs.c.next_slot_at,
            jobs.c.fencing_token,
            jobs.c.fingerprint,
        )
        .where(names)
        .with_for_update(skip_locked=True),
        high_water=select(jobs.c.name, jobs.c.last_slot_at).where(names),
        holders=select(executions.c.job_name, executions.c.id, executions.c.instance_id).where(
            dialect.among(executions.c.job_name, "p_names", String()),
            executions.c.status == Status.RUNNING,
            executions.c.lease_until > now_in_sql(dialect, server_clock),
        ),
        insert_runs=insert(executions)
        .from_select(columns, runs)
        .returning(executions.c.id, executions.c.job_name, executions.c.fencing_token),
        insert_rows=insert(executions).returning(executions.c.id, sort_by_parameter_order=True),
        advance=update(jobs)
        .where(names)
        .values(
            last_slot_at=bindparam("p_slot", type_=UTCDateTime()),
            next_slot_at=bindparam("p_next", type_=UTCDateTime()),
        ),
        # A run takes the job's next fencing token (inserted above as token + 1). Its own
        # statement: a CASE testing each row against the list of runs costs the square of the
        # chunk's size, most of a large chunk's claim.
        advance_runs=update(jobs)
        .where(names)
        .values(
            last_slot_at=bindparam("p_slot", type_=UTCDateTime()),
            next_slot_at=bindparam("p_next", type_=UTCDateTime()),
            fencing_token=jobs.c.fencing_token + 1,
        ),
        custom_plans=text("SET LOCAL plan_cache_mode = force_custom_plan")
        if dialect.name == "postgresql"
        else None,
    )


_PROCESS = secrets.token_hex(8)
MARKER_RUNS = 100_000
"""Runs claimed ahead for one slot that share a start key, at most (whole chunks); past it the
next key, whose marker goes out at the slot together with the first, on its own connection.
A marker's statement costs the database about 4 us per run it starts (100,000: 0.4-0.6 s at
the slot, before any body starts). Measured on 2 cores, 100,000 due at once: one marker, p99
0.89 s; five of 20,000, 1.15 s on an idle machine (they share its two cores with each other
and with the first bodies' bookkeeping), but 1.7 s against 2.4 s on a machine busy elsewhere."""
_filling: dict[tuple[str, datetime], tuple[int, int]] = {}
"""Per (instance, slot) claimed ahead by this process: the key group being filled, and how many
runs it holds so far."""


def start_key(instance_id: str, slot: datetime, group: int = 0) -> str:
    """The start marker's key of this process's runs claimed ahead of ``slot`` (its
    ``group``-th :data:`MARKER_RUNS`): the same for every chunk of a burst of up to that many
    runs, so one marker starts them all (:mod:`slotcron.store.markers`)."""
    seed = f"{_PROCESS} {instance_id} {slot.isoformat()}"
    if group:
        seed += f" {group}"
    return hashlib.blake2b(seed.encode(), digest_size=16).hexdigest()


def _key_for(instance_id: str, slot: datetime, runs: int, now: datetime) -> str:
    """The start key of a chunk of ``runs`` runs claimed ahead of ``slot``: the slot's group
    being filled, or the next one once it holds :data:`MARKER_RUNS`."""
    for gone in [k for k in _filling if k[1] <= now]:
        del _filling[gone]
    group, held = _filling.get((instance_id, slot), (0, 0))
    if held and held + runs > MARKER_RUNS:
        group, held = group + 1, 0
    _filling[instance_id, slot] = (group, held + runs)
    return start_key(instance_id, slot, group)


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
    the slot (:mod:`slotcron.store.markers`): one key per slot and :data:`MARKER_RUNS` runs
    (:func:`start_key`)."""


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
    sql = _batch(db.dialect, db.server_clock)
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
    conn: AsyncConnection, sql: _Batch, by_name: dict[str, Due], decided: Decided
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
    sql: _Batch,
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
        verdict = judge(
            row,
            slot=item.slot,
            now=now,
            check_gap=item.check_gap,
            missed_reason=item.missed_reason,
            holder=holders.get(name),
            may_defer=True,
            fingerprint=item.fingerprint,
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
    sql: _Batch,
    plan: _Plan,
    instance_id: str,
    now: datetime,
) -> tuple[dict[str, int], dict[str, int], dict[datetime, str]]:
    """Insert the plan's rows and advance its jobs; return each job's new execution id, and
    each run's fencing token (the job's counter, taken). Runs claimed ahead of their slot get
    their slot's start key (returned too): one start marker per slot and
    :data:`MARKER_RUNS`, whatever the chunks."""
    ids: dict[str, int] = {}
    tokens: dict[str, int] = {}
    start_keys: dict[datetime, str] = {}
    ahead_runs: dict[datetime, int] = {}
    for (slot, _, _), names in plan.runs.items():
        if slot > now:
            ahead_runs[slot] = ahead_runs.get(slot, 0) + len(names)
    for slot, count in ahead_runs.items():
        start_keys[slot] = _key_for(instance_id, slot, count, now)
    for (slot, trigger, lease_ms), names in plan.runs.items():
        ahead = slot > now
        inserted = await conn.execute(
            sql.insert_runs,
            {
                "p_names": names,
                "p_slot": slot,
                "p_trigger": trigger,
                "p_instance": instance_id,
                "p_now": now,
                # Claimed ahead: not started until its slot (slotcron.store.starts).
                "p_started": None if ahead else now,
                "p_start_key": start_keys[slot] if ahead else None,
                "p_lease_until": now + timedelta(milliseconds=lease_ms),
                "p_lease_ms": lease_ms,
                "p_params": {},
                "p_state": {},
            },
        )
        for row in inserted:
            ids[row.job_name] = int(row.id)
            tokens[row.job_name] = int(row.fencing_token)
    if plan.not_run:
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
        for (item, _, _), execution_id in zip(plan.not_run, inserted_ids.scalars(), strict=True):
            ids[item.job_name] = int(execution_id)
    for (slot, following), names in plan.advance.items():
        runs = [name for name in names if name in tokens]
        others = [name for name in names if name not in tokens] if len(runs) < len(names) else []
        for statement, which in ((sql.advance_runs, runs), (sql.advance, others)):
            if which:
                await conn.execute(
                    statement, {"p_names": which, "p_slot": slot, "p_next": following}
                )
    return ids, tokens, start_keys


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
            _batch(db.dialect).high_water, {"p_names": [i.job_name for i in items]}
        )
        high: dict[str, datetime | None] = {row.name: row.last_slot_at for row in rows}
    return [i for i in items if (h := high.get(i.job_name)) is None or h < i.slot]


@functools.cache
def _open_among(dialect: Dialect) -> Any:
    return select(jobs.c.name).where(
        dialect.among(jobs.c.name, "p_names", String()),
        or_(
            jobs.c.last_slot_at.is_(None), jobs.c.last_slot_at < bindparam("p_slot", UTCDateTime())
        ),
    )


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
            rows = await conn.execute(_open_among(db.dialect), {"p_names": names, "p_slot": slot})
            open_.update((name, slot) for name in rows.scalars())
    return [i for i in items if (i.job_name, i.slot) in open_]


async def rehearse(db: Database, conn: AsyncConnection) -> None:
    """Run the batch statements once, deciding nothing (see
    :func:`slotcron.store.claims.rehearse`)."""
    sql = _batch(db.dialect, db.server_clock)
    nobody: dict[str, Any] = {"p_names": []}
    epoch = datetime(2000, 1, 1, tzinfo=UTC)
    await conn.execute(sql.lock, nobody)
    await conn.execute(sql.high_water, nobody)
    await conn.execute(sql.holders, {**nobody, "p_now": epoch})
    await conn.execute(
        sql.insert_runs,
        {
            **nobody,
            "p_slot": epoch,
            "p_trigger": "cron",
            "p_instance": "",
            "p_now": epoch,
            "p_started": epoch,
            "p_start_key": None,
            "p_lease_until": epoch,
            "p_lease_ms": 0,
            "p_params": {},
            "p_state": {},
        },
    )
    for statement in (sql.advance, sql.advance_runs):
        await conn.execute(statement, {**nobody, "p_slot": epoch, "p_next": epoch})
    await conn.execute(_open_among(db.dialect), {**nobody, "p_slot": epoch})
