"""Ten jobs failing every second, and one that fails quietly (``alert=False``), for the alert
webhook's cluster test. Each run records itself before it fails."""

from __future__ import annotations

from slotcron import JobContext, cron

from tests.cluster.harness import record


def _make(i: int) -> None:
    @cron("* * * * * *", name=f"alerting-{i}")
    async def job(ctx: JobContext) -> None:
        record("fail", job=ctx.job, slot=ctx.scheduled_at.isoformat(), instance=ctx.instance_id)
        raise RuntimeError(f"alerting-{i} fails on purpose")


for _i in range(10):
    _make(_i)


@cron("* * * * * *", name="quiet", alert=False)
async def quiet(ctx: JobContext) -> None:
    record("fail", job=ctx.job, slot=ctx.scheduled_at.isoformat(), instance=ctx.instance_id)
    raise RuntimeError("quiet fails on purpose, and asked for no alert")
