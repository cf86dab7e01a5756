"""Jobs for the shutdown tests. SLEEP_SECONDS sets how long a run lasts."""

from __future__ import annotations

import asyncio
import os

from slotcron import JobContext, every

from tests.cluster.harness import record

SLEEP = float(os.environ.get("SLEEP_SECONDS", "30"))


@every(seconds=1, name="sleeper")
async def sleeper(ctx: JobContext) -> None:
    record("start", job=ctx.job, slot=ctx.scheduled_at.isoformat(), id=ctx.execution_id)
    await ctx.checkpoint(progress="started")
    try:
        await asyncio.sleep(SLEEP)
    except asyncio.CancelledError:
        record("cancelled", job=ctx.job, slot=ctx.scheduled_at.isoformat(), id=ctx.execution_id)
        if os.environ.get("IGNORE_CANCEL"):
            await asyncio.sleep(3600)  # a badly behaved job: swallows the cancellation
        raise
    record("end", job=ctx.job, slot=ctx.scheduled_at.isoformat(), id=ctx.execution_id)
