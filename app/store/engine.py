"""The async engine, configured by its dialect."""

from __future__ import annotations

from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from app.store.dialects import Dialect, dialect_for


def make_engine(url: URL, pool_size: int = 10) -> tuple[AsyncEngine, Dialect]:
    dialect = dialect_for(url)
    engine = create_async_engine(url, **dialect.engine_options(url, pool_size))
    dialect.configure(engine)
    return engine, dialect
