"""Ids and names compare byte for byte on MariaDB and MySQL too (issue 26).

Their default collations (``utf8mb4_general_ci``, ``utf8mb4_uca1400_ai_ci``, ``utf8mb4_0900_ai_ci``)
compare case-, accent- and trailing-space-insensitively: ``tenant/alpha`` found, overwrote and
deleted ``Tenant/Alpha``, and a run triggered under the variant waited ``QUEUED`` forever. Every
column holding an id or a name (jobs, schedules, tasks, instances, start keys, the leader's row)
gets a binary collation without padding: ``utf8mb4_nopad_bin`` on MariaDB, ``utf8mb4_0900_bin``
on MySQL 8. Rows are kept as they are: ids distinct under a case-insensitive collation are
distinct under a binary one, so no key can collide.

PostgreSQL (deterministic collations) and SQLite (``BINARY``) already compare bytes: nothing to
do there. The server is told from its ``VERSION()`` when the statements run, so the SQL printed
by ``slotcron migrate --sql`` works on either server whatever the URL says. Each table is
altered in one statement (one copy of the table on a server that copies to change a
collation).

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# (table, [(column, length, nullable)]): frozen here, as every migration's columns.
ID_COLUMNS: list[tuple[str, list[tuple[str, int, bool]]]] = [
    ("scheduler_jobs", [("name", 200, False), ("task", 200, True), ("updated_by", 200, True)]),
    ("scheduler_tasks", [("name", 200, False), ("updated_by", 200, True)]),
    ("scheduler_changes", [("name", 32, False)]),
    (
        "scheduler_executions",
        [("job_name", 200, False), ("instance_id", 200, True), ("start_key", 32, True)],
    ),
    ("scheduler_starts", [("start_key", 32, False), ("instance_id", 200, True)]),
    ("scheduler_instances", [("instance_id", 200, False), ("incarnation", 32, True)]),
    ("scheduler_leader", [("name", 32, False), ("instance_id", 200, True)]),
]

CHOOSE = (
    "SET @slotcron_collation = IF(LOCATE('MariaDB', VERSION()) > 0, "
    "'utf8mb4_nopad_bin', 'utf8mb4_0900_bin')"
)
"""MariaDB's binary collation without padding, else MySQL 8's: chosen by the server itself."""


def _alter(table: str, columns: list[tuple[str, int, bool]], collation: str | None) -> str:
    """``ALTER TABLE`` giving ``columns`` utf8mb4 in ``collation``, or the table's default
    character set and collation when None."""
    changes = ", ".join(
        f"MODIFY {name} VARCHAR({length})"
        + (f" CHARACTER SET utf8mb4 COLLATE {collation}" if collation else "")
        + ("" if nullable else " NOT NULL")
        for name, length, nullable in columns
    )
    return f"ALTER TABLE {table} {changes}"


def _mysql() -> bool:
    return op.get_context().dialect.name in ("mysql", "mariadb")


def upgrade() -> None:
    if not _mysql():
        return
    op.execute(CHOOSE)
    for table, columns in ID_COLUMNS:
        # A prepared statement: a collation is a name, which no statement takes as a value.
        statement = _alter(table, columns, "{collation}")
        op.execute(
            f"SET @slotcron_alter = REPLACE('{statement}', '{{collation}}', @slotcron_collation)"
        )
        op.execute("PREPARE slotcron_alter FROM @slotcron_alter")
        op.execute("EXECUTE slotcron_alter")
        op.execute("DEALLOCATE PREPARE slotcron_alter")


def downgrade() -> None:
    # Back to each table's default collation: fails, as it must, if ids that differ only in
    # case, accents or trailing spaces were added meanwhile (they would be one id again).
    if not _mysql():
        return
    for table, columns in ID_COLUMNS:
        op.execute(_alter(table, columns, None))
