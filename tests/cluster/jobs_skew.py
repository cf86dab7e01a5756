"""Five jobs due every second, for instances whose clocks are wrong (libfaketime).

Each run first creates an empty file in SLOTCRON_TEST_MARKS: the kernel stamps its mtime with
the machine's real clock, which libfaketime cannot fake (it fakes what this process is told,
not what the kernel writes), so the test, reading the stamp from an honest process, learns
when the run really started. The record's ``wall`` is this process's (faked) time.time().
"""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path

from slotcron import JobContext, cron

from tests.cluster.harness import record

N_JOBS = 5


def _make(i: int) -> None:
    @cron("* * * * * *", name=f"skew-{i}")
    async def job(ctx: JobContext) -> None:
        mark = f"{ctx.job}@{ctx.scheduled_at.timestamp():.0f}@{ctx.instance_id}"
        fd = os.open(Path(os.environ["SLOTCRON_TEST_MARKS"]) / mark, os.O_CREAT | os.O_EXCL)
        os.close(fd)
        record(
            "start",
            job=ctx.job,
            slot=ctx.scheduled_at.isoformat(),
            instance=ctx.instance_id,
            mark=mark,
        )
        await asyncio.sleep(random.uniform(0.05, 0.3))


for _i in range(N_JOBS):
    _make(_i)
