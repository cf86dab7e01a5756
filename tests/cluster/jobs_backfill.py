"""A job a backfill fills in while it runs live: each body records its start and its end with the
real clock (tests/cluster/test_backfill.py)."""

from __future__ import annotations

import asyncio

from slotcron import JobContext, every

from tests.cluster.harness import record

JOB = "bf.cluster"


@every(seconds=1, name=JOB, overlap="allow")
async def filled(ctx: JobContext) -> None:
    slot = ctx.scheduled_at.isoformat()
    record("start", slot=slot, trigger=ctx.trigger, instance=ctx.instance_id)
    await asyncio.sleep(0.3)
    record("end", slot=slot, trigger=ctx.trigger, instance=ctx.instance_id)
