"""Throw-away PostgreSQL topologies made with PostgreSQL's own tools, for tests.

* :class:`PgServer`: a fresh cluster (``initdb``) on a free loopback port, and
  :meth:`PgServer.standby`: a streaming standby of it (``pg_basebackup -R``), synchronous or not.
* :class:`PgBouncer`: PgBouncer in front of a server, in session or transaction mode.
* :class:`Switch`: a loopback TCP forwarder whose target can move (a failover's virtual IP),
  and which can cut or freeze every connection through it.

Everything here is synchronous and blocks the calling thread for a bounded time (every wait has
a deadline and fails naming what did not happen, with the tail of the server's log). An async
test may call it directly (the event loop is blocked meanwhile; queries run on their own loop in
a worker thread, so that works) or through ``asyncio.to_thread``.

Nothing touches the shared servers (5432, 3306): every server, pooler and socket lives in a
temp dir named ``slotcron-pg*`` under ``$SLOTCRON_PG_TMPDIR`` or the system temp dir. Run as
root, PostgreSQL's tools and PgBouncer run as the ``postgres`` OS user (both refuse root).

Clean-up: ``close()`` (or leaving a ``with`` block) stops every process the object started and
removes its temp dir, whatever state it is in; objects not closed are closed at exit
(``atexit``), and :func:`sweep_stale` removes what a killed run left behind. Each cluster's
processes carry its temp dir's name (``cluster_name``), so ``pgrep -f <dir name>`` finds them all.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import csv
import ctypes
import io
import itertools
import os
import pwd
import re
import selectors
import shutil
import signal
import socket
import stat
import struct
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from queue import Empty, SimpleQueue
from typing import IO, Any, Literal, NamedTuple, Protocol, TypeVar

import asyncpg
from sqlalchemy.engine import URL

HOST = "127.0.0.1"
DEFAULT_TIMEOUT = 30.0
PREFIX = "slotcron-pg"
"""Every temp dir made here is named ``slotcron-pg…`` (servers ``slotcron-pg-…``, PgBouncers
``slotcron-pgb-…``)."""

StopMode = Literal["smart", "fast", "immediate"]
PoolMode = Literal["session", "transaction", "statement"]
Setting = str | int | float | bool
T = TypeVar("T")

# ---------------------------------------------------------------------------------------------
# Tools


def pg_bin_dir() -> Path | None:
    """The newest PostgreSQL's bin dir: ``$SLOTCRON_PG_BIN``, else the highest version under
    /usr/lib/postgresql, else ``pg_config --bindir``; None if none has ``initdb``."""
    override = os.environ.get("SLOTCRON_PG_BIN")
    if override:
        return Path(override) if (Path(override) / "initdb").exists() else None
    root = Path("/usr/lib/postgresql")
    versions: list[tuple[tuple[int, ...], Path]] = []
    if root.is_dir():
        for entry in root.iterdir():
            if re.fullmatch(r"\d+(\.\d+)*", entry.name) and (entry / "bin" / "initdb").exists():
                versions.append((tuple(int(p) for p in entry.name.split(".")), entry / "bin"))
    if versions:
        return max(versions)[1]
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=True
            ).stdout.strip()
            if (Path(out) / "initdb").exists():
                return Path(out)
    return None


PG_TOOLS = ("initdb", "postgres", "pg_ctl", "pg_basebackup", "psql")


def tool(name: str) -> str | None:
    """The path of a PostgreSQL tool (from :func:`pg_bin_dir`) or of ``pgbouncer``, or None."""
    if name == "pgbouncer":
        found = shutil.which("pgbouncer")
        if found:
            return found
        return "/usr/sbin/pgbouncer" if os.access("/usr/sbin/pgbouncer", os.X_OK) else None
    bindir = pg_bin_dir()
    if bindir is not None and os.access(bindir / name, os.X_OK):
        return str(bindir / name)
    return None


def _tool(name: str) -> str:
    path = tool(name)
    if path is None:
        raise RuntimeError(f"{name} not found (see tests.pgcluster.missing_tools)")
    return path


def missing_tools(*names: str) -> list[str]:
    """What is missing to run ``names`` (default: the PostgreSQL tools and pgbouncer), each as
    a short phrase; includes the ``postgres`` OS user when running as root. Empty: all there."""
    wanted = names or (*PG_TOOLS, "pgbouncer")
    missing = [f"{n} (not found)" for n in wanted if tool(n) is None]
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            missing.append("the postgres OS user (PostgreSQL and PgBouncer refuse to run as root)")
    return missing


# ---------------------------------------------------------------------------------------------
# Processes (Linux /proc)


class ProcessRef(NamedTuple):
    """A process as (pid, start time in clock ticks): not mistaken for a later one reusing
    the pid."""

    pid: int
    start: int


def _stat(pid: int) -> tuple[int, str, int] | None:
    """(ppid, state, start time) of ``pid``, or None if there is no such process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()  # the name, in parentheses, may hold spaces
    return int(fields[1]), fields[0], int(fields[19])


def process_ref(pid: int) -> ProcessRef | None:
    """``pid`` as a :class:`ProcessRef`, or None if it is not running."""
    found = _stat(pid)
    return ProcessRef(pid, found[2]) if found else None


def is_alive(ref: ProcessRef) -> bool:
    """Whether this very process still runs (a zombie, dead but not reaped, does not)."""
    found = _stat(ref.pid)
    return found is not None and found[2] == ref.start and found[1] != "Z"


def _cmdline(pid: int) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


def _pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def processes_matching(text: str) -> list[tuple[int, str]]:
    """Live processes (not this one) whose command line contains ``text``, as (pid, command
    line): what ``pgrep -af text`` shows."""
    me = os.getpid()
    found = []
    for pid in _pids():
        if pid != me and text in (cmd := _cmdline(pid)):
            found.append((pid, cmd.strip()))
    return found


