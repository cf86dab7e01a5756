"""The benchmark's jobs: ``BENCH_JOBS`` copies of one cron job that only record when they start.

Loaded by real ``slotcron run --jobs bench.jobs`` processes that ``bench/run.py`` starts. Each
start is kept in memory as ``(job index, slot, start)`` and written to ``BENCH_OUT`` (one file
per process) when the process exits, so recording costs the run nothing but a list append.
"""

from __future__ import annotations

import atexit
import os
import time

from slotcron import JobContext, cron

_starts: list[tuple[int, float, float]] = []


def _write() -> None:
    path = os.environ.get("BENCH_OUT")
    if not path:
        return
    with open(path, "w") as out:
        out.writelines(f"{i} {slot!r} {start!r}\n" for i, slot, start in _starts)


atexit.register(_write)


def _make(index: int, expression: str) -> None:
    record = _starts.append

    @cron(expression, name=f"bench-{index}")
    async def job(ctx: JobContext) -> None:
        record((index, ctx.scheduled_at.timestamp(), time.time()))


for _i in range(int(os.environ.get("BENCH_JOBS", "0"))):
    _make(_i, os.environ["BENCH_CRON"])
