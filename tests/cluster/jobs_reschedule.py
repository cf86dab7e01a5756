"""Five jobs whose schedule is the version's: ``@every(seconds=RESCHEDULE_EVERY)``, for the
blue/green test that changes a schedule (blue every 2 s, green every 3 s).

Each run records its start (job, slot, instance, execution id, the period it was declared
with): what the jobs record, not what the scheduler's tables say.
"""

from __future__ import annotations

import asyncio
import os

from slotcron import JobContext, every

from tests.cluster.harness import record

N_JOBS = 5
EVERY = float(os.environ.get("RESCHEDULE_EVERY", "2"))


def _make(i: int) -> None:
    @every(seconds=EVERY, name=f"rescheduled-{i}")
    async def job(ctx: JobContext) -> None:
        record(
            "start",
            job=ctx.job,
            slot=ctx.scheduled_at.isoformat(),
            instance=ctx.instance_id,
            id=ctx.execution_id,
            every=EVERY,
        )
        await asyncio.sleep(0.05)


for _i in range(N_JOBS):
    _make(_i)
