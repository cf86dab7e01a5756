"""Jobs for the real-process tests of tests/http: one that completes, one that fails."""

from __future__ import annotations

from slotcron import JobContext, every

from tests.cluster.harness import record


@every(seconds=1, name="http.ok")
async def ok(ctx: JobContext) -> None:
    record("end", job=ctx.job, slot=ctx.scheduled_at.isoformat(), id=ctx.execution_id)


@every(seconds=1, name="http.broken")
async def broken(ctx: JobContext) -> None:
    record("fail", job=ctx.job, slot=ctx.scheduled_at.isoformat(), id=ctx.execution_id)
    raise RuntimeError("broken on purpose")
