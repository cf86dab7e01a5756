"""Skipping one slot (``slotcron skip JOB --at T``) and ``max_runs`` (issue 30).

- ``scheduler_skips``: one row per slot an operator asked to skip, with the reason given.
- ``scheduler_jobs.skip_at``, ``skip_reason``: the job's earliest skip not decided yet, read by
  every claim with the job's row lock (no further statement on the claim's path).
- ``scheduler_jobs.runs_completed``: the completed runs of a job with ``max_runs``, counted in
  the transaction that records each.

On MariaDB/MySQL the new table's ``job_name`` gets the binary collation migration 0008 gives
every name.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-28
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql, postgresql

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen here rather than imported, so later changes to the app cannot rewrite history.
UTC_TS = (
    sa.DateTime()
    .with_variant(postgresql.TIMESTAMP(timezone=True), "postgresql")
    .with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
)

BINARY_NAME = (
    "SET @slotcron_alter = CONCAT('ALTER TABLE scheduler_skips MODIFY job_name VARCHAR(200) "
    "CHARACTER SET utf8mb4 COLLATE ', IF(LOCATE('MariaDB', VERSION()) > 0, "
    "'utf8mb4_nopad_bin', 'utf8mb4_0900_bin'), ' NOT NULL')"
)


def upgrade() -> None:
    with op.batch_alter_table("scheduler_jobs") as batch:
        batch.add_column(sa.Column("skip_at", UTC_TS, nullable=True))
        batch.add_column(sa.Column("skip_reason", sa.String(400), nullable=True))
        batch.add_column(
            sa.Column("runs_completed", sa.BigInteger(), nullable=False, server_default="0")
        )
    op.create_table(
        "scheduler_skips",
        sa.Column("job_name", sa.String(200), primary_key=True),
        sa.Column("scheduled_at", UTC_TS, primary_key=True),
        sa.Column("reason", sa.String(400), nullable=True),
        sa.Column("created_at", UTC_TS, nullable=False),
    )
    if op.get_context().dialect.name in ("mysql", "mariadb"):
        op.execute(BINARY_NAME)
        op.execute("PREPARE slotcron_alter FROM @slotcron_alter")
        op.execute("EXECUTE slotcron_alter")
        op.execute("DEALLOCATE PREPARE slotcron_alter")


def downgrade() -> None:
    op.drop_table("scheduler_skips")
    with op.batch_alter_table("scheduler_jobs") as batch:
        batch.drop_column("runs_completed")
        batch.drop_column("skip_reason")
        batch.drop_column("skip_at")
