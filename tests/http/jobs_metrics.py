"""For the /metrics load test: a one-second job that records when each slot started, and a task
whose ten thousand runtime schedules run once beside it."""

from __future__ import annotations

from slotcron import JobContext, every, task

from tests.cluster.harness import record

TICK = "metrics.tick"
TASK = "metrics.tenant"


@every(seconds=1, name=TICK)
async def tick(ctx: JobContext) -> None:
    record("start", job=ctx.job, slot=ctx.scheduled_at.isoformat(), id=ctx.execution_id)


@task(name=TASK)
async def tenant(ctx: JobContext) -> None:
    pass