def _children(pid: int) -> list[int]:
    return [p for p in _pids() if (s := _stat(p)) is not None and s[0] == pid]


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _killpg(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


@contextlib.contextmanager
def _subreaper() -> Iterator[None]:
    """While inside, processes orphaned below this one are re-parented to it, not to PID 1, so
    they are reaped at once (this machine's PID 1 reaps orphans only after a delay, and until
    then they are zombies that ``pgrep postgres`` lists)."""
    libc: Any = None
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    try:
        yield
    finally:
        if libc is not None:
            libc.prctl(36, 0, 0, 0, 0)


def _reap(pids: Sequence[int], timeout: float) -> None:
    """Wait for ``pids`` (children of this process, or not: those are skipped) to exit."""
    deadline = time.monotonic() + timeout
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                break
            if done:
                break
            time.sleep(0.02)


def _kill_marked(marker: str, timeout: float) -> list[str]:
    """Wait up to ``timeout`` for every process carrying ``marker`` to exit, then SIGKILL the
    rest; returns the command lines of those that had to be killed."""
    deadline = time.monotonic() + timeout
    while (left := processes_matching(marker)) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid, _ in left:
        _signal(pid, signal.SIGKILL)
    if left:
        _reap([pid for pid, _ in left], 5)
    return [cmd for _, cmd in left]


def free_port() -> int:
    """A loopback TCP port nothing listens on right now."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port


def wait_until(condition: Callable[[], Any], timeout: float, what: str, detail: str = "") -> Any:
    """Poll ``condition`` until truthy (returned); AssertionError naming ``what`` (and
    ``detail``, e.g. a log tail) after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}{detail}")
        time.sleep(0.05)


# ---------------------------------------------------------------------------------------------
# Clean-up registry


class _Closeable(Protocol):
    def close(self) -> None: ...


_LIVE: dict[int, _Closeable] = {}
_LIVE_LOCK = threading.Lock()
_DIRS: list[Path] = []


def _register(obj: _Closeable) -> None:
    with _LIVE_LOCK:
        _LIVE[id(obj)] = obj


def _unregister(obj: _Closeable) -> None:
    with _LIVE_LOCK:
        _LIVE.pop(id(obj), None)


def live() -> list[_Closeable]:
    """Every server, PgBouncer and Switch made here and not yet closed, oldest first."""
    with _LIVE_LOCK:
        return list(_LIVE.values())


def created_dirs() -> list[Path]:
    """Every temp dir made here by this process, oldest first (removed or not)."""
    return list(_DIRS)


def close_all(objects: Sequence[_Closeable] | None = None) -> None:
    """Close ``objects`` (default: everything :func:`live`), newest first (standbys before
    their primary); every one is closed even if another's close fails."""
    errors: list[BaseException] = []
    for obj in reversed(list(objects if objects is not None else live())):
        try:
            obj.close()
        except Exception as exc:  # go on: the others must be closed too
            errors.append(exc)
    if errors:
        raise errors[0]


atexit.register(close_all)


# ---------------------------------------------------------------------------------------------
# Running as postgres, temp dirs


class _Ids(NamedTuple):
    user: str | None
    group: int | None
    extra_groups: list[int] | None
    uid: int
    gid: int


def _ids() -> _Ids:
    """Whom PostgreSQL's tools and PgBouncer run as: ``postgres`` when we are root (initdb,
    postgres and pgbouncer refuse root), else ourselves. Switching is done by subprocess itself
    (setgid/setgroups/setuid in the child): no runuser, no PAM, no extra process in between."""
    if os.geteuid() != 0:
        return _Ids(None, None, None, os.geteuid(), os.getegid())
    try:
        pw = pwd.getpwnam("postgres")
    except KeyError:
        raise RuntimeError("running as root and there is no postgres OS user") from None
    return _Ids("postgres", pw.pw_gid, [], pw.pw_uid, pw.pw_gid)


def _env(home: Path) -> dict[str, str]:
    # No PG* variable of ours may steer a tool to another server (PGHOST, PGPORT, ...).
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["HOME"] = str(home)
    env["PGCONNECT_TIMEOUT"] = "10"
    return env


def _chown(path: Path) -> None:
    ids = _ids()
    if os.geteuid() == 0:
        os.chown(path, ids.uid, ids.gid)


def _check_traversable(base: Path) -> None:
    """The user the tools run as must reach ``base``: every dir above needs search permission."""
    ids = _ids()
    if ids.user is None:
        return
    groups = {ids.gid} | {g for g in os.getgrouplist(ids.user, ids.gid)}
    for part in [base, *base.parents]:
        st = part.stat()
        if st.st_uid == ids.uid:
            ok = bool(st.st_mode & stat.S_IXUSR)
        elif st.st_gid in groups:
            ok = bool(st.st_mode & stat.S_IXGRP)
        else:
            ok = bool(st.st_mode & stat.S_IXOTH)
        if not ok:
            raise RuntimeError(
                f"{part} is not traversable by {ids.user}: temp dirs under {base} cannot be "
                "used by PostgreSQL; set SLOTCRON_PG_TMPDIR to a dir it can reach (e.g. /tmp)"
            )


def _base_dir() -> Path:
    return Path(os.environ.get("SLOTCRON_PG_TMPDIR") or tempfile.gettempdir())


def _make_dir(kind: str) -> Path:
    base = _base_dir()
    _check_traversable(base)
    path = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{kind}-", dir=base))
    _DIRS.append(path)
    me = process_ref(os.getpid())
    # Who made it: sweep_stale removes a dir only once its maker is gone.
    (path / "owner").write_text(f"{me.pid} {me.start}\n" if me else "")
    _chown(path)
    return path


def _tail(path: Path, chars: int = 3000) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"\n--- {path}: (no log)"
    return f"\n--- tail of {path}:\n{text[-chars:]}"


