"""A one-second job for the admin-plane load test: it records when each slot started."""

from __future__ import annotations

from slotcron import JobContext, every

from tests.cluster.harness import record


@every(seconds=1, name="load.tick")
async def tick(ctx: JobContext) -> None:
    record("start", job=ctx.job, slot=ctx.scheduled_at.isoformat(), id=ctx.execution_id)
