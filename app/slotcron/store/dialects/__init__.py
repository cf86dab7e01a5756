"""Every difference between PostgreSQL, MariaDB/MySQL and SQLite, behind one small object.

No ``if dialect == ...`` lives outside this package: :mod:`.base` says what a dialect offers and
the limits of a session, :mod:`.postgresql`, :mod:`.mysql` and :mod:`.sqlite` how each family
does it, and :func:`dialect_for` picks one for a URL.
"""

from __future__ import annotations

from sqlalchemy.engine import URL

from slotcron.store.dialects.base import (
    DRIVER_ERRORS,
    NOWAIT,
    POOLERS,
    READ_ONLY,
    STATEMENT_TIMEOUT,
    Dialect,
    Listening,
    SessionLimits,
    refused_login,
)
from slotcron.store.dialects.mysql import MySQL
from slotcron.store.dialects.postgresql import PostgreSQL
from slotcron.store.dialects.sqlite import SQLite

__all__ = [
    "DRIVER_ERRORS",
    "NOWAIT",
    "POOLERS",
    "READ_ONLY",
    "STATEMENT_TIMEOUT",
    "Dialect",
    "Listening",
    "MySQL",
    "PostgreSQL",
    "SQLite",
    "SessionLimits",
    "dialect_for",
    "refused_login",
]


def dialect_for(url: URL, limits: SessionLimits | None = None, pooler: str = "none") -> Dialect:
    backend = url.get_backend_name()
    if backend == "postgresql":
        return PostgreSQL(limits, pooler)
    if backend in ("mysql", "mariadb"):
        return MySQL(limits)
    if backend == "sqlite":
        return SQLite(limits)
    raise ValueError(f"unsupported database backend {backend!r}")
