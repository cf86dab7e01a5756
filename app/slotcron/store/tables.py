"""The tables, defined once. The Alembic migrations create them; this is what queries use.

Every id and name column (job and schedule names, tasks, instance ids, start keys) compares byte
for byte on every backend: PostgreSQL's and SQLite's collations do, and on MariaDB/MySQL
migration 0008 gives them a binary collation without padding (which one depends on the server,
so it is not spelled here: no statement of ours names a collation)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    ColumnElement,
    DateTime,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    cast,
    literal,
)
from sqlalchemy.dialects import mysql, postgresql
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator, TypeEngine


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC in Python; ``timestamptz`` on PostgreSQL, ``DATETIME(6)`` holding UTC elsewhere."""

    impl = DateTime
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "postgresql":
            return dialect.type_descriptor(postgresql.TIMESTAMP(timezone=True))
        if dialect.name in ("mysql", "mariadb"):
            return dialect.type_descriptor(mysql.DATETIME(fsp=6))
        return dialect.type_descriptor(DateTime())

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r} given to a UTC column")
        value = value.astimezone(UTC)
        return value if dialect.name == "postgresql" else value.replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


# SQLite only auto-increments an INTEGER PRIMARY KEY.
ID = BigInteger().with_variant(Integer(), "sqlite")

metadata = MetaData()

jobs = Table(
    "scheduler_jobs",
    metadata,
    Column("name", String(200), primary_key=True),
    Column("kind", String(16), nullable=False),
    Column("schedule", String(200), nullable=False),
    Column("timezone", String(64), nullable=False),
    Column("options", JSON, nullable=False),
    Column("paused", Boolean, nullable=False, default=False),
    Column("paused_reason", String(400), nullable=True),
    # Permanent high-water mark of the cron/interval trigger: a slot at or before it is closed,
    # even after its history row is pruned.
    Column("last_slot_at", UTCDateTime(), nullable=True),
    # The slot expected after the last one decided: a claim that finds it earlier than its own
    # slot has found slots nobody decided (every instance down, database down).
    Column("next_slot_at", UTCDateTime(), nullable=True),
    Column("registered_at", UTCDateTime(), nullable=False),
    Column("updated_at", UTCDateTime(), nullable=False),
    Column("updated_by", String(200), nullable=True),
    Column("version", String(32), nullable=True),
    # {version: "schedule (timezone)"} as each version registered it: drift between live
    # versions (a blue/green overlap that changed a schedule) is visible in `slotcron jobs`.
    Column("schedules", JSON, nullable=True),
    # The last fencing token a run of this job took (migration 0003).
    Column("fencing_token", BigInteger, nullable=False, server_default="0", default=0),
    # The schedule in force: its registrant's anchor and hash of slot instants (migration 0005,
    # slotcron.schedule.fingerprint). A claimer whose own fingerprint differs was superseded:
    # refused.
    Column("fingerprint", String(80), nullable=True),
    # {instance_id: "schedule (timezone)"}: instances that stopped firing the job, superseded.
    Column("superseded", JSON, nullable=True),
    # A runtime schedule (migration 0006): the task it runs (NULL on a code job), its params
    # and its own jitter (NULL: the task's). Its id is ``name``; ``registered_at`` its creation.
    Column("task", String(200), nullable=True),
    Column("params", JSON, nullable=True),
    Column("jitter", Float, nullable=True),
    # The earliest slot an operator asked to skip that is not decided yet, and the reason given
    # (migration 0009; every skip is a row of ``scheduler_skips``): claims read it with the row's
    # lock and record that slot SKIPPED; deciding it moves them to the next skip.
    Column("skip_at", UTCDateTime(), nullable=True),
    Column("skip_reason", String(400), nullable=True),
    # Runs of the job recorded COMPLETED, counted for a job with ``max_runs`` only (migration
    # 0009), in the transaction that records each: exact whatever the history's retention.
    Column("runs_completed", BigInteger, nullable=False, server_default="0"),
    Index("ix_scheduler_jobs_next_slot", "next_slot_at"),
    Index("ix_scheduler_jobs_task", "task", "name"),
    # A burst's chunk, at its slot, reads which of its jobs are paused off this (migration 0007).
    Index("ix_scheduler_jobs_paused", "paused"),
)

