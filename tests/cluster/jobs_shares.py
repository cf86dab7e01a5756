"""Many light jobs due every second (``SHARES_JOBS``, default 1,000), each recording its start
with the instance it ran on: the load under which members join, leave, die and pause. Their
runs may overlap (``overlap="allow"``): a run in flight on a paused instance holds a ``forbid``
job's next slots by design (recorded SKIPPED until its lease lapses), which is not what this
load is for."""

from __future__ import annotations

import os

from slotcron import JobContext, cron

from tests.cluster.harness import record


def _make(i: int) -> None:
    @cron("* * * * * *", name=f"shares-{i}", overlap="allow")
    async def job(ctx: JobContext) -> None:
        record("start", job=ctx.job, slot=ctx.scheduled_at.isoformat(), instance=ctx.instance_id)


for _i in range(int(os.environ.get("SHARES_JOBS", "1000"))):
    _make(_i)
