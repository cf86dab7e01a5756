"""One schedule in force per job (issue 12, item 5): the newest registration wins.

- ``scheduler_jobs.fingerprint``: the schedule in force, as its registrant computed it: the
  anchor instant and a hash of the UTC instants of its slots after it
  (``slotcron.schedule.fingerprint``).
  A claim whose instance computes another fingerprint is refused: that instance's schedule
  was superseded by a newer registration.
- ``scheduler_jobs.superseded``: ``{instance_id: "schedule (timezone)"}`` of the instances that
  stopped firing the job because a newer registration superseded their schedule.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("scheduler_jobs") as batch:
        batch.add_column(sa.Column("fingerprint", sa.String(80), nullable=True))
        batch.add_column(sa.Column("superseded", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("scheduler_jobs") as batch:
        batch.drop_column("superseded")
        batch.drop_column("fingerprint")