# One row per ``@task`` name, as its instances registered it (migration 0006): what a client
# or the API, which import no task code, know of a task.
tasks = Table(
    "scheduler_tasks",
    metadata,
    Column("name", String(200), primary_key=True),
    Column("options", JSON, nullable=False),
    Column("timezone", String(64), nullable=True),
    Column("registered_at", UTCDateTime(), nullable=False),
    Column("updated_at", UTCDateTime(), nullable=False),
    Column("updated_by", String(200), nullable=True),
    Column("version", String(32), nullable=True),
)

# One row (``name`` "schedules"), rewritten with a new random ``token`` by every schedule write
# that touches a slot soon (migration 0006): what instances without notifications (MariaDB,
# SQLite, or a PostgreSQL listener lost) poll once a second, one primary-key read.
changes = Table(
    "scheduler_changes",
    metadata,
    Column("name", String(32), primary_key=True),
    Column("token", String(32), nullable=False),
    Column("changed_at", UTCDateTime(), nullable=False),
)

# One row per slot an operator asked to skip (``slotcron skip``, migration 0009), kept after it
# is decided (its execution row says SKIPPED); an undecided one is taken back by ``unskip``.
skips = Table(
    "scheduler_skips",
    metadata,
    Column("job_name", String(200), primary_key=True),
    Column("scheduled_at", UTCDateTime(), primary_key=True),
    Column("reason", String(400), nullable=True),
    Column("created_at", UTCDateTime(), nullable=False),
)

executions = Table(
    "scheduler_executions",
    metadata,
    Column("id", ID, primary_key=True, autoincrement=True),
    Column("job_name", String(200), nullable=False),
    Column("scheduled_at", UTCDateTime(), nullable=False),
    Column("trigger", String(16), nullable=False),
    Column("status", String(16), nullable=False),
    Column("attempt", Integer, nullable=False, default=1),
    Column("instance_id", String(200), nullable=True),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("available_at", UTCDateTime(), nullable=True),
    Column("started_at", UTCDateTime(), nullable=True),
    Column("heartbeat_at", UTCDateTime(), nullable=True),
    Column("lease_until", UTCDateTime(), nullable=True),
    Column("lease_ms", Integer, nullable=True),
    Column("finished_at", UTCDateTime(), nullable=True),
    # Why a run failed (with traceback), or why a slot was SKIPPED, MISSED, STOPPED, ABANDONED.
    Column("error", Text, nullable=True),
    Column("params", JSON, nullable=True),
    Column("state", JSON, nullable=True),
    Column("fencing_token", BigInteger, nullable=True),
    # The last slot of a MISSED record standing for a range of slots (migration 0004).
    Column("until", UTCDateTime(), nullable=True),
    # The start marker of the chunk this run was claimed ahead in (migration 0007): its body
    # started when the marker (scheduler_starts) says so. NULL on every other run.
    Column("start_key", String(32), nullable=True),
    # The backfill that queued this attempt (migration 0010; NULL on every other run).
    Column("backfill_id", ID, nullable=True),
    UniqueConstraint("job_name", "scheduled_at", "attempt", name="uq_scheduler_executions_slot"),
    Index("ix_scheduler_executions_instance_status", "instance_id", "status"),
    Index("ix_scheduler_executions_status_lease", "status", "lease_until"),
    Index("ix_scheduler_executions_job_id", "job_name", "id"),
    Index("ix_scheduler_executions_created", "created_at"),
    # The order of every listing (newest slot first): pages read off it, never sort the table.
    Index("ix_scheduler_executions_slot_id", "scheduled_at", "id"),
    Index("ix_scheduler_executions_start_key", "start_key"),
    Index("ix_scheduler_executions_backfill", "backfill_id", "status"),
)

# A backfill (``slotcron backfill JOB --from T1 --to T2``, migration 0010): the slots of a job in
# [``start_at``, ``end_at``) to run once each if they never completed, carried on by any live
# instance that has the job (slotcron.engine.backfilling). ``next_at`` is its cursor: the next
# slot to consider (NULL once every slot was considered); the counts say what became of them.
backfills = Table(
    "scheduler_backfills",
    metadata,
    Column("id", ID, primary_key=True, autoincrement=True),
    Column("job_name", String(200), nullable=False),
    Column("start_at", UTCDateTime(), nullable=False),
    Column("end_at", UTCDateTime(), nullable=False),
    # Starts a second at most; 0: as fast as the instance's capacity allows.
    Column("rate", Float, nullable=False),
    # RUNNING, COMPLETED (every slot considered, none in flight) or CANCELLED.
    Column("status", String(16), nullable=False),
    Column("next_at", UTCDateTime(), nullable=True),
    Column("slots_total", Integer, nullable=False),
    Column("slots_seen", Integer, nullable=False, server_default="0"),
    Column("slots_queued", Integer, nullable=False, server_default="0"),
    Column("slots_passed", Integer, nullable=False, server_default="0"),
    # Why it ended early (cancelled, its job removed).
    Column("note", String(400), nullable=True),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("updated_at", UTCDateTime(), nullable=False),
    Index("ix_scheduler_backfills_status", "status"),
)


