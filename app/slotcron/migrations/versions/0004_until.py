"""Every slot on the record (issue 12): a ``MISSED`` record may stand for a range of slots.

- ``scheduler_executions.until``: the last slot of a ``MISSED`` record that stands for a range
  of passed-over slots (its ``scheduled_at`` is the first); null on every other record.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql, postgresql

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen here rather than imported, as in 0001.
UTC_TS = (
    sa.DateTime()
    .with_variant(postgresql.TIMESTAMP(timezone=True), "postgresql")
    .with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
)


def upgrade() -> None:
    with op.batch_alter_table("scheduler_executions") as batch:
        batch.add_column(sa.Column("until", UTC_TS, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("scheduler_executions") as batch:
        batch.drop_column("until")
