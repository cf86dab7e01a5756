"""``slotcron backfill JOB --from T1 --to T2 [--rate N] [--dry-run]``, ``backfill list`` and
``backfill cancel ID`` (:mod:`slotcron.store.backfills`): bad input exits 2 naming it and writes
nothing; a paused job, or a backfill already ended, is refused (exit 1)."""

from __future__ import annotations

import argparse
from typing import Any

from slotcron.cli.common import (
    MAX_ID,
    bounded_int,
    instant,
    print_table,
    say,
    say_json,
    text,
    with_db,
)
from slotcron.config import Settings
from slotcron.errors import UsageError
from slotcron.store.backfills import check_rate

VERBS = ("list", "cancel")
"""``backfill list`` and ``backfill cancel ID``: a job of either name is backfilled as
``backfill --job NAME``."""


def _rate(value: str) -> float:
    try:
        rate = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--rate must be a number, got {value[:50]!r}") from None
    try:
        return check_rate(rate)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_parser(commands: Any) -> None:
    sub = commands.add_parser(
        "backfill",
        help="run a range of a job's slots that never completed; `backfill list`, "
        "`backfill cancel ID`",
    )
    sub.add_argument("target", metavar="JOB|list|cancel", type=text("job name", 200))
    sub.add_argument("id", nargs="?", metavar="ID", type=bounded_int(MAX_ID))
    sub.add_argument("--job", type=text("--job", 200), help="the job (when named list/cancel)")
    sub.add_argument("--from", dest="start", type=instant("--from"), metavar="T1")
    sub.add_argument("--to", dest="end", type=instant("--to"), metavar="T2")
    sub.add_argument(
        "--rate", type=_rate, metavar="N", help="starts a second at most (default 10; 0: no cap)"
    )
    sub.add_argument("--dry-run", action="store_true", help="list the slots it would run")
    sub.add_argument("--json", action="store_true", help="print JSON")


def cmd_backfill(settings: Settings, args: argparse.Namespace) -> int:
    if args.target in VERBS and args.job is None:
        if args.start or args.end or args.rate is not None or args.dry_run:
            raise UsageError(f"backfill {args.target} takes no --from, --to, --rate, --dry-run")
        return _list(settings, args) if args.target == "list" else _cancel(settings, args)
    if args.id is not None:
        raise UsageError(f"backfill {args.target}: unexpected argument {args.id}")
    job = args.job or args.target
    if args.start is None or args.end is None:
        raise UsageError("backfill JOB needs --from T1 and --to T2 (ISO-8601 times)")
    from slotcron.store import backfills

    backfills.check_request(args.start, args.end, args.rate)  # bad input: exit 2, no database

    async def work(db: Any) -> dict[str, Any]:
        return await backfills.request(
            db,
            job=job,
            start=args.start,
            end=args.end,
            rate=args.rate,
            dry_run=args.dry_run,
            now=await db.now(),
            retention_days=settings.history_retention_days,
        )

    answer = with_db(settings, work)
    if args.json:
        say_json(answer)
    elif args.dry_run:
        for slot in answer["slots"]:
            say(slot)
        say(f"{answer['count']} slots of {job} would run")
    else:
        say(
            f"backfill {answer['id']}: {job}, {answer['slots']} slots from {answer['from']} "
            f"to {answer['to']} at {_shown_rate(answer['rate'])}"
        )
    return 0


def _shown_rate(rate: float) -> str:
    return "capacity's pace" if rate == 0 else f"at most {rate:g} starts a second"


def _list(settings: Settings, args: argparse.Namespace) -> int:
    from slotcron.store import backfills

    found = [b.as_dict() for b in with_db(settings, backfills.listing)]
    if args.json:
        say_json(found)
        return 0
    header = ("ID", "JOB", "FROM", "TO", "STATUS", "SLOTS", "DONE", "FAILED", "LEFT", "NOTE")
    rows = [
        (
            str(b["id"]), b["job"], b["from"], b["to"], b["status"], str(b["slots"]),
            str(b["done"]), str(b["failed"]), str(b["left"]), b["note"] or "",
        )
        for b in found
    ]  # fmt: skip
    print_table(header, rows)
    if not found:
        say("no backfills")
    return 0


def _cancel(settings: Settings, args: argparse.Namespace) -> int:
    from slotcron.store import backfills

    if args.id is None:
        raise UsageError("backfill cancel needs the backfill's ID (see `slotcron backfill list`)")

    async def work(db: Any) -> int:
        return await backfills.cancel(db, args.id, now=await db.now())

    settled = with_db(settings, work)
    say(f"backfill {args.id} cancelled; {settled} queued runs recorded SKIPPED")
    return 0
