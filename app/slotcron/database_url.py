"""Database URLs: read as users write them, normalised to the async driver slotcron uses, and
shown without their password.

Kept out of :mod:`slotcron.config` so the settings read as a list of settings; the validator of
``SCHEDULER_DATABASE_URL`` is :func:`normalise`.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import quote

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

# Driver names users may write, mapped to the async driver slotcron uses.
_DRIVERS = {
    "sqlite": "sqlite+aiosqlite",
    "sqlite+aiosqlite": "sqlite+aiosqlite",
    "postgres": "postgresql+asyncpg",
    "postgresql": "postgresql+asyncpg",
    "postgresql+asyncpg": "postgresql+asyncpg",
    "mysql": "mysql+aiomysql",
    "mariadb": "mysql+aiomysql",
    "mysql+aiomysql": "mysql+aiomysql",
    "mariadb+aiomysql": "mysql+aiomysql",
}

DEFAULT_PORTS = {"postgresql": 5432, "mysql": 3306, "mariadb": 3306}


def mask_url_text(text: str) -> str:
    """Hide anything that looks like a password in a URL inside free text: everything between
    the user's ``:`` and the *last* ``@`` of the URL, so a password holding an unencoded ``@``
    (which the URL parser splits at its first ``@``) is hidden whole."""
    text = re.sub(r"(://[^:/@\s'\"]*:)[^\s'\"]*@", r"\1***@", text)
    return re.sub(r"([?&](?:password|passwd|pwd)=)[^&\s'\"]*", r"\1***", text, flags=re.I)


def render_url(url: URL) -> str:
    """A URL fit to print: its password hidden, wherever it was given (the drivers also take
    ``?password=``)."""
    return mask_url_text(url.render_as_string(hide_password=True))


def normalise(raw: str) -> str:
    """``raw`` with the async driver slotcron uses and every host's port (the URL to connect
    with, password included); a ``ValueError`` saying what is wrong, never echoing a password."""
    try:
        url = _with_host_ports(make_url(_hosts_in_query(raw)))
    except (ArgumentError, ValueError):
        # An unparseable value is not echoed: it may be a password pasted in the wrong place.
        raise ValueError(
            "cannot parse the database URL (expected e.g. "
            "postgresql+asyncpg://user:password@host:5432/dbname)"
        ) from None
    driver = _DRIVERS.get(url.drivername)
    if driver is None:
        raise ValueError(
            f"unsupported database {url.drivername!r} in {render_url(url)!r}; use "
            "sqlite+aiosqlite, postgresql+asyncpg or mysql+aiomysql"
        )
    _check_hosts(url, driver)
    if driver == "sqlite+aiosqlite":
        _sqlite_directory_exists(url)
    return url.set(drivername=driver).render_as_string(hide_password=False)


def _check_hosts(url: URL, driver: str) -> None:
    hosts = _query_hosts(url)
    if driver != "sqlite+aiosqlite" and not url.host and not hosts:
        raise ValueError(f"database URL {render_url(url)!r} names no host")
    if len(hosts) > 1 and driver != "postgresql+asyncpg":
        raise ValueError(
            f"database URL {render_url(url)!r} names several hosts: a multi-host URL is "
            "for PostgreSQL (asyncpg) only"
        )
    if url.host and "@" in url.host:
        raise ValueError(
            f"database URL {render_url(url)!r} has an '@' after the password's: "
            "percent-encode an '@' in the user or password as %40"
        )


def where(url: URL) -> str:
    """Where the database is, for a message: ``host:port`` (each host of a multi-host URL), or
    the SQLite file. Never the password."""
    file = sqlite_file(url)
    if url.get_backend_name() == "sqlite":
        return f"the SQLite file {str(file) if file else url.database or ':memory:'}"
    hosts = _query_hosts(url)
    if hosts:
        return ", ".join(hosts)
    port = url.port or DEFAULT_PORTS.get(url.get_backend_name(), 5432)
    host = f"[{url.host}]" if url.host and ":" in url.host else url.host
    return f"{host}:{port}"


def _hosts_in_query(raw: str) -> str:
    """asyncpg's and libpq's multi-host form, ``scheme://user@h1:5432,h2:5433/db``, as
    SQLAlchemy's (``scheme://user@/db?host=h1:5432&host=h2:5433``), which it can parse. Any
    other URL is returned as it is."""
    scheme, sep, rest = raw.partition("://")
    ends = [i for i in (rest.find("/"), rest.find("?")) if i >= 0]
    netloc, tail = rest[: min(ends, default=len(rest))], rest[min(ends, default=len(rest)) :]
    userinfo, at, hosts = netloc.rpartition("@")
    if not sep or "," not in hosts:
        return raw
    path, question, query = tail.partition("?")
    given = "&".join(f"host={quote(host.strip(), safe='[]:')}" for host in hosts.split(","))
    return f"{scheme}://{userinfo}{at}{path or '/'}?{given}{'&' + query if question else ''}"


def _query_hosts(url: URL) -> tuple[str, ...]:
    hosts = url.query.get("host", ())
    return (hosts,) if isinstance(hosts, str) else tuple(hosts)


def _with_host_ports(url: URL) -> URL:
    """Every host of a multi-host URL with its port (SQLAlchemy requires all of them): the
    backend's default where one was left out."""
    hosts = _query_hosts(url)
    if len(hosts) < 2:
        return url
    default = DEFAULT_PORTS.get(url.get_backend_name(), 5432)
    ported = tuple(h if re.search(r":\d+$", h) else f"{h}:{default}" for h in hosts)
    return url.update_query_dict({"host": list(ported)})


def sqlite_file(url: URL) -> Path | None:
    """The file of a SQLite URL; None for an in-memory or ``file:`` URI database."""
    database = url.database
    if url.get_backend_name() != "sqlite" or not database or database == ":memory:":
        return None
    if database.startswith("file:"):
        return None
    return Path(database)


def _sqlite_directory_exists(url: URL) -> None:
    path = sqlite_file(url)
    if path is not None and not path.parent.is_dir():
        # Otherwise every connection fails and start-up waits it out as an outage, forever.
        raise ValueError(f"the directory of the SQLite file {str(path)!r} does not exist")