def _run(
    argv: Sequence[str | Path | int],
    *,
    timeout: float,
    what: str,
    home: Path,
    log: Path | None = None,
) -> str:
    """Run a tool as :func:`_ids` in its own session; its output, or RuntimeError naming
    ``what`` (with the output and ``log``'s tail) if it fails or outlasts ``timeout``."""
    ids = _ids()
    proc = subprocess.Popen(
        [str(a) for a in argv],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=home,
        env=_env(home),
        start_new_session=True,
        user=ids.user,
        group=ids.group,
        extra_groups=ids.extra_groups,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _killpg(proc.pid)
        out, _ = proc.communicate()
        detail = _tail(log) if log else ""
        raise RuntimeError(
            f"{what}: {Path(str(argv[0])).name} did not finish within {timeout} s; "
            f"output: {out[-2000:]}{detail}"
        ) from None
    except BaseException:
        _killpg(proc.pid)
        proc.wait()
        raise
    if proc.returncode != 0:
        detail = _tail(log) if log else ""
        raise RuntimeError(
            f"{what}: {Path(str(argv[0])).name} exited with {proc.returncode}; "
            f"output: {out[-2000:]}{detail}"
        )
    return out


def _remove_dir(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def sweep_stale(base: Path | None = None) -> list[Path]:
    """Remove the temp dirs (and kill the processes) an earlier run left behind: those whose
    maker process is gone (a run killed by SIGKILL runs no clean-up). Returns the dirs removed.
    Dirs of a live process, this one included, are left alone."""
    removed = []
    for path in sorted((base or _base_dir()).glob(f"{PREFIX}*")):
        owner = path / "owner"
        try:
            pid, start = (int(x) for x in owner.read_text().split())
        except (OSError, ValueError):
            # Being made right now (the owner file comes a moment after the dir), or not ours.
            with contextlib.suppress(OSError):
                if time.time() - path.stat().st_mtime < 60 or not path.is_dir():
                    continue
        else:
            if is_alive(ProcessRef(pid, start)):
                continue
        _kill_marked(path.name, 0)
        _remove_dir(path)
        removed.append(path)
    return removed


# ---------------------------------------------------------------------------------------------
# Queries: asyncpg on a fresh event loop in a worker thread


def _blocking(factory: Callable[[], Coroutine[Any, Any, T]], *, timeout: float, what: str) -> T:
    """Run the coroutine on its own loop in a new thread (so this works inside a running loop
    too); its result, or RuntimeError after ``timeout`` seconds."""
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["value"] = asyncio.run(asyncio.wait_for(factory(), timeout))
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=work, name=f"pgcluster {what}", daemon=True)
    thread.start()
    thread.join(timeout + 10)
    if thread.is_alive():
        raise RuntimeError(f"{what}: no answer within {timeout} s")
    if "error" in box:
        error: BaseException = box["error"]
        if isinstance(error, TimeoutError):
            raise RuntimeError(f"{what}: no answer within {timeout} s") from error
        raise error
    value: T = box["value"]
    return value


async def _query(
    connect: dict[str, Any], sql: str, args: Sequence[Any], rows: bool
) -> str | list[tuple[Any, ...]]:
    conn = await asyncpg.connect(**connect)
    try:
        if rows:
            result: str | list[tuple[Any, ...]] = [tuple(r) for r in await conn.fetch(sql, *args)]
        else:
            result = await conn.execute(sql, *args)
    except BaseException:
        conn.terminate()  # a stuck server must not hold up the clean-up
        raise
    await conn.close(timeout=5)
    return result


def _literal(value: Setting) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, int | float):
        return str(value)
    return "'" + value.replace("'", "''") + "'"


def _check_name(name: str) -> str:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", name):
        raise ValueError(f"not a setting or object name: {name!r}")
    return name


def _url(driver: str, port: int, database: str) -> str:
    return URL.create(
        driver, username="postgres", host=HOST, port=port, database=database
    ).render_as_string(hide_password=False)


# ---------------------------------------------------------------------------------------------
# PostgreSQL


_names = itertools.count(1)


