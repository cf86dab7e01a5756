"""``slotcron trigger``, ``pause``, ``resume``, ``skip``, ``unskip`` and ``restart``: an
operator's requests, recorded in the database for whichever live instance takes them."""

from __future__ import annotations

import argparse
from typing import Any

from slotcron.cli.common import say, with_db
from slotcron.config import Settings
from slotcron.text import iso


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

    queued = with_db(settings, work)
    say(
        f"queued execution {queued.execution_id}: {queued.job} manual run "
        f"(slot {iso(queued.scheduled_at)})"
    )
    return 0


def cmd_pause(settings: Settings, args: argparse.Namespace) -> int:
    """``pause`` and ``resume``: which one is ``args.command``."""
    from slotcron.store import operations

    pausing = args.command == "pause"
    changed = with_db(
        settings,
        lambda db: operations.set_paused(
            db, job=args.job, paused=pausing, reason=getattr(args, "reason", None)
        ),
    )
    state = "paused" if pausing else "resumed"
    say(f"{args.job} {state}" if changed else f"{args.job} was already {state}")
    return 0


def cmd_skip(settings: Settings, args: argparse.Namespace) -> int:
    """``skip`` and ``unskip``: which one is ``args.command``."""
    from slotcron.store import skips

    if args.command == "unskip":
        with_db(settings, lambda db: skips.unskip(db, job=args.job, at=args.at))
        say(f"{args.job}: slot {iso(args.at)} is no longer skipped")
        return 0

    async def work(db: Any) -> Any:
        return await skips.skip(
            db, job=args.job, at=args.at, reason=args.reason, now=await db.now()
        )

    done = with_db(settings, work)
    again = "" if done.created else " (it already was: its reason is replaced)"
    say(f"{args.job}: slot {iso(done.at)} will be recorded SKIPPED{again}")
    return 0


def cmd_restart(settings: Settings, args: argparse.Namespace) -> int:
    from slotcron.store import operations

    async def work(db: Any) -> Any:
        return await operations.restart(db, execution_id=args.execution_id, now=await db.now())

    queued = with_db(settings, work)
    say(
        f"queued execution {queued.execution_id}: {queued.job} slot {iso(queued.scheduled_at)}, "
        f"attempt {queued.attempt} (restart)"
    )
    return 0
