"""The statements of a batch claim (:func:`slotcron.store.batch.claim_many`), built once per
dialect: each takes the batch's job names as one list parameter, ``p_names``, so its text (and
its prepared plan) does not change with the batch's size."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    JSON,
    ColumnElement,
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

from slotcron.status import Status
from slotcron.store.database import now_in_sql
from slotcron.store.dialects import Dialect
from slotcron.store.skips import moved_on
from slotcron.store.tables import UTCDateTime, executions, jobs


@dataclass(frozen=True)
class BatchStatements:
    """The statements of :func:`slotcron.store.batch.claim_many`."""

    lock: Any
    high_water: Any
    holders: Any
    insert_runs: Any
    insert_rows: Any
    advance: Any
    advance_runs: Any
    custom_plans: Any | None
    """PostgreSQL: plan the rest of the transaction for its lists as bound (see
    :func:`slotcron.store.batch.claim_many`)."""


@functools.cache
def batch_statements(dialect: Dialect, server_clock: bool = False) -> BatchStatements:
    names = dialect.among(jobs.c.name, "p_names", String())
    now = bindparam("p_now", type_=UTCDateTime())
    slot = bindparam("p_slot", type_=UTCDateTime())
    return BatchStatements(
        lock=select(
            jobs.c.name,
            jobs.c.paused,
            jobs.c.paused_reason,
            jobs.c.last_slot_at,
            jobs.c.next_slot_at,
            jobs.c.fencing_token,
            jobs.c.fingerprint,
            jobs.c.skip_at,
            jobs.c.skip_reason,
        )
        .where(names)
        .with_for_update(skip_locked=True),
        high_water=select(jobs.c.name, jobs.c.last_slot_at).where(names),
        holders=select(executions.c.job_name, executions.c.id, executions.c.instance_id).where(
            dialect.among(executions.c.job_name, "p_names", String()),
            executions.c.status == Status.RUNNING,
            executions.c.lease_until > now_in_sql(dialect, server_clock),
        ),
        insert_runs=_insert_runs(names, now),
        insert_rows=insert(executions).returning(executions.c.id, sort_by_parameter_order=True),
        advance=update(jobs)
        .where(names)
        .ordered_values(
            (jobs.c.last_slot_at, slot),
            (jobs.c.next_slot_at, bindparam("p_next", type_=UTCDateTime())),
            *moved_on(slot),
        ),
        # A run takes the job's next fencing token (inserted above as token + 1). Its own
        # statement: a CASE testing each row against the list of runs costs the square of the
        # chunk's size, most of a large chunk's claim.
        advance_runs=update(jobs)
        .where(names)
        .ordered_values(
            (jobs.c.last_slot_at, slot),
            (jobs.c.next_slot_at, bindparam("p_next", type_=UTCDateTime())),
            (jobs.c.fencing_token, jobs.c.fencing_token + 1),
            *moved_on(slot),
        ),
        custom_plans=text("SET LOCAL plan_cache_mode = force_custom_plan")
        if dialect.name == "postgresql"
        else None,
    )


def _insert_runs(names: ColumnElement[bool], now: Any) -> Any:
    """The INSERT of a batch's runs, one per job of ``p_names``."""
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
    return (
        insert(executions)
        .from_select(columns, runs)
        .returning(executions.c.id, executions.c.job_name, executions.c.fencing_token)
    )


def run_params(
    names: list[str],
    *,
    slot: datetime,
    trigger: str,
    instance_id: str,
    now: datetime,
    started: datetime | None,
    start_key: str | None,
    lease_ms: int,
) -> dict[str, Any]:
    """The parameters of :attr:`BatchStatements.insert_runs`: one run for each of ``names``."""
    return {
        "p_names": names,
        "p_slot": slot,
        "p_trigger": trigger,
        "p_instance": instance_id,
        "p_now": now,
        "p_started": started,
        "p_start_key": start_key,
        "p_lease_until": now + timedelta(milliseconds=lease_ms),
        "p_lease_ms": lease_ms,
        "p_params": {},
        "p_state": {},
    }


@functools.cache
def open_among_statement(dialect: Dialect) -> Any:
    return select(jobs.c.name).where(
        dialect.among(jobs.c.name, "p_names", String()),
        or_(
            jobs.c.last_slot_at.is_(None), jobs.c.last_slot_at < bindparam("p_slot", UTCDateTime())
        ),
    )
