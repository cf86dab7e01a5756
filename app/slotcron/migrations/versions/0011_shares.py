"""Each slot planned once per cluster (issue 29): ``scheduler_instances.jobs_digest`` and
``reshare``.

An instance writes the digest of the jobs and tasks it registers (names and fingerprints) on
its row; the live instances with the same digest share the planning of those jobs
(:mod:`slotcron.engine.shares`). A row without one (an instance of an earlier version) shares
with nobody. ``reshare`` is set on the members' rows by an instance that joins them: their next
heartbeat finds it, and they read the members again.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-28
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("scheduler_instances") as batch:
        batch.add_column(sa.Column("jobs_digest", sa.String(64), nullable=True))
        batch.add_column(sa.Column("reshare", sa.Boolean(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("scheduler_instances") as batch:
        batch.drop_column("reshare")
        batch.drop_column("jobs_digest")