def guard(column: ColumnElement[str]) -> ColumnElement[str]:
    """``column`` as an expression that no index serves, for a condition that only guards the
    rows a statement finds by id (still ``RUNNING``, still this instance's).

    Left bare, it lets the planner read the rows off ``(instance_id, status)`` instead of by
    id, and at a burst it does: statistics from before the burst say an instance has a few
    ``RUNNING`` rows when it has 100,000, and a prepared statement's generic plan then filters
    all of them for every write of 1,000 (760 ms against 2 ms by id, PostgreSQL)."""
    return column + literal("", String())


def as_stored(column: Column[Any]) -> ColumnElement[str]:
    """A JSON column read as its stored text, for :func:`slotcron.jobs.schedules.read_row` to
    decode row
    by row: a row that a writer outside slotcron broke (invalid JSON, a 5,000-digit number) is
    that row's error, not every reader's (decoded by the column's type, or by asyncpg's codec
    of ``json``, one such row failed the whole statement). A cast in SQL, so that no driver
    decodes it: PostgreSQL's ``::TEXT``; MariaDB's ``AS CHAR`` is in the connection's character
    set, utf8mb4."""
    return cast(column, Text()).label(column.name)


SCHEDULE_COLUMNS = (
    jobs.c.name,
    jobs.c.task,
    jobs.c.kind,
    jobs.c.schedule,
    jobs.c.timezone,
    as_stored(jobs.c.params),
    as_stored(jobs.c.options),
    jobs.c.jitter,
    jobs.c.paused,
    jobs.c.updated_at,
    jobs.c.next_slot_at,
)
"""A runtime schedule's row as :func:`slotcron.jobs.schedule_rows.read_row` reads it, its JSON as
stored text: each row is read on its own, so one that cannot be read is quarantined alone."""


# The start of a chunk of runs claimed ahead of their slot (slotcron.store.starts): one row written
# at the slot stands for every run of the chunk, instead of one write per run. Its key is
# inserted once: by the instance starting the chunk, or by the leader handing it back
# (``handed_back``, no ``started_at``): whoever inserts first decides the whole chunk.
start_markers = Table(
    "scheduler_starts",
    metadata,
    Column("start_key", String(32), primary_key=True),
    Column("instance_id", String(200), nullable=True),
    Column("started_at", UTCDateTime(), nullable=True),
    Column("handed_back", Boolean, nullable=False, default=False),
    Column("created_at", UTCDateTime(), nullable=False),
)

instances = Table(
    "scheduler_instances",
    metadata,
    Column("instance_id", String(200), primary_key=True),
    Column("host", String(255), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("version", String(32), nullable=False),
    Column("started_at", UTCDateTime(), nullable=False),
    Column("heartbeat_at", UTCDateTime(), nullable=False),
    Column("state", String(16), nullable=False),
    Column("is_leader", Boolean, nullable=False, default=False),
    # Random per process: tells a second live process under the same id from a restart.
    Column("incarnation", String(32), nullable=True),
    # The jobs and tasks it registers (names and fingerprints), hashed: the live instances with
    # the same digest share the planning of those jobs (app/slotcron/engine/shares.py).
    Column("jobs_digest", String(64), nullable=True),
    # Set by an instance that joins this one's members: its next heartbeat finds it, and its
    # view of the members is read again (no periodic read while alone).
    Column("reshare", Boolean, nullable=False, default=False, server_default="0"),
)

LEADER_ROW = "leader"

# Leadership is a lease on this one row, created by the migration.
leader = Table(
    "scheduler_leader",
    metadata,
    Column("name", String(32), primary_key=True),
    Column("instance_id", String(200), nullable=True),
    Column("lease_until", UTCDateTime(), nullable=False),
    Column("since", UTCDateTime(), nullable=True),
)
