"""Hardening (issue 13): an incarnation per instance row; the executions listing by index.

- ``scheduler_instances.incarnation``: a random value per process, so a second live process
  under the same ``SCHEDULER_INSTANCE_ID`` is told apart from a restart of a dead one.
- ``ix_scheduler_executions_slot_id`` on ``(scheduled_at, id)``: the order of every executions
  listing (newest slot first), so a page reads its rows off the index instead of sorting the
  table (82 ms at 1 M rows before), and keyset paging (``before``) starts where it left off.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("scheduler_instances") as batch:
        batch.add_column(sa.Column("incarnation", sa.String(32), nullable=True))
    op.create_index(
        "ix_scheduler_executions_slot_id", "scheduler_executions", ["scheduled_at", "id"]
    )


def downgrade() -> None:
    op.drop_index("ix_scheduler_executions_slot_id", table_name="scheduler_executions")
    with op.batch_alter_table("scheduler_instances") as batch:
        batch.drop_column("incarnation")
