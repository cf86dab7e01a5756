"""Start markers: one write per chunk of runs claimed ahead, at their slot (issue 12).

- ``scheduler_executions.start_key``: the chunk a run claimed ahead of its slot belongs to.
- ``scheduler_starts``: one row per chunk, inserted once at the slot by the instance starting
  it (``started_at``), or by the leader handing the chunk back (``handed_back``): the primary
  key makes the two exclusive.
- ``ix_scheduler_jobs_paused``: at its slot, a chunk reads which of its jobs are paused.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql, postgresql

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen here rather than imported, so later changes to the app cannot rewrite history.
UTC_TS = (
    sa.DateTime()
    .with_variant(postgresql.TIMESTAMP(timezone=True), "postgresql")
    .with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
)


def upgrade() -> None:
    with op.batch_alter_table("scheduler_executions") as batch:
        batch.add_column(sa.Column("start_key", sa.String(32), nullable=True))
        batch.create_index("ix_scheduler_executions_start_key", ["start_key"])
    op.create_index("ix_scheduler_jobs_paused", "scheduler_jobs", ["paused"])
    op.create_table(
        "scheduler_starts",
        sa.Column("start_key", sa.String(32), primary_key=True),
        sa.Column("instance_id", sa.String(200), nullable=True),
        sa.Column("started_at", UTC_TS, nullable=True),
        sa.Column("handed_back", sa.Boolean(), nullable=False),
        sa.Column("created_at", UTC_TS, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("scheduler_starts")
    op.drop_index("ix_scheduler_jobs_paused", "scheduler_jobs")
    with op.batch_alter_table("scheduler_executions") as batch:
        batch.drop_index("ix_scheduler_executions_start_key")
        batch.drop_column("start_key")
