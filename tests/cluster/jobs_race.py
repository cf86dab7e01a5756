"""Ten jobs due every second, for racing instances. Each run records itself."""

from __future__ import annotations

import asyncio
import random

from slotcron import JobContext, cron

from tests.cluster.harness import record


def _make(i: int) -> None:
    @cron("* * * * * *", name=f"race-{i}")
    async def job(ctx: JobContext) -> None:
        record(
            "start",
            job=ctx.job,
            slot=ctx.scheduled_at.isoformat(),
            instance=ctx.instance_id,
            id=ctx.execution_id,
        )
        await asyncio.sleep(random.uniform(0, 0.3))


for _i in range(10):
    _make(_i)