class PgServer:
    """A throw-away PostgreSQL cluster on ``127.0.0.1:port``, trust auth, superuser
    ``postgres``.

    ``PgServer()`` runs initdb and starts it (ready on return); :meth:`standby` makes a
    streaming standby of it. ``close()`` stops it (immediately) and deletes everything.
    The port stays the same across :meth:`stop` and :meth:`start`.
    """

    host = HOST

    def __init__(
        self,
        name: str = "primary",
        *,
        max_connections: int = 60,
        fsync: bool = False,
        settings: Mapping[str, Setting] | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        """initdb a new cluster and start it. ``settings`` go into postgresql.conf after the
        harness's own (replica WAL, 10 WAL senders, trust on loopback, ``fsync`` off unless
        asked, ``max_connections``), so they win."""
        self._setup(name)
        try:
            _run(
                [
                    _tool("initdb"),
                    "-D",
                    self.data_dir,
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "--encoding=UTF8",
                    "--locale=C",
                    "--no-sync",  # a throw-away cluster: no need to reach the disk
                    "--no-instructions",
                ],
                timeout=timeout * 2,
                what=f"initdb of {name}",
                home=self.dir,
            )
            conf: dict[str, Setting] = {
                "listen_addresses": HOST,
                "port": self.port,
                "unix_socket_directories": str(self.socket_dir),
                # Every process of this cluster shows the temp dir's name in its title.
                "cluster_name": self.marker,
                "max_connections": max_connections,
                "shared_buffers": "32MB",
                "wal_level": "replica",
                "max_wal_senders": 10,
                "max_replication_slots": 10,
                "wal_keep_size": "256MB",  # a standby that fell behind can catch up
                "hot_standby": True,
                "wal_retrieve_retry_interval": "500ms",  # a standby reconnects quickly
                "fsync": fsync,
                "log_line_prefix": "%m [%p] %q%a ",
            }
            conf.update(settings or {})
            with (self.data_dir / "postgresql.conf").open("a") as f:
                f.write("\n# tests/pgcluster.py\n")
                for key, value in conf.items():
                    f.write(f"{_check_name(key)} = {_literal(value)}\n")
            (self.data_dir / "pg_hba.conf").write_text(
                "local all all trust\n"
                f"host all all {HOST}/32 trust\n"
                "local replication all trust\n"
                f"host replication all {HOST}/32 trust\n"
            )
            self.start(timeout)
        except BaseException:
            self.close()
            raise

    def _setup(self, name: str) -> None:
        self.name = name
        self.dir = _make_dir("")
        self.marker = self.dir.name
        self.data_dir = self.dir / "data"
        self.socket_dir = self.dir / "sock"
        self.socket_dir.mkdir()
        _chown(self.socket_dir)
        self.log_path = self.dir / "server.log"
        self.port = free_port()
        self.primary: PgServer | None = None
        """For a standby: the server it was made from."""
        self.link: Switch | None = None
        """For a standby made with ``link=True``: the Switch its replication goes through."""
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._closed = False
        self._sync_names: list[str] = []
        _register(self)

    def __repr__(self) -> str:
        return f"<PgServer {self.name} {HOST}:{self.port} {self.dir}>"

    def __enter__(self) -> PgServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- addresses

    def url(self, database: str = "postgres", driver: str = "postgresql+asyncpg") -> str:
        """A SQLAlchemy URL of ``database`` on this server as ``postgres``."""
        return _url(driver, self.port, database)

    def connect_kwargs(self, database: str = "postgres") -> dict[str, Any]:
        """Keyword arguments for ``asyncpg.connect``."""
        return {"host": HOST, "port": self.port, "user": "postgres", "database": database}

    # -- queries

    def execute(
        self, sql: str, *args: Any, database: str = "postgres", timeout: float = DEFAULT_TIMEOUT
    ) -> str:
        """Run ``sql`` on a new connection (autocommit; several statements, one implicit
        transaction, if no ``args``) and return its status. On return it is committed (with a
        synchronous standby: flushed there too). RuntimeError if it takes over ``timeout`` s
        (e.g. a commit waiting for a synchronous standby that is gone)."""
        connect = {**self.connect_kwargs(database), "timeout": min(10.0, timeout)}
        result = _blocking(
            lambda: _query(connect, sql, args, rows=False),
            timeout=timeout,
            what=f"{self.name}: {sql[:80]}",
        )
        assert isinstance(result, str)
        return result

    def fetch(
        self, sql: str, *args: Any, database: str = "postgres", timeout: float = DEFAULT_TIMEOUT
    ) -> list[tuple[Any, ...]]:
        """The rows of ``sql`` (on a new connection), as tuples."""
        connect = {**self.connect_kwargs(database), "timeout": min(10.0, timeout)}
        result = _blocking(
            lambda: _query(connect, sql, args, rows=True),
            timeout=timeout,
            what=f"{self.name}: {sql[:80]}",
        )
        assert isinstance(result, list)
        return result

    def fetchval(
        self, sql: str, *args: Any, database: str = "postgres", timeout: float = DEFAULT_TIMEOUT
    ) -> Any:
        """The first column of the first row of ``sql`` (None if no row)."""
        rows = self.fetch(sql, *args, database=database, timeout=timeout)
        return rows[0][0] if rows else None

    def create_database(self, name: str) -> str:
        """Create database ``name``; returns its URL (``postgresql+asyncpg``)."""
        self.execute(f'CREATE DATABASE "{_check_name(name)}"')
        return self.url(name)

    def set(self, **gucs: Setting) -> list[str]:
        """``ALTER SYSTEM SET`` each, then reload; on return every new connection (and every
        process that has handled the reload) has them. Returns the names that only take effect
        at the next :meth:`start` (``pending_restart``)."""
        before = self.fetchval("SELECT pg_conf_load_time()")
        for key, value in gucs.items():
            self.execute(f"ALTER SYSTEM SET {_check_name(key)} = {_literal(value)}")
        return self._reload(before, list(gucs))

    def reset(self, *names: str) -> list[str]:
        """``ALTER SYSTEM RESET`` each, then reload (as :meth:`set`)."""
        before = self.fetchval("SELECT pg_conf_load_time()")
        for key in names:
            self.execute(f"ALTER SYSTEM RESET {_check_name(key)}")
        return self._reload(before, list(names))

    def _reload(self, before: Any, names: list[str]) -> list[str]:
        self.execute("SELECT pg_reload_conf()")
        # The postmaster re-reads the files when it handles the signal: a new backend, forked
        # after that, reports a later load time.
        wait_until(
            lambda: self.fetchval("SELECT pg_conf_load_time()") > before,
            10,
            f"{self.name} to reload its configuration",
            _tail(self.log_path),
        )
        rows = self.fetch(
            "SELECT name FROM pg_settings WHERE pending_restart AND name = ANY($1::text[])",
            [n.lower() for n in names],
        )
        return [r[0] for r in rows]

    # -- life cycle

    def is_running(self) -> bool:
        """Whether the postmaster this object started is running."""
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Start the postmaster (no-op if running); on return it accepts connections (a standby:
        read-only ones). RuntimeError with the log's tail if it exits or is not ready within
        ``timeout`` s."""
        if self.is_running():
            return
        if self._closed:
            raise RuntimeError(f"{self.name} is closed")
        ids = _ids()
        if self._log is None:
            self._log = self.log_path.open("ab")
            _chown(self.log_path)
        # postgres is started directly, as this process's child, rather than by "pg_ctl start":
        # pg_ctl's postmaster is orphaned at once, and this machine's PID 1 reaps orphans only
        # after a delay, so a stopped server would linger as a zombie ("pgrep postgres" lists
        # it); a child is reaped by Popen.wait at once, and its pid cannot be reused before,
        # so killing it by pid is safe. pg_ctl does the rest (stop, promote).
        self._proc = subprocess.Popen(
            [_tool("postgres"), "-D", str(self.data_dir)],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=self.dir,
            env=_env(self.dir),
            start_new_session=True,
            user=ids.user,
            group=ids.group,
            extra_groups=ids.extra_groups,
        )
        proc = self._proc
        pid_file = self.data_dir / "postmaster.pid"

        def ready() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"PostgreSQL {self.name} exited with {proc.returncode} while starting"
                    + _tail(self.log_path)
                )
            try:
                lines = pid_file.read_text().splitlines()
            except OSError:
                return False
            # Line 8 is the postmaster's status: "ready", or "standby" once a standby takes
            # read-only connections (what pg_ctl start -w waits for).
            return (
                len(lines) >= 8
                and lines[0].strip() == str(proc.pid)
                and lines[7].strip() in ("ready", "standby")
            )

        try:
            wait_until(ready, timeout, f"PostgreSQL {self.name} to start", _tail(self.log_path))
        except AssertionError as exc:
            raise RuntimeError(str(exc)) from None

    def stop(self, mode: StopMode = "fast", timeout: float = DEFAULT_TIMEOUT) -> None:
        """``pg_ctl stop -m mode``; on return the postmaster and all its processes are gone
        (``immediate``: a crash, nothing flushed or sent to standbys). No-op if not running.
        A ``fast`` stop waits for standbys to receive everything: with a cut or frozen
        replication link it may time out (RuntimeError)."""
        if not self.is_running():
            return
        assert self._proc is not None
        _run(
            [_tool("pg_ctl"), "stop", "-D", self.data_dir, "-m", mode, "-w", "-t", int(timeout)],
            timeout=timeout + 5,
            what=f"stopping {self.name} ({mode})",
            home=self.dir,
            log=self.log_path,
        )
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            raise RuntimeError(
                f"{self.name}: pg_ctl stop returned but the postmaster is still running"
                + _tail(self.log_path)
            ) from None

    def promote(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Promote this standby (``pg_ctl promote``); on return it is out of recovery and takes
        writes. A standby promoted replays all the WAL it has received first, paused or not."""
        _run(
            [_tool("pg_ctl"), "promote", "-D", self.data_dir, "-w", "-t", int(timeout)],
            timeout=timeout + 5,
            what=f"promoting {self.name}",
            home=self.dir,
            log=self.log_path,
        )
        wait_until(
            lambda: not self.in_recovery(),
            timeout,
            f"{self.name} to leave recovery after promote",
            _tail(self.log_path),
        )

    def in_recovery(self) -> bool:
        """``pg_is_in_recovery()``: True on a standby."""
        return bool(self.fetchval("SELECT pg_is_in_recovery()"))

    def pause_replay(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Pause WAL replay on this standby; on return it is paused (it still receives WAL,
        and a promotion replays what was received: pausing alone loses nothing)."""
        self.execute("SELECT pg_wal_replay_pause()")
        wait_until(
            lambda: self.fetchval("SELECT pg_get_wal_replay_pause_state()") == "paused",
            timeout,
            f"{self.name} to pause replay",
            _tail(self.log_path),
        )

    def resume_replay(self) -> None:
        """Resume WAL replay on this standby."""
        self.execute("SELECT pg_wal_replay_resume()")

    def current_lsn(self) -> str:
        """This primary's ``pg_current_wal_lsn()``."""
        return str(self.fetchval("SELECT pg_current_wal_lsn()::text"))

    def wait_for_lsn(
        self, lsn: str, *, replayed: bool = True, timeout: float = DEFAULT_TIMEOUT
    ) -> None:
        """Wait until this standby has replayed (``replayed=False``: received and flushed) the
        WAL up to ``lsn``."""
        fn = "pg_last_wal_replay_lsn" if replayed else "pg_last_wal_receive_lsn"
        wait_until(
            lambda: self.fetchval(f"SELECT coalesce({fn}() >= $1::text::pg_lsn, false)", lsn),
            timeout,
            f"{self.name}: {fn}() to reach {lsn}",
            _tail(self.log_path),
        )

    def pids(self) -> list[ProcessRef]:
        """The postmaster and its children now (empty if not running)."""
        if not self.is_running():
            return []
        assert self._proc is not None
        found = [process_ref(self._proc.pid), *map(process_ref, _children(self._proc.pid))]
        return [ref for ref in found if ref is not None]

    def log(self, chars: int = 4000) -> str:
        """The tail of the server's log."""
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    # -- replication

    def standby(
        self,
        *,
        sync: bool,
        name: str | None = None,
        link: bool = False,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> PgServer:
        """A streaming standby of this server (``pg_basebackup -R``) on its own port, started.

        ``sync=True``: this server names it in ``synchronous_standby_names`` (every sync
        standby of it, all required) with ``synchronous_commit=on``, and on return
        ``pg_stat_replication`` shows it ``sync``; a commit here then returns once the standby
        has flushed it (visible there only with ``synchronous_commit=remote_apply``).
        ``sync=False``: on return it streams, ``async``. ``link=True``: replication goes
        through a :class:`Switch` (``standby.link``) a test can cut or freeze, as a way to lose
        commits in a failover. Closing a sync standby does not change this server's settings:
        commits here then wait (as they would in production)."""
        name = name or f"standby{next(_names)}"
        _check_name(name)
        sb = PgServer.__new__(PgServer)
        sb._setup(name)
        try:
            sb.primary = self
            conninfo_port = self.port
            if link:
                sb.link = Switch(self.port)
                conninfo_port = sb.link.port
            _run(
                [
                    _tool("pg_basebackup"),
                    "-h",
                    HOST,
                    "-p",
                    self.port,
                    "-U",
                    "postgres",
                    "-D",
                    sb.data_dir,
                    "-R",
                    "-X",
                    "stream",
                    "--checkpoint=fast",
                    "--no-sync",
                ],
                timeout=timeout * 2,
                what=f"pg_basebackup of {self.name} for {name}",
                home=sb.dir,
                log=self.log_path,
            )
            # -R wrote primary_conninfo into postgresql.auto.conf (and whatever this server had
            # there, e.g. synchronous_standby_names, was copied): the standby gets its own.
            auto = sb.data_dir / "postgresql.auto.conf"
            own = {
                "port": str(sb.port),
                "unix_socket_directories": _literal(str(sb.socket_dir)),
                "cluster_name": _literal(sb.marker),
                "primary_conninfo": _literal(
                    f"host={HOST} port={conninfo_port} user=postgres application_name={name}"
                ),
            }
            kept = [
                line
                for line in auto.read_text().splitlines()
                if line.split("=")[0].strip() not in (*own, "synchronous_standby_names")
            ]
            auto.write_text("\n".join([*kept, *(f"{k} = {v}" for k, v in own.items())]) + "\n")
            sb.start(timeout)
            if sync:
                self._sync_names.append(name)
                quoted = ", ".join(f'"{n}"' for n in self._sync_names)
                names = (
                    quoted
                    if len(self._sync_names) == 1
                    else (f"FIRST {len(self._sync_names)} ({quoted})")
                )
                self.set(synchronous_standby_names=names, synchronous_commit="on")
            self.wait_replication(name, "sync" if sync else "async", timeout=timeout)
        except BaseException:
            sb.close()
            raise
        return sb

    def wait_replication(
        self, application_name: str, sync_state: str, timeout: float = DEFAULT_TIMEOUT
    ) -> None:
        """Wait until ``pg_stat_replication`` here shows ``application_name`` streaming with
        ``sync_state`` (``sync``, ``async``, ``potential``, ``quorum``)."""
        query = "SELECT state, sync_state FROM pg_stat_replication WHERE application_name = $1"
        rows: list[tuple[Any, ...]] = []

        def check() -> bool:
            rows[:] = self.fetch(query, application_name)
            return rows == [("streaming", sync_state)]

        try:
            wait_until(check, timeout, f"{application_name} streaming {sync_state}")
        except AssertionError as exc:
            raise AssertionError(
                f"{exc} from {self.name}; pg_stat_replication: {rows}" + _tail(self.log_path)
            ) from None

    # -- clean-up

    def close(self) -> None:
        """Stop every process of this server (``pg_ctl stop -m immediate``, then SIGKILL),
        close its link, and delete its temp dir. Idempotent; never skipped by an error."""
        if self._closed:
            return
        self._closed = True
        try:
            self._halt()
        finally:
            try:
                if self.link is not None:
                    self.link.close()
            finally:
                if self._log is not None:
                    self._log.close()
                _remove_dir(self.dir)
                _unregister(self)

    def _halt(self) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            # A test may have stopped the processes (SIGSTOP, a hung server): wake them first.
            for ref in self.pids():
                _signal(ref.pid, signal.SIGCONT)
            argv: list[str | Path | int] = [_tool("pg_ctl"), "stop", "-D", self.data_dir]
            argv += ["-m", "immediate", "-w", "-t", 10]
            with contextlib.suppress(RuntimeError, OSError):
                _run(
                    argv,
                    timeout=15,
                    what=f"stopping {self.name}",
                    home=self.dir,
                )
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                children = _children(proc.pid)
                with _subreaper():
                    proc.kill()
                    for child in children:
                        _signal(child, signal.SIGKILL)
                    proc.wait(10)
                    _reap(children, 10)
        # Whatever still carries this cluster's name (a backend its postmaster did not wait for).
        _kill_marked(self.marker, 10)


class Pair(NamedTuple):
    """A primary and its streaming standby."""

    primary: PgServer
    standby: PgServer


# ---------------------------------------------------------------------------------------------
# PgBouncer


class PgBouncer:
    """PgBouncer on ``127.0.0.1:port`` in front of one server (every database name is passed
    through), trust auth for ``postgres``, admin console ``pgbouncer`` (``admin_users =
    postgres``). Apart from what is set here and ``settings``, PgBouncer's defaults hold: no
    ``ignore_startup_parameters`` (a client sending a start-up parameter PgBouncer does not
    know is refused, as in production), ``server_login_retry`` 15 s (a server found down is
    not tried again for that long), ``server_reset_query = DISCARD ALL`` (session mode only).
    """

    host = HOST

    def __init__(
        self,
        target: PgServer | tuple[str, int],
        pool_mode: PoolMode = "session",
        *,
        default_pool_size: int = 20,
        max_client_conn: int = 1000,
        ignore_startup_parameters: str | None = None,
        admin: bool = True,
        settings: Mapping[str, Setting] | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        """Write the config and start PgBouncer; on return it accepts connections."""
        self.target = (target.host, target.port) if isinstance(target, PgServer) else target
        self.pool_mode = pool_mode
        self.dir = _make_dir("b")
        self.marker = self.dir.name
        self.port = free_port()
        self.config_path = self.dir / "pgbouncer.ini"
        self.log_path = self.dir / "pgbouncer.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._closed = False
        _register(self)
        try:
            auth_file = self.dir / "userlist.txt"
            auth_file.write_text('"postgres" ""\n')
            conf: dict[str, Setting] = {
                "listen_addr": HOST,
                "listen_port": self.port,
                "unix_socket_dir": str(self.dir),  # not /tmp, the default
                "auth_type": "trust",
                "auth_file": str(auth_file),
                "pool_mode": pool_mode,
                "default_pool_size": default_pool_size,
                "max_client_conn": max_client_conn,
            }
            if admin:
                conf["admin_users"] = "postgres"
                conf["stats_users"] = "postgres"
            if ignore_startup_parameters is not None:
                conf["ignore_startup_parameters"] = ignore_startup_parameters
            conf.update(settings or {})
            lines = [
                "[databases]",
                f"* = host={self.target[0]} port={self.target[1]}",
                "",
                "[pgbouncer]",
                *(f"{_check_name(k)} = {_plain(v)}" for k, v in conf.items()),
            ]
            self.config_path.write_text("\n".join(lines) + "\n")
            for path in (auth_file, self.config_path):
                _chown(path)
            self.start(timeout)
        except BaseException:
            self.close()
            raise

    def __repr__(self) -> str:
        return f"<PgBouncer {self.pool_mode} {HOST}:{self.port} -> {self.target}>"

    def __enter__(self) -> PgBouncer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def url(self, database: str = "postgres", driver: str = "postgresql+asyncpg") -> str:
        """A SQLAlchemy URL of ``database`` through this PgBouncer, as ``postgres``."""
        return _url(driver, self.port, database)

    def connect_kwargs(self, database: str = "postgres") -> dict[str, Any]:
        """Keyword arguments for ``asyncpg.connect`` (add ``statement_cache_size=0`` in
        transaction mode)."""
        return {"host": HOST, "port": self.port, "user": "postgres", "database": database}

    def is_running(self) -> bool:
        """Whether the PgBouncer process this object started is running."""
        return self._proc is not None and self._proc.poll() is None

    def pids(self) -> list[ProcessRef]:
        """The PgBouncer process now (empty if not running); it has no children."""
        ref = process_ref(self._proc.pid) if self._proc and self.is_running() else None
        return [ref] if ref else []

    def log(self, chars: int = 4000) -> str:
        """The tail of PgBouncer's log."""
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    def start(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Start PgBouncer (no-op if running); on return it accepts TCP connections."""
        if self.is_running():
            return
        if self._closed:
            raise RuntimeError("this PgBouncer is closed")
        ids = _ids()
        if self._log is None:
            self._log = self.log_path.open("ab")
        self._proc = subprocess.Popen(
            [_tool("pgbouncer"), str(self.config_path)],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=self.dir,
            env=_env(self.dir),
            start_new_session=True,
            user=ids.user,
            group=ids.group,
            extra_groups=ids.extra_groups,
        )
        proc = self._proc

        def listening() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"PgBouncer exited with {proc.returncode} while starting" + _tail(self.log_path)
                )
            try:
                socket.create_connection((HOST, self.port), 1).close()
            except OSError:
                return False
            return True

        try:
            wait_until(listening, timeout, "PgBouncer to listen", _tail(self.log_path))
        except AssertionError as exc:
            raise RuntimeError(str(exc)) from None

    def stop(self) -> None:
        """Stop PgBouncer (SIGTERM: immediate shutdown, clients cut; SIGKILL after 10 s); on
        return it is gone."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGCONT)
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            _killpg(proc.pid)
            proc.wait(10)

    def show(self, what: str, timeout: float = DEFAULT_TIMEOUT) -> list[dict[str, str]]:
        """``SHOW what`` on the admin console (``POOLS``, ``SERVERS``, ``CLIENTS``, ...), as
        one dict per row (psql, since the console speaks only the simple query protocol)."""
        if not re.fullmatch(r"[A-Za-z_]+", what):
            raise ValueError(f"not a SHOW command: {what!r}")
        argv: list[str | Path | int] = [_tool("psql"), "-X", "-q", "--csv", "-h", HOST]
        argv += ["-p", self.port, "-U", "postgres", "-d", "pgbouncer", "-c", f"SHOW {what}"]
        out = _run(
            argv,
            timeout=timeout,
            what=f"PgBouncer SHOW {what}",
            home=self.dir,
            log=self.log_path,
        )
        return list(csv.DictReader(io.StringIO(out)))

    def pools(self) -> list[dict[str, str]]:
        """``SHOW POOLS``: per (database, user), clients (``cl_*``) and servers (``sv_*``)."""
        return self.show("POOLS")

    def servers(self) -> list[dict[str, str]]:
        """``SHOW SERVERS``: one row per server connection PgBouncer holds."""
        return self.show("SERVERS")

    def server_connections(self, database: str | None = None) -> int:
        """How many server connections PgBouncer holds (active, idle, used, tested, logging
        in), for ``database`` or all, from ``SHOW POOLS``."""
        total = 0
        for row in self.pools():
            if database is None or row["database"] == database:
                total += sum(
                    int(row[k])
                    for k in ("sv_active", "sv_idle", "sv_used", "sv_tested", "sv_login")
                )
        return total

    def close(self) -> None:
        """Stop PgBouncer and delete its temp dir. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self.stop()
            _kill_marked(self.marker, 5)
        finally:
            if self._log is not None:
                self._log.close()
            _remove_dir(self.dir)
            _unregister(self)


def _plain(value: Setting) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


# ---------------------------------------------------------------------------------------------
# Switch


_READ = selectors.EVENT_READ
_WRITE = selectors.EVENT_WRITE
_BUFFER = 1 << 20  # per direction: a side that does not read stops the other side's reads


@dataclass(eq=False)
class _Link:
    client: socket.socket
    server: socket.socket
    pending: dict[socket.socket, bytearray] = field(default_factory=dict)
    """Bytes read from one side, waiting to be written to the socket keyed."""

    def peer(self, sock: socket.socket) -> socket.socket:
        return self.server if sock is self.client else self.client


def _reset(sock: socket.socket) -> None:
    """Close with a RST, as a peer that no longer knows the connection answers."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


class Switch:
    """A TCP forwarder from ``127.0.0.1:port`` (fixed for its life) to a target that can
    change: a failover's virtual IP. It runs in its own thread, so it works while the test's
    event loop or thread is blocked, and for subprocesses alike.

    * :meth:`switch_to`: new connections go to another target; every open one is reset.
    * :meth:`cut`: every open connection is reset, new ones are accepted and reset at once,
      until :meth:`restore` or :meth:`switch_to`.
    * :meth:`freeze`: nothing is forwarded, either way, on open or new connections, and nothing
      is lost: :meth:`thaw` delivers it.
    Each control call returns once the switch thread has applied it.
    """

    host = HOST

    def __init__(self, target_port: int, target_host: str = HOST) -> None:
        self._target = (target_host, target_port)
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((HOST, 0))
        self._listener.listen(128)
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self.accepted = 0
        """Connections accepted so far (cut ones included)."""
        self._cut = False
        self._frozen = False
        self._held: list[socket.socket] = []  # accepted while frozen, not yet forwarded
        self._links: dict[socket.socket, _Link] = {}
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel.register(self._listener, _READ)
        self._sel.register(self._wake_r, _READ)
        self._commands: SimpleQueue[tuple[Callable[[], None], threading.Event]] = SimpleQueue()
        self._stopping = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name=f"switch:{self.port}", daemon=True)
        self._thread.start()
        _register(self)

    def __repr__(self) -> str:
        return f"<Switch {HOST}:{self.port} -> {self._target}>"

    def __enter__(self) -> Switch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def target(self) -> tuple[str, int]:
        return self._target

    @property
    def connections(self) -> int:
        """Connections open through the switch now."""
        return len(self._links) // 2

    def url(self, url: str) -> str:
        """``url`` pointed at the switch."""
        from sqlalchemy.engine import make_url

        return make_url(url).set(host=HOST, port=self.port).render_as_string(hide_password=False)

    # -- control (applied by the switch thread; returns once applied)

    def switch_to(self, port: int, host: str = HOST) -> None:
        """Send new connections to (host, port) from now on, reset every open connection, and
        end a cut or a freeze."""

        def apply() -> None:
            self._target = (host, port)
            self._cut = False
            self._drop_all()
            self._frozen = False
            self._refresh()

        self._call(apply)

    def cut(self) -> None:
        """Reset every open connection and every new one, until :meth:`restore`."""

        def apply() -> None:
            self._cut = True
            self._drop_all()

        self._call(apply)

    def restore(self) -> None:
        """End a cut: new connections are forwarded again (to the same target)."""

        def apply() -> None:
            self._cut = False

        self._call(apply)

    def freeze(self) -> None:
        """Forward nothing, on any connection, either way, until :meth:`thaw`; nothing lost."""

        def apply() -> None:
            self._frozen = True
            self._refresh()

        self._call(apply)

    def thaw(self) -> None:
        """Forward again what was held and what comes after."""

        def apply() -> None:
            self._frozen = False
            held, self._held = self._held, []
            for client in held:
                self._connect(client)
            self._refresh()

        self._call(apply)

    def close(self) -> None:
        """Reset every connection and stop listening. Idempotent."""
        if not self._stopping:
            self._stopping = True
            with contextlib.suppress(OSError):
                self._wake_w.send(b"x")
            self._thread.join(10)
        _unregister(self)

    def _call(self, fn: Callable[[], None]) -> None:
        if self._stopping or not self._thread.is_alive():
            raise RuntimeError(f"{self} is closed" + (f": {self._error!r}" if self._error else ""))
        done = threading.Event()
        self._commands.put((fn, done))
        with contextlib.suppress(BlockingIOError):
            self._wake_w.send(b"x")
        if not done.wait(10):
            raise RuntimeError(f"{self}: the switch thread did not answer within 10 s")

    # -- the switch thread

    def _loop(self) -> None:
        try:
            while not self._stopping:
                for key, mask in self._sel.select(0.5):
                    sock = key.fileobj
                    assert isinstance(sock, socket.socket)
                    if sock is self._listener:
                        self._accept()
                    elif sock is self._wake_r:
                        with contextlib.suppress(BlockingIOError):
                            self._wake_r.recv(4096)
                    else:
                        self._service(sock, mask)
                while True:
                    try:
                        fn, done = self._commands.get_nowait()
                    except Empty:
                        break
                    try:
                        fn()
                    finally:
                        done.set()
        except BaseException as exc:  # kept for the next control call to report
            self._error = exc
        finally:
            self._drop_all()
            for sock in (self._listener, self._wake_r, self._wake_w):
                sock.close()
            self._sel.close()
            while True:  # nobody waits on a control call of a dead switch
                try:
                    self._commands.get_nowait()[1].set()
                except Empty:
                    break

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            self.accepted += 1
            if self._cut:
                _reset(client)
            elif self._frozen:
                self._held.append(client)
            else:
                self._connect(client)

    def _connect(self, client: socket.socket) -> None:
        try:
            # Blocking, but to loopback: refused or accepted at once.
            server = socket.create_connection(self._target, timeout=3)
        except OSError:
            _reset(client)
            return
        link = _Link(client, server)
        for sock in (client, server):
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            link.pending[sock] = bytearray()
            self._links[sock] = link
        self._events(client)
        self._events(server)

    def _events(self, sock: socket.socket) -> None:
        link = self._links.get(sock)
        if link is None:
            return
        events = 0
        if not self._frozen:
            if len(link.pending[link.peer(sock)]) < _BUFFER:
                events |= _READ
            if link.pending[sock]:
                events |= _WRITE
        key = self._sel.get_map().get(sock)
        if events == 0:
            if key is not None:
                self._sel.unregister(sock)
        elif key is None:
            self._sel.register(sock, events)
        elif key.events != events:
            self._sel.modify(sock, events)

    def _refresh(self) -> None:
        for sock in list(self._links):
            self._events(sock)

    def _service(self, sock: socket.socket, mask: int) -> None:
        link = self._links.get(sock)
        if link is None:
            return
        other = link.peer(sock)
        if mask & _READ:
            try:
                data = sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                data = None
            except OSError:
                self._drop(link, reset=True)
                return
            if data == b"":
                self._flush(link, other)  # best effort, then close both: PG needs no half-close
                self._drop(link, reset=False)
                return
            if data:
                link.pending[other] += data
                if not self._flush(link, other):
                    return
        if mask & _WRITE and not self._flush(link, sock):
            return
        self._events(sock)
        self._events(other)

    def _flush(self, link: _Link, sock: socket.socket) -> bool:
        """Write what is pending to ``sock``; False if the link broke (and was dropped)."""
        buf = link.pending[sock]
        while buf:
            try:
                sent = sock.send(buf)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self._drop(link, reset=True)
                return False
            del buf[:sent]
        return True

    def _drop(self, link: _Link, *, reset: bool) -> None:
        for sock in (link.client, link.server):
            if self._links.pop(sock, None) is None:
                continue
            if self._sel.get_map().get(sock) is not None:
                self._sel.unregister(sock)
            if reset:
                _reset(sock)
            else:
                sock.close()

    def _drop_all(self) -> None:
        for link in {id(v): v for v in self._links.values()}.values():
            self._drop(link, reset=True)
        held, self._held = self._held, []
        for client in held:
            _reset(client)


__all__ = [
    "DEFAULT_TIMEOUT",
    "HOST",
    "PG_TOOLS",
    "Pair",
    "PgBouncer",
    "PgServer",
    "PoolMode",
    "ProcessRef",
    "Setting",
    "StopMode",
    "Switch",
    "close_all",
    "created_dirs",
    "free_port",
    "is_alive",
    "live",
    "missing_tools",
    "pg_bin_dir",
    "process_ref",
    "processes_matching",
    "sweep_stale",
    "tool",
    "wait_until",
]
