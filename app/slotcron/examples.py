"""Example jobs, so the first run shows slots firing within seconds.

slotcron run --jobs slotcron.examples
"""

from __future__ import annotations

import asyncio
import random

from slotcron import JobContext, cron, every


@every(seconds=5, name="examples.heartbeat")
async def heartbeat(ctx: JobContext) -> None:
    """Fixed rate, slots aligned to the epoch: :00, :05, :10 ..."""
    ctx.logger.info("heartbeat for slot %s", ctx.scheduled_at.isoformat())


@cron("*/10 * * * * *", name="examples.report")  # six fields: SECONDS first
async def report(ctx: JobContext) -> None:
    """Takes a few seconds and checkpoints its progress as it goes."""
    for step in range(1, 4):
        await asyncio.sleep(0.5)
        await ctx.checkpoint(step=step)
    ctx.logger.info("report for %s done in %d steps", ctx.scheduled_at.isoformat(), 3)


@cron("*/15 * * * * *", name="examples.flaky")
async def flaky() -> None:
    """Fails on purpose, so a newcomer sees a FAILED record with its traceback."""
    await asyncio.sleep(random.uniform(0.05, 0.2))
    raise RuntimeError("upstream API answered 503 (this example job always fails)")


@cron("* * * * *", name="examples.every_minute", timezone="Europe/Berlin")
async def every_minute() -> None:
    """Five fields: minute precision, in a time zone of its own."""
    await asyncio.sleep(0)
