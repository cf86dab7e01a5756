"""The job APScheduler 4 runs in ``bench/aps_runtime.py``'s scheduler process: it only records
when it started.

Its persisted reference is ``bench.aps_runtime_jobs:record``. Each run appends ``(schedule id,
scheduled fire time, start)``; :func:`flush` writes them to ``APS_BENCH_OUT`` (once, at the end
of the process), one line ``<schedule id> <slot unix seconds> <start unix seconds>`` each.
"""

from __future__ import annotations

import atexit
import os
import time

from apscheduler import current_job

_records: list[tuple[str, float, float]] = []
_flushed = False


async def record() -> None:
    started = time.time()
    info = current_job.get()
    slot = info.scheduled_fire_time.timestamp() if info.scheduled_fire_time else float("nan")
    _records.append((info.schedule_id or "-", slot, started))


def flush() -> None:
    global _flushed
    path = os.environ.get("APS_BENCH_OUT")
    if _flushed or not path:
        return
    _flushed = True
    with open(path, "w") as out:
        out.writelines(f"{sid} {slot:.6f} {start:.6f}\n" for sid, slot, start in _records)


atexit.register(flush)
