"""The three tables: jobs, executions (one row per slot attempt), instances.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql, postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen here rather than imported, so later changes to the app cannot rewrite history.
UTC_TS = (
    sa.DateTime()
    .with_variant(postgresql.TIMESTAMP(timezone=True), "postgresql")
    .with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
)
ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    _create_jobs()
    _create_executions()
    _create_instances_and_leader()


def _create_jobs() -> None:
    op.create_table(
        "scheduler_jobs",
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("schedule", sa.String(200), nullable=False),
        sa.Column("timezone", sa.String(64), nullable=False),
        sa.Column("options", sa.JSON(), nullable=False),
        sa.Column("paused", sa.Boolean(), nullable=False),
        sa.Column("paused_reason", sa.String(400), nullable=True),
        sa.Column("last_slot_at", UTC_TS, nullable=True),
        sa.Column("next_slot_at", UTC_TS, nullable=True),
        sa.Column("registered_at", UTC_TS, nullable=False),
        sa.Column("updated_at", UTC_TS, nullable=False),
        sa.Column("updated_by", sa.String(200), nullable=True),
        sa.Column("version", sa.String(32), nullable=True),
        sa.Column("schedules", sa.JSON(), nullable=True),
    )
    op.create_index("ix_scheduler_jobs_next_slot", "scheduler_jobs", ["next_slot_at"])


def _create_executions() -> None:
    op.create_table(
        "scheduler_executions",
        sa.Column("id", ID, primary_key=True, autoincrement=True),
        sa.Column("job_name", sa.String(200), nullable=False),
        sa.Column("scheduled_at", UTC_TS, nullable=False),
        sa.Column("trigger", sa.String(16), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("instance_id", sa.String(200), nullable=True),
        sa.Column("created_at", UTC_TS, nullable=False),
        sa.Column("available_at", UTC_TS, nullable=True),
        sa.Column("started_at", UTC_TS, nullable=True),
        sa.Column("heartbeat_at", UTC_TS, nullable=True),
        sa.Column("lease_until", UTC_TS, nullable=True),
        sa.Column("lease_ms", sa.Integer(), nullable=True),
        sa.Column("finished_at", UTC_TS, nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("params", sa.JSON(), nullable=True),
        sa.Column("state", sa.JSON(), nullable=True),
        sa.UniqueConstraint(
            "job_name", "scheduled_at", "attempt", name="uq_scheduler_executions_slot"
        ),
    )
    op.create_index(
        "ix_scheduler_executions_instance_status",
        "scheduler_executions",
        ["instance_id", "status"],
    )
    op.create_index(
        "ix_scheduler_executions_status_lease", "scheduler_executions", ["status", "lease_until"]
    )
    op.create_index("ix_scheduler_executions_job_id", "scheduler_executions", ["job_name", "id"])
    op.create_index("ix_scheduler_executions_created", "scheduler_executions", ["created_at"])


def _create_instances_and_leader() -> None:
    op.create_table(
        "scheduler_instances",
        sa.Column("instance_id", sa.String(200), primary_key=True),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("version", sa.String(32), nullable=False),
        sa.Column("started_at", UTC_TS, nullable=False),
        sa.Column("heartbeat_at", UTC_TS, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("is_leader", sa.Boolean(), nullable=False),
    )
    leader = op.create_table(
        "scheduler_leader",
        sa.Column("name", sa.String(32), primary_key=True),
        sa.Column("instance_id", sa.String(200), nullable=True),
        sa.Column("lease_until", UTC_TS, nullable=False),
        sa.Column("since", UTC_TS, nullable=True),
    )
    op.bulk_insert(
        leader,
        [{"name": "leader", "instance_id": None, "lease_until": datetime(1970, 1, 1)}],
    )


def downgrade() -> None:
    op.drop_table("scheduler_leader")
    op.drop_table("scheduler_instances")
    op.drop_table("scheduler_executions")
    op.drop_table("scheduler_jobs")
