"""A task whose schedules the runtime cluster test adds, updates and removes while they fire."""

from __future__ import annotations

from slotcron import JobContext, task

from tests.cluster.harness import record

TASK = "cluster.tick"


@task(name=TASK)
async def tick(ctx: JobContext) -> None:
    record(
        "start",
        id=ctx.execution_id,
        job=ctx.job,
        slot=ctx.scheduled_at.isoformat(),
        instance=ctx.instance_id,
        params=ctx.params,
        trigger=ctx.trigger,
    )
