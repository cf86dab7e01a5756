"""Jobs for the superseded-incarnation test (test_instance_id.py): two light jobs every second,
and one long run every second (``overlap="forbid"``: one at a time) that lasts until it is
fenced or stopped. Each records its ``start`` with the real clock; the long one records its
``stop`` and whether ``ctx.lease_lost`` was set then."""

from __future__ import annotations

import asyncio

from slotcron import JobContext, cron

from tests.cluster.harness import record


def _fields(ctx: JobContext) -> dict[str, object]:
    return {
        "job": ctx.job,
        "slot": ctx.scheduled_at.isoformat(),
        "instance": ctx.instance_id,
        "id": ctx.execution_id,
    }


def _light(i: int) -> None:
    @cron("* * * * * *", name=f"light-{i}")
    async def job(ctx: JobContext) -> None:
        record("start", **_fields(ctx))


for _i in range(2):
    _light(_i)


@cron("* * * * * *", name="long")
async def long(ctx: JobContext) -> None:
    record("start", **_fields(ctx))
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        record("stop", lease_lost=ctx.lease_lost.is_set(), **_fields(ctx))
        raise
