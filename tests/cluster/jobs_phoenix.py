"""For an instance killed and restarted under the same instance id: a run that outlives the
kill (``sleeper``) and one that keeps the restarted instance holding leases (``busy``)."""

from __future__ import annotations

import asyncio

from slotcron import JobContext, every

from tests.cluster.harness import record


@every(seconds=1, name="sleeper")
async def sleeper(ctx: JobContext) -> None:
    record("start", job=ctx.job, slot=ctx.scheduled_at.isoformat(), id=ctx.execution_id)
    await asyncio.sleep(60)


@every(seconds=1, name="busy", overlap="allow")
async def busy(ctx: JobContext) -> None:
    await asyncio.sleep(1.5)
