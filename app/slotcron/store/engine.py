"""The async engine, configured by its dialect."""

from __future__ import annotations

from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from slotcron.store.dialects import Dialect, SessionLimits, dialect_for


def make_engine(
    url: URL, pool_size: int = 10, lease_seconds: float | None = None, pooler: str = "none"
) -> tuple[AsyncEngine, Dialect]:
    """``lease_seconds`` sizes the server's limits on each session (see
    :class:`slotcron.store.dialects.SessionLimits`); None where no lease is at stake. ``pooler``:
    what sits between us and PostgreSQL (``SCHEDULER_DATABASE_POOLER``)."""
    dialect = dialect_for(url, SessionLimits.for_lease(lease_seconds), pooler)
    engine = create_async_engine(url, **dialect.engine_options(url, pool_size))
    dialect.configure(engine)
    return engine, dialect
