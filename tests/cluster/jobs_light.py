"""Two light jobs due every second: enough to keep instances claiming while a test watches
something else (leadership)."""

from __future__ import annotations

from slotcron import JobContext, cron

from tests.cluster.harness import record


def _make(i: int) -> None:
    @cron("* * * * * *", name=f"light-{i}")
    async def job(ctx: JobContext) -> None:
        record("start", job=ctx.job, slot=ctx.scheduled_at.isoformat(), instance=ctx.instance_id)


for _i in range(2):
    _make(_i)
