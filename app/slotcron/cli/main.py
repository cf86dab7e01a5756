"""The command line: ``slotcron`` (identical to ``python -m slotcron``).

Exit status: 0 done, 1 refused (or the database could not be reached), 2 bad usage or
configuration. Errors are one line on stderr; no password ever appears.

Everything printed goes through :func:`say` (or :func:`say_json`, or a table of escaped cells):
ids, names, errors and params are written by jobs and clients, so their control characters (C0,
DEL, C1, ESC among them, and the bidirectional overrides) are printed as ``\x1b`` escapes and
cannot recolour, retitle or clear the terminal, nor forge a line of output.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import logging
import os
import sys
from collections.abc import Callable, Coroutine, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn, TextIO

from slotcron.config import Settings, load_settings
from slotcron.errors import ConfigError, InvalidJobError, Refused, UsageError
from slotcron.filters import parse_since, parse_status
from slotcron.jobs.registry import REGISTRY, Job
from slotcron.lifeline.outage import DB_ERRORS, describe, refused_login
from slotcron.observe import logs
from slotcron.records import displayable, execution_json, instance_json, iso, job_json
from slotcron.schedule.slots import normalise_cron
from slotcron.schedule.springcron import day_rule
from slotcron.version import __version__


def say(text: str, *, file: TextIO | None = None) -> None:
    """Print one line of output, its control characters escaped (newlines too: one line)."""
    print(displayable(text, newlines=False), file=file)


def say_json(value: Any) -> None:
    """Print ``value`` as indented JSON. ``json.dumps`` escapes C0 controls and everything past
    ASCII (C1 included); DEL, which JSON allows raw, is escaped here: still the same JSON."""
    print(json.dumps(value, indent=2).replace("\x7f", "\\u007f"))


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line: the usage is one `--help` away. argparse quotes what it refuses.
        shown = displayable(message, newlines=False)
        self.exit(2, f"{self.prog}: error: {shown} (see {self.prog} --help)\n")


def _parse_since(text: str) -> datetime:
    try:
        return parse_since(_text("--since", 100)(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--since {exc}") from None


MAX_HISTORY_LIMIT = 10_000
MAX_ID = 2**63 - 1
"""The largest execution id any of the databases can hold."""
MAX_NAME = 200  # as the jobs table
MAX_REASON = 400  # as the jobs table's paused_reason
MAX_PARAM = 10_000


def _bounded_int(high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        digits = text.strip()
        if not digits.isascii() or not digits.lstrip("+").isdigit() or len(digits) > 30:
            shown = _shown(text)
            raise argparse.ArgumentTypeError(f"expected a whole number, got {shown}") from None
        value = int(digits)
        if not 1 <= value <= high:
            raise argparse.ArgumentTypeError(f"must be between 1 and {high}, got {value}")
        return value

    return parse


_positive_int = _bounded_int(MAX_ID)


def _shown(text: str) -> str:
    """An argument as it may be echoed in an error: undecodable bytes and controls escaped."""
    return repr(displayable(text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")))


def _text(what: str, longest: int) -> Callable[[str], str]:
    """An argument stored as text: valid UTF-8 (the shell hands over bytes), no NUL character
    (PostgreSQL refuses it), at most ``longest`` characters (as its column)."""

    def parse(text: str) -> str:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise argparse.ArgumentTypeError(f"{what} {_shown(text)} is not valid UTF-8") from None
        if "\x00" in text:
            raise argparse.ArgumentTypeError(f"{what} {_shown(text)} contains a NUL character")
        if len(text) > longest:
            raise argparse.ArgumentTypeError(
                f"{what} has at most {longest} characters, got {len(text)}"
            )
        return text

    return parse


_job = _text("job name", MAX_NAME)


def _status(text: str) -> str:
    try:
        return parse_status(_text("--status", 20)(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="slotcron", description="Cluster cron: every slot runs exactly once.")
    parser.add_argument("--version", action="version", version=f"slotcron {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True

    run = commands.add_parser("run", help="run the service until SIGTERM/SIGINT")
    run.add_argument(
        "--jobs",
        nargs="+",
        action="extend",
        default=[],
        metavar="MOD",
        help="modules to import for jobs (added to SCHEDULER_JOBS)",
    )

    migrate = commands.add_parser("migrate", help="apply the database migrations")
    migrate.add_argument("--sql", action="store_true", help="print the SQL instead of running it")

    check = commands.add_parser("check", help="validate configuration and jobs; show next slots")
    check.add_argument("--jobs", nargs="+", action="extend", default=[], metavar="MOD")

    history = commands.add_parser("history", help="executions, newest first")
    history.add_argument("job", nargs="?", metavar="JOB", type=_job)
    history.add_argument("--status", type=_status)
    history.add_argument(
        "--since",
        type=_parse_since,
        metavar="WHEN",
        help="ISO-8601 time, or a duration back from now: 30m, 2h, 7d",
    )
    history.add_argument("--limit", type=_bounded_int(MAX_HISTORY_LIMIT), default=50)
    history.add_argument("--json", action="store_true", help="print one JSON array")

    inst = commands.add_parser("instances", help="instances, heartbeats, state, leader")
    inst.add_argument("--json", action="store_true", help="print one JSON array")

    jobs_ = commands.add_parser("jobs", help="jobs known to the database")
    jobs_.add_argument("--json", action="store_true", help="print one JSON array")

    trig = commands.add_parser("trigger", help="queue a manual run now, for any live instance")
    trig.add_argument("job", metavar="JOB", type=_job)
    trig.add_argument(
        "--param",
        action="append",
        default=[],
        type=_param,
        metavar="K=V",
        help="a parameter for ctx.params (repeatable)",
    )

    for verb, text in (
        ("pause", "record the job's slots SKIPPED until resumed"),
        ("resume", "run the job's slots again"),
    ):
        sub = commands.add_parser(verb, help=text)
        sub.add_argument("job", metavar="JOB", type=_job)
        if verb == "pause":
            sub.add_argument(
                "--reason",
                type=_text("--reason", MAX_REASON),
                help=f"recorded with each skipped slot (at most {MAX_REASON} characters)",
            )

    restart = commands.add_parser(
        "restart", help="run a FAILED, STOPPED or ABANDONED slot again, with its saved state"
    )
    restart.add_argument("execution_id", type=_positive_int, metavar="EXECUTION_ID")

    from slotcron.cli.schedules import add_parser as add_schedules_parser  # it imports this module

    add_schedules_parser(commands)
    return parser


def _param(text: str) -> tuple[str, str]:
    text = _text("--param", MAX_PARAM)(text)
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"--param {text!r}: expected KEY=VALUE")
    return key.strip(), value


def import_jobs(modules: Sequence[str]) -> list[Job]:
    """Import job modules (from the working directory too) and return the registered jobs."""
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
            raise UsageError(
                f"--jobs/SCHEDULER_JOBS: importing {module!r} failed: {type(exc).__name__}: {exc}"
            ) from None
    return list(REGISTRY)


def _runner() -> asyncio.Runner:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency except on Windows
        return asyncio.Runner()
    return asyncio.Runner(loop_factory=uvloop.new_event_loop)


def _run_async(coro: Coroutine[Any, Any, Any]) -> Any:
    with _runner() as runner:
        return runner.run(coro)


def cmd_run(settings: Settings, args: argparse.Namespace) -> int:
    from slotcron.service.service import Service

    jobs = import_jobs([*settings.jobs, *args.jobs])
    if not jobs:
        logging.getLogger("slotcron").warning(
            "no jobs registered: pass --jobs MODULE or set SCHEDULER_JOBS"
        )
    service = Service(settings, jobs)
    with _runner() as runner:
        clean = runner.run(service.run())
        if not clean:
            # A job swallowed its cancellation; it is recorded STOPPED. Leaving the runner
            # would await it forever, so leave the process instead.
            logging.getLogger("slotcron").warning("exiting with runs that ignored cancellation")
            logging.shutdown()
            sys.stdout.flush()
            os._exit(service.exit_status)
    return service.exit_status  # 1: another process took our instance id over


def _log_admin_api(settings: Settings) -> None:
    if settings.http_port is None:
        logging.getLogger("slotcron").info("admin API: off (no SCHEDULER_HTTP_PORT)")
    elif settings.admin_token is None:
        logging.getLogger("slotcron").warning("%s", settings.admin_api_protection)
    else:
        logging.getLogger("slotcron").info("%s", settings.admin_api_protection)


def cmd_migrate(settings: Settings, args: argparse.Namespace) -> int:
    from slotcron.store import migrate

    if args.sql:
        sys.stdout.write(migrate.upgrade_sql(settings.url))
        return 0

    async def go() -> tuple[str | None, str | None]:
        from slotcron.store.database import Database

        db = Database.connect(settings.url, 1, pooler=settings.database_pooler)
        try:
            return await migrate.upgrade(db.engine, db.dialect)
        finally:
            await db.close()

    before, after = _run_async(go())
    if before == after:
        say(f"database already at revision {after}; nothing to do")
    else:
        say(f"database migrated from {before or 'empty'} to revision {after}")
    return 0


def cmd_check(settings: Settings, args: argparse.Namespace) -> int:
    jobs = import_jobs([*settings.jobs, *args.jobs])
    say(f"configuration ok: database {settings.safe_url}, {len(jobs)} jobs")
    _log_admin_api(settings)
    now = datetime.now(UTC)
    for job in jobs:
        schedule = job.schedule(settings.timezone)
        zone = job.timezone or settings.timezone if job.kind == "cron" else "UTC"
        state = "" if job.enabled else " (disabled)"
        say(f"{job.name}  {schedule.describe()}  {zone}{state}")
        if job.kind == "cron" and (rule := day_rule(*normalise_cron(job.expression))):
            say(f"  {rule}")
        slot = now
        for _ in range(5):
            slot = schedule.next_after(slot)
            say(f"  {iso(slot)}")
    return 0


def cmd_history(settings: Settings, args: argparse.Namespace) -> int:
    from slotcron.store.database import Database
    from slotcron.store.history import list_executions

    async def go() -> list[Any]:
        db = Database.connect(settings.url, 1, create=False, pooler=settings.database_pooler)
        try:
            return await list_executions(
                db, job=args.job, status=args.status, since=args.since, limit=args.limit
            )
        finally:
            await db.close()

    records = _run_async(go())
    if args.json:
        say_json([execution_json(r) for r in records])
        return 0
    rows = []
    for r in records:
        took = f"{r.duration_ms / 1000:.2f}s" if r.duration_ms is not None else ""
        # "\n" only: splitlines() would also split at a "\r" or "\x1c" a job wrote, and show
        # what follows it as if it were the whole message.
        first_error = (r.error or "").strip().split("\n")
        rows.append(
            (
                str(r.id),
                r.job,
                (iso(r.scheduled_at) or "") + (f" .. {iso(r.until)}" if r.until else ""),
                r.trigger,
                r.status,
                str(r.attempt),
                r.instance_id or "",
                took,
                first_error[-1] if first_error else "",
            )
        )
    header = ("ID", "JOB", "SLOT (UTC)", "TRIGGER", "STATUS", "TRY", "INSTANCE", "TOOK", "ERROR")
    _print_table(header, rows)
    if not records:
        say("no executions match")
    return 0


def cmd_instances(settings: Settings, args: argparse.Namespace) -> int:
    from slotcron.store.database import Database
    from slotcron.store.registrations import list_instances

    async def go() -> list[Any]:
        db = Database.connect(settings.url, 1, create=False, pooler=settings.database_pooler)
        try:
            return await list_instances(db)
        finally:
            await db.close()

    records = _run_async(go())
    if args.json:
        say_json([instance_json(r) for r in records])
        return 0
    _print_table(
        (
            "INSTANCE",
            "HOST",
            "PID",
            "VERSION",
            "STATE",
            "LEADER",
            "STARTED (UTC)",
            "HEARTBEAT (UTC)",
        ),
        [
            (
                r.instance_id,
                r.host,
                str(r.pid),
                r.version,
                r.state,
                "yes" if r.leader else "",
                iso(r.started_at) or "",
                iso(r.heartbeat_at) or "",
            )
            for r in records
        ],
    )
    if not records:
        say("no instances have registered")
    return 0


def _with_db(settings: Settings, work: Callable[[Any], Coroutine[Any, Any, Any]]) -> Any:
    from slotcron.store.database import Database

    async def go() -> Any:
        db = Database.connect(settings.url, 1, create=False, pooler=settings.database_pooler)
        try:
            return await work(db)
        finally:
            await db.close()

    return _run_async(go())


def cmd_jobs(settings: Settings, args: argparse.Namespace) -> int:
    from slotcron.store.operations import list_jobs

    async def work(db: Any) -> Any:
        return await list_jobs(db, now=await db.now(), live_within=settings.lease_seconds)

    records = _with_db(settings, work)
    if args.json:
        say_json([job_json(r) for r in records])
        return 0
    _print_table(
        (
            "JOB",
            "SCHEDULE",
            "TIMEZONE",
            "NEXT SLOT (UTC)",
            "PAUSED",
            "LAST",
            "LAST SLOT (UTC)",
            "DRIFT",
            "SUPERSEDED",
        ),
        [
            (
                r.name,
                r.schedule,
                r.timezone,
                iso(r.next_slot) or "",
                "paused" if r.paused else "",
                r.last_status or "",
                iso(r.last_slot) or "",
                "; ".join(f"{v}: {sched}" for v, sched in sorted(r.drift.items())),
                "; ".join(f"{i}: {sched}" for i, sched in sorted(r.superseded.items())),
            )
            for r in records
        ],
    )
    if not records:
        say("no jobs are known to the database yet")
    return 0


def cmd_trigger(settings: Settings, args: argparse.Namespace) -> int:
    from slotcron.store import operations

    async def work(db: Any) -> Any:
        return await operations.trigger_live(
            db,
            job=args.job,
            params=dict(args.param),
            now=await db.now(),
            live_within=settings.lease_seconds,
        )

    queued = _with_db(settings, work)
    say(
        f"queued execution {queued.execution_id}: {queued.job} manual run "
        f"(slot {iso(queued.scheduled_at)})"
    )
    return 0


def cmd_pause(settings: Settings, args: argparse.Namespace) -> int:
    from slotcron.store import operations

    pausing = args.command == "pause"
    changed = _with_db(
        settings,
        lambda db: operations.set_paused(
            db, job=args.job, paused=pausing, reason=getattr(args, "reason", None)
        ),
    )
    state = "paused" if pausing else "resumed"
    say(f"{args.job} {state}" if changed else f"{args.job} was already {state}")
    return 0


def cmd_restart(settings: Settings, args: argparse.Namespace) -> int:
    from slotcron.store import operations

    async def work(db: Any) -> Any:
        return await operations.restart(db, execution_id=args.execution_id, now=await db.now())

    queued = _with_db(settings, work)
    say(
        f"queued execution {queued.execution_id}: {queued.job} slot {iso(queued.scheduled_at)}, "
        f"attempt {queued.attempt} (restart)"
    )
    return 0


def _print_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
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


def cmd_schedules(settings: Settings, args: argparse.Namespace) -> int:
    from slotcron.cli.schedules import cmd_schedules as schedules

    return schedules(settings, args)


COMMANDS: dict[str, Callable[[Settings, argparse.Namespace], int]] = {
    "run": cmd_run,
    "migrate": cmd_migrate,
    "check": cmd_check,
    "history": cmd_history,
    "instances": cmd_instances,
    "jobs": cmd_jobs,
    "trigger": cmd_trigger,
    "pause": cmd_pause,
    "resume": cmd_pause,
    "restart": cmd_restart,
    "schedules": cmd_schedules,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = load_settings()
        logs.configure(settings.log_level, settings.log_format)
        return COMMANDS[args.command](settings, args)
    except ConfigError as exc:
        say(f"slotcron: configuration error: {exc}", file=sys.stderr)
        return 2
    except (InvalidJobError, UsageError) as exc:
        say(f"slotcron: error: {exc}", file=sys.stderr)
        return 2
    except Refused as exc:
        say(f"slotcron: refused: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader went away (`slotcron history | head`): not an error of ours.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except DB_ERRORS as exc:
        if refused_login(exc):
            say(
                "slotcron: configuration error: SCHEDULER_DATABASE_URL: the database refused us: "
                f"{describe(exc)}",
                file=sys.stderr,
            )
            return 2
        say(f"slotcron: database error: {describe(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
