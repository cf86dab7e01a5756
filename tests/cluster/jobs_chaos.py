"""Twenty jobs due every second, for the crash and outage tests.

Each run records its start and its end (job, slot, instance, execution id, wall time): a run
that recorded a start and no end was cut short (its process was killed).
RUN_SECONDS_MAX (default 0.6) bounds how long a run sleeps.
"""

from __future__ import annotations

import asyncio
import os
import random

from slotcron import JobContext, cron

from tests.cluster.harness import record

N_JOBS = 20
RUN_MAX = float(os.environ.get("RUN_SECONDS_MAX", "0.6"))


def _make(i: int) -> None:
    @cron("* * * * * *", name=f"chaos-{i}")
    async def job(ctx: JobContext) -> None:
        fields = dict(
            job=ctx.job,
            slot=ctx.scheduled_at.isoformat(),
            instance=ctx.instance_id,
            id=ctx.execution_id,
            attempt=ctx.attempt,
            trigger=ctx.trigger,
        )
        record("start", **fields)
        await asyncio.sleep(random.uniform(0.05, RUN_MAX))
        record("end", **fields)


for _i in range(N_JOBS):
    _make(_i)
