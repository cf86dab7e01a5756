"""For the database outage test: eight short jobs due every second, and ``long``, due every
second too but running 3 s (overlap forbidden), so one of its runs is always in flight.

Each run records its start and its end (job, slot, instance, execution id, wall time)."""

from __future__ import annotations

import asyncio
import random

from slotcron import JobContext, cron

from tests.cluster.harness import record


async def _run(ctx: JobContext, seconds: float) -> None:
    fields = dict(
        job=ctx.job,
        slot=ctx.scheduled_at.isoformat(),
        instance=ctx.instance_id,
        id=ctx.execution_id,
    )
    record("start", **fields)
    await asyncio.sleep(seconds)
    record("end", **fields)


def _make(i: int) -> None:
    @cron("* * * * * *", name=f"short-{i}")
    async def job(ctx: JobContext) -> None:
        await _run(ctx, random.uniform(0.05, 0.4))


for _i in range(8):
    _make(_i)


@cron("* * * * * *", name="long")
async def long(ctx: JobContext) -> None:
    await _run(ctx, 3.0)
