"""The command line: ``slotcron`` (identical to ``python -m slotcron``).

Exit status: 0 done, 1 refused (or the database could not be reached), 2 bad usage or
configuration. Errors are one line on stderr; no password ever appears. The commands live beside
this module by what they do (:mod:`.reads`, :mod:`.operations`, :mod:`.schedules`), their grammar
in :mod:`.parser`, what they share in :mod:`.common`.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta

from slotcron.cli.backfills import cmd_backfill
from slotcron.cli.common import import_jobs, run_async, say
from slotcron.cli.operations import cmd_pause, cmd_restart, cmd_skip, cmd_trigger
from slotcron.cli.parser import build_parser
from slotcron.cli.reads import cmd_history, cmd_instances, cmd_jobs
from slotcron.cli.schedules import cmd_schedules
from slotcron.config import Settings, load_settings
from slotcron.errors import ConfigError, InvalidJobError, Refused, UsageError
from slotcron.jobs.calendars import excluded
from slotcron.jobs.registry import Job
from slotcron.lifeline.outage import DB_ERRORS, describe, refused_login
from slotcron.observe import logs
from slotcron.schedule.slots import NEVER, Schedule, day_rule, normalise_cron
from slotcron.text import iso

__all__ = ["COMMANDS", "build_parser", "import_jobs", "main"]


def _runner() -> asyncio.Runner:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency except on Windows
        return asyncio.Runner()
    return asyncio.Runner(loop_factory=uvloop.new_event_loop)


def cmd_run(settings: Settings, args: argparse.Namespace) -> int:
    """The embeddable :class:`~slotcron.Scheduler` as the process's own: signals, the
    collector's tuning and waiting out the database (:meth:`Scheduler.run`), HTTP as the
    environment configures it, logging as :func:`main` set it up."""
    from slotcron.service.scheduler import Scheduler

    # The CLI's own import first: a job module's error is one line naming file and line.
    jobs = import_jobs([*settings.jobs, *args.jobs])
    if not jobs:
        logging.getLogger("slotcron").warning(
            "no jobs registered: pass --jobs MODULE or set SCHEDULER_JOBS"
        )
    scheduler = Scheduler.from_settings(settings, jobs=args.jobs)
    with _runner() as runner:
        clean = runner.run(scheduler.run())
        if not clean:
            # A job swallowed its cancellation; it is recorded STOPPED. Leaving the runner
            # would await it forever, so leave the process instead.
            logging.getLogger("slotcron").warning("exiting with runs that ignored cancellation")
            logging.shutdown()
            sys.stdout.flush()
            os._exit(scheduler.exit_status)
    return scheduler.exit_status  # 1: another process took our instance id over


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

    before, after = run_async(go())
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
        for slot in _next_slots(job, schedule, now, job.timezone or settings.timezone):
            say(f"  {iso(slot)}")
    return 0


CHECK_SLOTS = 5
CHECK_AHEAD = timedelta(days=400)
CHECK_SCAN = 20_000
"""How far ahead, and through how many slots, ``check`` looks for the next :data:`CHECK_SLOTS`
slots a job's calendar lets run."""


def _next_slots(job: Job, schedule: Schedule, now: datetime, zone: str) -> list[datetime]:
    """The job's next slots that run: those its calendar or excluded dates skip are left out."""
    found: list[datetime] = []
    slot = schedule.next_after(now)
    for _ in range(CHECK_SCAN):
        if len(found) == CHECK_SLOTS or slot > now + CHECK_AHEAD or slot >= NEVER:
            break
        if excluded(job, slot, zone) is None:
            found.append(slot)
        slot = schedule.next_after(slot)
    if slot >= NEVER:
        say(f"  (its window ends after {len(found)} more slots)")
    elif len(found) < CHECK_SLOTS:
        say(f"  (its calendar leaves {len(found)} of its next slots to run, up to {iso(slot)})")
    return found


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
    "skip": cmd_skip,
    "unskip": cmd_skip,
    "restart": cmd_restart,
    "schedules": cmd_schedules,
    "backfill": cmd_backfill,
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
