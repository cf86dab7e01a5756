"""``slotcron schedules add|list|show|update|remove``: runtime schedules from the command line.

Checks are :mod:`slotcron.jobs.schedules`' (exit 2 naming the field, nothing written); updating or
removing a ``@cron``/``@every`` job is refused (exit 1). ``add`` imports the modules of
``SCHEDULER_JOBS``, as ``run`` and ``check`` do, so a task of this code base is known before any
instance recorded it; a task no instance recorded and no imported module registers is unknown.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from slotcron.cli.common import (
    MAX_NAME,
    bounded_int,
    import_jobs,
    param,
    print_table,
    say,
    say_json,
    text,
    with_db,
)
from slotcron.config import Settings
from slotcron.errors import InvalidJobError
from slotcron.jobs.schedules import ScheduleRecord, next_slots, schedule_json
from slotcron.store.database import Database
from slotcron.text import iso

MAX_LIST = 10_000
MAX_PARAMS_JSON = 64 * 1024
SHOWN_SLOTS = 5


def add_parser(commands: Any) -> None:
    """Add the ``schedules`` group to the top-level subcommands."""
    group = commands.add_parser("schedules", help="runtime schedules of @task tasks")
    verbs = group.add_subparsers(dest="verb", metavar="VERB", parser_class=type(group))
    verbs.required = True
    schedule_id = text("schedule id", MAX_NAME)

    add = verbs.add_parser("add", help="create a schedule; prints its id")
    add.add_argument("task", metavar="TASK", type=text("task", MAX_NAME))
    _timing(add, required=True)
    _changes(add)
    add.add_argument("--id", type=schedule_id, help="default: <task>/<12 hex digits>")
    add.add_argument("--paused", action="store_true", help="create it paused")
    add.add_argument("--json", action="store_true", help="print the schedule as JSON")

    listing = verbs.add_parser("list", help="schedules, ordered by id")
    listing.add_argument("--task", type=text("--task", MAX_NAME))
    listing.add_argument("--limit", type=bounded_int(MAX_LIST), default=100)
    listing.add_argument("--json", action="store_true", help="print one JSON array")

    show = verbs.add_parser("show", help=f"one schedule with its next {SHOWN_SLOTS} slots")
    show.add_argument("id", metavar="ID", type=schedule_id)
    show.add_argument("--json", action="store_true", help="print one JSON object")

    change = verbs.add_parser("update", help="change a schedule from its next slot")
    change.add_argument("id", metavar="ID", type=schedule_id)
    _timing(change, required=False)
    _changes(change)
    change.add_argument("--json", action="store_true", help="print the schedule as JSON")

    remove = verbs.add_parser("remove", help="delete a schedule; no further slot runs")
    remove.add_argument("id", metavar="ID", type=schedule_id)


def _timing(parser: argparse.ArgumentParser, *, required: bool) -> None:
    timing = parser.add_mutually_exclusive_group(required=required)
    timing.add_argument("--cron", metavar="EXPR", type=text("--cron", MAX_NAME))
    timing.add_argument("--every", metavar="SECONDS", type=_number("--every"))


def _changes(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--timezone", metavar="TZ", type=text("--timezone", 64))
    parser.add_argument(
        "--param",
        action="append",
        default=[],
        type=param,
        metavar="K=V",
        help="a parameter for ctx.params (repeatable; over --params-json)",
    )
    parser.add_argument(
        "--params-json",
        metavar="JSON",
        type=text("--params-json", MAX_PARAMS_JSON),
        help="the parameters as one JSON object",
    )
    parser.add_argument("--jitter", metavar="S", type=_number("--jitter"))
    parser.add_argument(
        "--calendar",
        metavar="holidays:CC[-SUB]",
        type=text("--calendar", 64),
        help="skip the public holidays of a country (or subdivision)",
    )
    parser.add_argument(
        "--exclude-date",
        dest="exclude_dates",
        action="append",
        default=None,
        metavar="YYYY-MM-DD",
        type=text("--exclude-date", 10),
        help="a day to skip (repeatable)",
    )
    parser.add_argument("--start-at", metavar="TIME", type=text("--start-at", 64))
    parser.add_argument("--end-at", metavar="TIME", type=text("--end-at", 64))
    parser.add_argument("--max-runs", metavar="N", type=bounded_int(10**9))  # fmt: skip


def _number(what: str) -> Any:
    def parse(value: str) -> float:
        try:
            return float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what}: expected seconds, got {value!r}") from None

    return parse


def _params(args: argparse.Namespace, who: str) -> dict[str, Any] | None:
    """``--params-json`` with each ``--param`` over it; None when neither was given."""
    if args.params_json is None and not args.param:
        return None
    params: Any = {}
    if args.params_json is not None:
        try:
            params = json.loads(args.params_json)
        except ValueError as exc:
            raise InvalidJobError(who, "params", f"--params-json is not JSON: {exc}") from None
        if not isinstance(params, dict):
            raise InvalidJobError(
                who, "params", f"--params-json must be a JSON object, got {type(params).__name__}"
            )
    merged: dict[str, Any] = {**params, **dict(args.param)}
    return merged


def _given(args: argparse.Namespace, who: str) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "cron": args.cron,
        "every": args.every,
        "timezone": args.timezone,
        "jitter": args.jitter,
        "params": _params(args, who),
        "calendar": args.calendar,
        "exclude_dates": args.exclude_dates,
        "start_at": args.start_at,
        "end_at": args.end_at,
        "max_runs": args.max_runs,
    }
    return {k: v for k, v in fields.items() if v is not None}


def cmd_schedules(settings: Settings, args: argparse.Namespace) -> int:
    return {
        "add": _add,
        "list": _list,
        "show": _show,
        "update": _update,
        "remove": _remove,
    }[args.verb](settings, args)


def _add(settings: Settings, args: argparse.Namespace) -> int:
    from slotcron.store import schedules as store

    import_jobs(settings.jobs)  # the tasks of this code base are known before any instance ran
    item = {"task": args.task, **_given(args, args.id or args.task), "paused": args.paused}
    if args.id is not None:
        item["id"] = args.id

    async def work(db: Database) -> list[ScheduleRecord]:
        return await store.create(db, [item], default_timezone=settings.timezone, by="cli")

    record = with_db(settings, work)[0]
    if args.json:
        say_json(schedule_json(record))
    else:
        say(record.spec.id)
    return 0


def _list(settings: Settings, args: argparse.Namespace) -> int:
    from slotcron.store import schedules as store

    async def work(db: Database) -> list[ScheduleRecord]:
        return await store.list_schedules(db, task=args.task, limit=args.limit)

    records: list[ScheduleRecord] = with_db(settings, work)
    if args.json:
        say_json([schedule_json(r) for r in records])
        return 0
    print_table(
        ("ID", "TASK", "SCHEDULE", "TIMEZONE", "NEXT SLOT (UTC)", "PAUSED", "PARAMS"),
        [
            (
                r.spec.id,
                r.spec.task,
                _describe(r),
                r.spec.timezone,
                iso(r.next_slot) or "",
                "paused" if r.spec.paused else "",
                json.dumps(r.spec.params),
            )
            for r in records
        ],
    )
    if not records:
        say("no schedules match")
    return 0


def _describe(record: ScheduleRecord) -> str:
    return record.spec.schedule().describe()


def _show(settings: Settings, args: argparse.Namespace) -> int:
    from slotcron.store import due
    from slotcron.store import schedules as store

    async def work(db: Database) -> tuple[ScheduleRecord, bool]:
        record = await store.get(db, args.id)
        return record, await due.task_is_live(db, record.spec.task, lapse=settings.lease_seconds)

    record, live = with_db(settings, work)
    slots = [iso(s) for s in next_slots(record, SHOWN_SLOTS)]
    if args.json:
        shown = {**schedule_json(record), "next_slots": slots, "task_live": live}
        say_json(shown)
        return 0
    shown = schedule_json(record)
    for key in ("id", "task", "cron", "every", "timezone", "jitter", "paused", "created_at"):
        if shown[key] is not None:
            say(f"{key}: {shown[key]}")
    say(f"params: {json.dumps(record.spec.params)}")
    if not live:
        say(
            "task_live: no (no live instance registers this task: its slots wait, and are "
            "decided by its misfire policy once one starts)"
        )
    say(f"next {SHOWN_SLOTS} slots (UTC):")
    for slot in slots:
        say(f"  {slot}")
    return 0


def _update(settings: Settings, args: argparse.Namespace) -> int:
    from slotcron.store import schedules as store

    changes = _given(args, args.id)

    async def work(db: Database) -> ScheduleRecord:
        return await store.update(db, args.id, changes, now=await db.now(), by="cli")

    record: ScheduleRecord = with_db(settings, work)
    if args.json:
        say_json(schedule_json(record))
    else:
        say(f"updated {record.spec.id}: next slot {iso(record.next_slot)}")
    return 0


def _remove(settings: Settings, args: argparse.Namespace) -> int:
    from slotcron.store import schedules as store

    async def work(db: Database) -> None:
        await store.remove(db, args.id, now=await db.now())

    with_db(settings, work)
    say(f"removed {args.id}")
    return 0
