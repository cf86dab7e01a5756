"""The runtime-schedule benchmark's task: it only records when it starts.

Loaded by real ``slotcron run --jobs bench.runtime_jobs`` processes that ``bench/runtime.py``
starts; each start ``(schedule id, slot, start)`` is written to ``BENCH_OUT`` at exit.
"""

from __future__ import annotations

import atexit
import os
import time

from slotcron import JobContext, task

TASK = "bench.runtime"
_starts: list[tuple[str, float, float]] = []


def _write() -> None:
    path = os.environ.get("BENCH_OUT")
    if not path:
        return
    with open(path, "w") as out:
        out.writelines(f"{job} {slot!r} {start!r}\n" for job, slot, start in _starts)


atexit.register(_write)


@task(name=TASK)
async def record(ctx: JobContext) -> None:
    _starts.append((ctx.job, ctx.scheduled_at.timestamp(), time.time()))
