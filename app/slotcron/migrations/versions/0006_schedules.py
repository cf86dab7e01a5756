"""Schedules at runtime (issue 15): a schedule is a row of ``scheduler_jobs``; tasks are recorded.

- ``scheduler_jobs.task``: the task a runtime schedule runs; NULL on a code job (``@cron``,
  ``@every``). A schedule's id is the row's ``name``: unique among jobs and schedules by the
  primary key, and pause, resume, trigger, restart, history and the claim work by it as for a
  job. ``kind``/``schedule``/``timezone`` hold its cron or interval as for a job,
  ``registered_at`` is its ``created_at``, ``next_slot_at`` (indexed since 0001) its next slot.
- ``scheduler_jobs.params``: the schedule's ``ctx.params``; ``scheduler_jobs.jitter``: its own
  jitter (NULL: its task's).
- index ``(task, name)``: a task's schedules, in id order, without reading the others.
- ``scheduler_tasks``: one row per ``@task`` name, as its instances registered it (options,
  default zone): what a client or the API, which import no task code, know of tasks.
- ``scheduler_changes``: one row rewritten by every schedule write that touches a slot soon:
  what an instance without notifications polls (one primary-key read a second).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql, postgresql

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen here rather than imported, as in 0001.
UTC_TS = (
    sa.DateTime()
    .with_variant(postgresql.TIMESTAMP(timezone=True), "postgresql")
    .with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
)


def upgrade() -> None:
    with op.batch_alter_table("scheduler_jobs") as batch:
        batch.add_column(sa.Column("task", sa.String(200), nullable=True))
        batch.add_column(sa.Column("params", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("jitter", sa.Float(), nullable=True))
    op.create_index("ix_scheduler_jobs_task", "scheduler_jobs", ["task", "name"])
    op.create_table(
        "scheduler_tasks",
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("options", sa.JSON(), nullable=False),
        sa.Column("timezone", sa.String(64), nullable=True),
        sa.Column("registered_at", UTC_TS, nullable=False),
        sa.Column("updated_at", UTC_TS, nullable=False),
        sa.Column("updated_by", sa.String(200), nullable=True),
        sa.Column("version", sa.String(32), nullable=True),
    )
    op.create_table(
        "scheduler_changes",
        sa.Column("name", sa.String(32), primary_key=True),
        sa.Column("token", sa.String(32), nullable=False),
        sa.Column("changed_at", UTC_TS, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("scheduler_changes")
    op.drop_table("scheduler_tasks")
    op.drop_index("ix_scheduler_jobs_task", table_name="scheduler_jobs")
    with op.batch_alter_table("scheduler_jobs") as batch:
        batch.drop_column("jitter")
        batch.drop_column("params")
        batch.drop_column("task")
