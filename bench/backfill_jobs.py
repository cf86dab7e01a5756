"""The job ``python -m bench.backfill`` backfills: every second, overlap allowed, recording each
start (slot, trigger, start) in memory and to ``BENCH_FILL_OUT`` when the process exits."""

from __future__ import annotations

import atexit
import os
import time

from slotcron import JobContext, every

_starts: list[tuple[float, str, float]] = []


def _write() -> None:
    path = os.environ.get("BENCH_FILL_OUT")
    if path:
        with open(path, "w") as out:
            out.writelines(f"{slot!r} {trigger} {start!r}\n" for slot, trigger, start in _starts)


atexit.register(_write)


@every(seconds=1, name="bench.filled", overlap="allow")
async def filled(ctx: JobContext) -> None:
    _starts.append((ctx.scheduled_at.timestamp(), ctx.trigger, time.time()))
