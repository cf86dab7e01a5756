"""The ``slotcron`` command line's grammar: its commands, their arguments and argument types."""

from __future__ import annotations

import argparse
from datetime import datetime
from typing import Any

from slotcron.cli.backfills import add_parser as add_backfill_parser
from slotcron.cli.common import MAX_ID, MAX_NAME, Parser, bounded_int, instant, param, text
from slotcron.cli.schedules import add_parser as add_schedules_parser
from slotcron.filters import parse_since, parse_status
from slotcron.version import __version__

MAX_HISTORY_LIMIT = 10_000
MAX_REASON = 400  # as the jobs table's paused_reason

_job = text("job name", MAX_NAME)


def _since(value: str) -> datetime:
    try:
        return parse_since(text("--since", 100)(value))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--since {exc}") from None


def _status(value: str) -> str:
    try:
        return parse_status(text("--status", 20)(value))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="slotcron", description="Cluster cron: every slot runs exactly once.")
    parser.add_argument("--version", action="version", version=f"slotcron {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    commands.required = True
    _add_service_commands(commands)
    _add_read_commands(commands)
    _add_operation_commands(commands)
    add_schedules_parser(commands)
    add_backfill_parser(commands)
    return parser


def _add_service_commands(commands: Any) -> None:
    """``run``, ``migrate`` and ``check``: what a deployment runs."""
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


def _add_read_commands(commands: Any) -> None:
    """``history``, ``instances`` and ``jobs``: what the database knows."""
    history = commands.add_parser("history", help="executions, newest first")
    history.add_argument("job", nargs="?", metavar="JOB", type=_job)
    history.add_argument("--status", type=_status)
    history.add_argument(
        "--since",
        type=_since,
        metavar="WHEN",
        help="ISO-8601 time, or a duration back from now: 30m, 2h, 7d",
    )
    history.add_argument("--limit", type=bounded_int(MAX_HISTORY_LIMIT), default=50)
    history.add_argument("--json", action="store_true", help="print one JSON array")

    inst = commands.add_parser("instances", help="instances, heartbeats, state, leader")
    inst.add_argument("--json", action="store_true", help="print one JSON array")

    jobs_ = commands.add_parser("jobs", help="jobs known to the database")
    jobs_.add_argument("--json", action="store_true", help="print one JSON array")


def _add_operation_commands(commands: Any) -> None:
    """``trigger``, ``pause``, ``resume``, ``skip``, ``unskip`` and ``restart``: what an operator
    asks of the cluster."""
    trig = commands.add_parser("trigger", help="queue a manual run now, for any live instance")
    trig.add_argument("job", metavar="JOB", type=_job)
    trig.add_argument(
        "--param",
        action="append",
        default=[],
        type=param,
        metavar="K=V",
        help="a parameter for ctx.params (repeatable)",
    )

    for verb, explained in (
        ("pause", "record the job's slots SKIPPED until resumed"),
        ("resume", "run the job's slots again"),
        ("skip", "record one upcoming slot SKIPPED before it comes"),
        ("unskip", "take back a skip before its slot comes"),
    ):
        sub = commands.add_parser(verb, help=explained)
        sub.add_argument("job", metavar="JOB", type=_job)
        if verb in ("skip", "unskip"):
            sub.add_argument(
                "--at", required=True, type=instant("--at"), metavar="TIME", help="the slot"
            )
        if verb in ("pause", "skip"):
            sub.add_argument(
                "--reason",
                type=text("--reason", MAX_REASON),
                help=f"recorded with each skipped slot (at most {MAX_REASON} characters)",
            )

    restart = commands.add_parser(
        "restart", help="run a FAILED, STOPPED or ABANDONED slot again, with its saved state"
    )
    restart.add_argument("execution_id", type=bounded_int(MAX_ID), metavar="EXECUTION_ID")
