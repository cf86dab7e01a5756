"""Fencing tokens (issue 11): a counter per job that every run of it, attempts included, takes.

- ``scheduler_jobs.fencing_token``: the last token handed out for the job; taken (+1) in the
  same transaction, under the job's row lock, as every run starts (a claim, a queued run).
- ``scheduler_executions.fencing_token``: the token of that run (``ctx.fencing_token``).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("scheduler_jobs") as batch:
        batch.add_column(
            sa.Column("fencing_token", sa.BigInteger(), nullable=False, server_default="0")
        )
    with op.batch_alter_table("scheduler_executions") as batch:
        batch.add_column(sa.Column("fencing_token", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("scheduler_executions") as batch:
        batch.drop_column("fencing_token")
    with op.batch_alter_table("scheduler_jobs") as batch:
        batch.drop_column("fencing_token")
