"""Backfills (``slotcron backfill JOB --from T1 --to T2``, issue 30).

- ``scheduler_backfills``: one row per backfill, its cursor and its counts.
- ``scheduler_executions.backfill_id``: the backfill that queued an attempt, indexed with its
  status (a backfill's runs in flight and its progress are read off it).

On MariaDB/MySQL the new table's ``job_name`` gets the binary collation migration 0008 gives
every name.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-28
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql, postgresql

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen here rather than imported, so later changes to the app cannot rewrite history.
UTC_TS = (
    sa.DateTime()
    .with_variant(postgresql.TIMESTAMP(timezone=True), "postgresql")
    .with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
)
ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

BINARY_NAME = (
    "SET @slotcron_alter = CONCAT('ALTER TABLE scheduler_backfills MODIFY job_name VARCHAR(200) "
    "CHARACTER SET utf8mb4 COLLATE ', IF(LOCATE('MariaDB', VERSION()) > 0, "
    "'utf8mb4_nopad_bin', 'utf8mb4_0900_bin'), ' NOT NULL')"
)


def upgrade() -> None:
    with op.batch_alter_table("scheduler_executions") as batch:
        batch.add_column(sa.Column("backfill_id", ID, nullable=True))
        batch.create_index("ix_scheduler_executions_backfill", ["backfill_id", "status"])
    op.create_table(
        "scheduler_backfills",
        sa.Column("id", ID, primary_key=True, autoincrement=True),
        sa.Column("job_name", sa.String(200), nullable=False),
        sa.Column("start_at", UTC_TS, nullable=False),
        sa.Column("end_at", UTC_TS, nullable=False),
        sa.Column("rate", sa.Float(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("next_at", UTC_TS, nullable=True),
        sa.Column("slots_total", sa.Integer(), nullable=False),
        sa.Column("slots_seen", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("slots_queued", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("slots_passed", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("note", sa.String(400), nullable=True),
        sa.Column("created_at", UTC_TS, nullable=False),
        sa.Column("updated_at", UTC_TS, nullable=False),
    )
    op.create_index("ix_scheduler_backfills_status", "scheduler_backfills", ["status"])
    if op.get_context().dialect.name in ("mysql", "mariadb"):
        op.execute(BINARY_NAME)
        op.execute("PREPARE slotcron_alter FROM @slotcron_alter")
        op.execute("EXECUTE slotcron_alter")
        op.execute("DEALLOCATE PREPARE slotcron_alter")


def downgrade() -> None:
    op.drop_index("ix_scheduler_backfills_status", "scheduler_backfills")
    op.drop_table("scheduler_backfills")
    with op.batch_alter_table("scheduler_executions") as batch:
        batch.drop_index("ix_scheduler_executions_backfill")
        batch.drop_column("backfill_id")
