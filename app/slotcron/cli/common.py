"""What every ``slotcron`` command shares: printing, argument types, job imports, the database.

Everything printed goes through :func:`say` (or :func:`say_json`, or :func:`print_table`): ids,
names, errors and params are written by jobs and clients, so their control characters (C0, DEL,
C1, ESC among them, and the bidirectional overrides) are printed as ``\\x1b`` escapes and cannot
recolour, retitle or clear the terminal, nor forge a line of output.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import logging
import sys
import sysconfig
from collections.abc import Callable, Coroutine, Sequence
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any, NoReturn, TextIO

from slotcron.config import Settings
from slotcron.errors import InvalidJobError, UsageError
from slotcron.filters import parse_instant
from slotcron.jobs.registry import REGISTRY, Job
from slotcron.text import displayable

MAX_ID = 2**63 - 1
"""The largest execution id any of the databases can hold."""
MAX_NAME = 200  # as the jobs table
MAX_PARAM = 10_000

log = logging.getLogger("slotcron.cli")


def say(text: str, *, file: TextIO | None = None) -> None:
    """Print one line of output, its control characters escaped (newlines too: one line)."""
    print(displayable(text, newlines=False), file=file)


def say_json(value: Any) -> None:
    """Print ``value`` as indented JSON. ``json.dumps`` escapes C0 controls and everything past
    ASCII (C1 included); DEL, which JSON allows raw, is escaped here: still the same JSON."""
    print(json.dumps(value, indent=2).replace("\x7f", "\\u007f"))


def print_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in header:
        table.add_column(column, overflow="fold" if column == "ERROR" else "ellipsis")
    for row in rows:
        # Cells are Text, never markup: a job's error "[/x]" is shown, not parsed (it raised
        # MarkupError), and control characters are escaped so they cannot drive the terminal.
        table.add_row(*(Text(displayable(cell, newlines=False)) for cell in row))
    Console(width=max(Console().width, 160), highlight=False).print(table)


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line: the usage is one `--help` away. argparse quotes what it refuses.
        shown = displayable(message, newlines=False)
        self.exit(2, f"{self.prog}: error: {shown} (see {self.prog} --help)\n")


def shown(text: str) -> str:
    """An argument as it may be echoed in an error: undecodable bytes and controls escaped."""
    return repr(displayable(text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")))


def bounded_int(high: int) -> Callable[[str], int]:
    """An argument type: a whole number from 1 to ``high``."""

    def parse(text: str) -> int:
        digits = text.strip()
        if not digits.isascii() or not digits.lstrip("+").isdigit() or len(digits) > 30:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {shown(text)}")
        value = int(digits)
        if not 1 <= value <= high:
            raise argparse.ArgumentTypeError(f"must be between 1 and {high}, got {value}")
        return value

    return parse


def text(what: str, longest: int) -> Callable[[str], str]:
    """An argument stored as text: valid UTF-8 (the shell hands over bytes), no NUL character
    (PostgreSQL refuses it), at most ``longest`` characters (as its column)."""

    def parse(value: str) -> str:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise argparse.ArgumentTypeError(f"{what} {shown(value)} is not valid UTF-8") from None
        if "\x00" in value:
            raise argparse.ArgumentTypeError(f"{what} {shown(value)} contains a NUL character")
        if len(value) > longest:
            raise argparse.ArgumentTypeError(
                f"{what} has at most {longest} characters, got {len(value)}"
            )
        return value

    return parse


def instant(option: str) -> Callable[[str], datetime]:
    """An argument type: an ISO-8601 time with its offset (UTC when it gives none), refused
    naming ``option``."""

    def parse(value: str) -> datetime:
        try:
            return parse_instant(text(option, 100)(value))
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{option} {exc}") from None

    return parse


def param(value: str) -> tuple[str, str]:
    """An argument type: ``--param KEY=VALUE``."""
    value = text("--param", MAX_PARAM)(value)
    key, sep, rest = value.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"--param {value!r}: expected KEY=VALUE")
    return key.strip(), rest


def import_jobs(modules: Sequence[str]) -> list[Job]:
    """Import job modules (from the working directory too) and return the registered jobs.

    A module that raises while it is imported is named with the file and line where it raised
    (the innermost frame of code outside Python, its libraries and slotcron); the whole
    traceback goes to the log at DEBUG."""
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    for module in dict.fromkeys(modules):
        try:
            importlib.import_module(module)
        except InvalidJobError:
            raise
        except ModuleNotFoundError as exc:
            raise UsageError(f"--jobs/SCHEDULER_JOBS: cannot import {module!r}: {exc}") from None
        except Exception as exc:
            log.debug("importing %r failed", module, exc_info=exc)
            raise UsageError(
                f"--jobs/SCHEDULER_JOBS: importing {module!r} failed: {type(exc).__name__}: "
                f"{exc}{raised_at(exc)}"
            ) from None
    return list(REGISTRY)


def raised_at(exc: BaseException) -> str:
    """`` (file F, line N)``: where ``exc`` was raised in the user's code, or "" if unknown."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f" (file {exc.filename}, line {exc.lineno})"
    frames = _frames(exc.__traceback__)
    if not frames:
        return ""
    theirs = [frame for frame in frames if not _outside_user_code(frame[0])]
    filename, lineno = (theirs or frames)[-1]
    return f" (file {filename}, line {lineno})"


def _frames(tb: TracebackType | None) -> list[tuple[str, int]]:
    frames = []
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if not filename.startswith("<"):  # importlib's frozen bootstrap, exec'd strings
            frames.append((filename, tb.tb_lineno))
        tb = tb.tb_next
    return frames


def _outside_user_code(filename: str) -> bool:
    paths = sysconfig.get_paths()
    ours = str(Path(__file__).resolve().parent.parent)
    roots = {paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")} | {ours}
    resolved = str(Path(filename).resolve())
    return any(resolved.startswith(str(Path(root).resolve()) + "/") for root in roots)


def runner() -> asyncio.Runner:
    """An event loop runner: uvloop's where it is installed."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency except on Windows
        return asyncio.Runner()
    return asyncio.Runner(loop_factory=uvloop.new_event_loop)


def run_async(coro: Coroutine[Any, Any, Any]) -> Any:
    with runner() as loop:
        return loop.run(coro)


def with_db(settings: Settings, work: Callable[[Any], Coroutine[Any, Any, Any]]) -> Any:
    """``await work(db)`` on a one-connection database that is closed afterwards."""
    from slotcron.store.database import Database

    async def go() -> Any:
        db = Database.connect(settings.url, 1, create=False, pooler=settings.database_pooler)
        try:
            return await work(db)
        finally:
            await db.close()

    return run_async(go())
