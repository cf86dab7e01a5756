"""``slotcron history``, ``instances`` and ``jobs``: what the database knows, as a table or JSON."""

from __future__ import annotations

import argparse
from typing import Any

from slotcron.cli.common import print_table, say, say_json, with_db
from slotcron.config import Settings
from slotcron.records import execution_json, instance_json, job_json
from slotcron.text import iso

INSTANCE_COLUMNS = (
    "INSTANCE",
    "HOST",
    "PID",
    "VERSION",
    "STATE",
    "LEADER",
    "STARTED (UTC)",
    "HEARTBEAT (UTC)",
)


def cmd_history(settings: Settings, args: argparse.Namespace) -> int:
    from slotcron.store.history import list_executions

    async def work(db: Any) -> list[Any]:
        return await list_executions(
            db, job=args.job, status=args.status, since=args.since, limit=args.limit
        )

    records = with_db(settings, work)
    if args.json:
        say_json([execution_json(r) for r in records])
        return 0
    header = ("ID", "JOB", "SLOT (UTC)", "TRIGGER", "STATUS", "TRY", "INSTANCE", "TOOK", "ERROR")
    print_table(header, [_history_row(r) for r in records])
    if not records:
        say("no executions match")
    return 0


def _history_row(r: Any) -> tuple[str, ...]:
    took = f"{r.duration_ms / 1000:.2f}s" if r.duration_ms is not None else ""
    # "\n" only: splitlines() would also split at a "\r" or "\x1c" a job wrote, and show
    # what follows it as if it were the whole message.
    first_error = (r.error or "").strip().split("\n")
    return (
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


def cmd_instances(settings: Settings, args: argparse.Namespace) -> int:
    from slotcron.store.registrations import list_instances

    records = with_db(settings, list_instances)
    if args.json:
        say_json([instance_json(r) for r in records])
        return 0
    print_table(
        INSTANCE_COLUMNS,
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


def cmd_jobs(settings: Settings, args: argparse.Namespace) -> int:
    from slotcron.store.operations import list_jobs

    async def work(db: Any) -> Any:
        return await list_jobs(db, now=await db.now(), live_within=settings.lease_seconds)

    records = with_db(settings, work)
    if args.json:
        say_json([job_json(r) for r in records])
        return 0
    print_table(
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
        [_job_row(r) for r in records],
    )
    if not records:
        say("no jobs are known to the database yet")
    return 0


def _job_row(r: Any) -> tuple[str, ...]:
    return (
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
