"""Jobs for the claim-ahead tests: AHEAD_JOBS jobs due together every AHEAD_EVERY seconds, each
recording its start (with the real time) the moment its body runs."""

from __future__ import annotations

import os

from slotcron import JobContext, every

from tests.cluster.harness import record

N_JOBS = int(os.environ.get("AHEAD_JOBS", "200"))
EVERY = float(os.environ.get("AHEAD_EVERY", "5"))


def _make(i: int) -> None:
    @every(seconds=EVERY, name=f"ahead-{i:04d}")
    async def job(ctx: JobContext) -> None:
        record(
            "start",
            job=ctx.job,
            slot=ctx.scheduled_at.isoformat(),
            id=ctx.execution_id,
            attempt=ctx.attempt,
            trigger=ctx.trigger,
            instance=ctx.instance_id,
        )
        record("end", job=ctx.job, slot=ctx.scheduled_at.isoformat(), id=ctx.execution_id)


for _i in range(N_JOBS):
    _make(_i)
