"""The dialects' statements that must be compiled once, not at every execution.

SQLAlchemy 2.0 caches no dialect-specific INSERT and no ON CONFLICT clause: a statement built on
them is compiled anew each time it runs (5 ms for the start marker, paid at a burst's slot by
every body). ``Dialect.insert_new`` is cacheable on every backend; these tests would catch a
dependency upgrade or a change that makes it (or the marker) uncacheable again, and check that
the SQL is still the one meant."""

from __future__ import annotations

from typing import Any

import pytest
from slotcron.store import markers
from slotcron.store.dialects import Dialect, dialect_for
from sqlalchemy import Column, MetaData, String, Table, insert, literal, select
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.engine import make_url

URLS = {
    "postgresql": "postgresql+asyncpg://u@h/d",
    "mariadb": "mysql+aiomysql://u@h/d",
    "sqlite": "sqlite+aiosqlite:///x.db",
}
ON_CONFLICT = {
    "postgresql": "ON CONFLICT DO NOTHING",
    "mariadb": "INSERT IGNORE INTO",
    "sqlite": "ON CONFLICT DO NOTHING",
}

table = Table("t", MetaData(), Column("a", String, primary_key=True), Column("b", String))


def dialect(name: str) -> Dialect:
    return dialect_for(make_url(URLS[name]))


@pytest.mark.parametrize("name", list(URLS))
def test_insert_new_is_cached(name: str) -> None:
    stmt = dialect(name).insert_new(table).from_select(["a"], select(literal("x")))
    assert stmt._generate_cache_key() is not None, "compiled at every execution"


@pytest.mark.parametrize("name", list(URLS))
def test_insert_new_renders_its_conflict_clause(name: str) -> None:
    sql_dialect: Any = {
        "postgresql": postgresql.dialect,
        "mariadb": mysql.dialect,
        "sqlite": sqlite.dialect,
    }[name]()
    stmt = dialect(name).insert_new(table).values(a="x")
    sql = " ".join(str(stmt.compile(dialect=sql_dialect)).split())
    assert ON_CONFLICT[name] in sql


def test_cache_keys_tell_insert_new_from_a_plain_insert() -> None:
    """The clause is part of the key: a plain INSERT of the same shape must not share it."""
    new = dialect("postgresql").insert_new(table).values(a="x")
    plain = insert(table).values(a="x")
    key_new, key_plain = new._generate_cache_key(), plain._generate_cache_key()
    assert key_new is not None and key_plain is not None
    assert key_new.key != key_plain.key


@pytest.mark.parametrize("name", list(URLS))
def test_every_start_marker_statement_is_cached(name: str) -> None:
    d = dialect(name)
    for server_clock in (True, False):
        sql = markers._mark(d, server_clock)
        for part in ("one_trip", "insert", "state", "paused_jobs", "skip", "runs_of", "ours"):
            stmt = getattr(sql, part)
            if stmt is not None:
                assert stmt._generate_cache_key() is not None, f"{name}: {part} is not cached"
