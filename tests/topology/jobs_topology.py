"""Jobs for the topology tests (PgBouncer, failover, a read-only database); ``SLOTCRON_TOPOLOGY``
names the scenario's set.

Every run records, with the real clock (tests.cluster.harness.record), its ``start``, then
either its ``end`` (the body ran to its end) or a ``stop`` (it was cancelled, or saw
``ctx.lease_lost`` and gave up; ``lease_lost`` says whether that event was set), with the job,
slot, attempt, trigger, instance, execution id, pid and ``ctx.fencing_token``: the shape
tests.cluster.harness.runs reads (its ``id`` is the body's number in its process).
"""

from __future__ import annotations

import asyncio
import itertools
import os
from typing import Any

from slotcron import JobContext, cron, every, task

from tests.cluster.harness import record

SCENARIO = os.environ.get("SLOTCRON_TOPOLOGY", "")
TASK = "topology.tick"
"""The task runtime schedules are added for (test_pooler.py)."""
NEVER = "0 0 1 1 *"
"""A schedule that does not come during a test: the job runs when triggered."""

POOLER_FORBID = "pool-forbid"
POOLER_ALLOW = "pool-allow"
ON_DEMAND = "on-demand"
SLOW_FORBID = [f"slow-forbid-{i}" for i in range(3)]
QUICK_FORBID = "quick-forbid"
QUICK_ALLOW = "quick-allow"
LONG_ALLOW = [f"long-allow-{i}" for i in range(2)]
READ_ONLY_JOBS = ["ro-forbid", "ro-allow"]
_BODIES = itertools.count(1)
IDLE_JOB = "idle"


def _fields(ctx: JobContext) -> dict[str, Any]:
    return {
        "job": ctx.job,
        "slot": ctx.scheduled_at.isoformat(),
        "attempt": ctx.attempt,
        "trigger": str(ctx.trigger),
        "instance": ctx.instance_id,
        # The body's own number in this process: the runs' key in the records (an execution
        # id can come back after a failover that lost commits: the new primary's sequence is
        # behind).
        "id": next(_BODIES),
        "execution_id": ctx.execution_id,
        "token": ctx.fencing_token,
    }


async def _body(ctx: JobContext, seconds: float) -> None:
    """Run ``seconds``, or less if fenced: a well-behaved job stops once ``ctx.lease_lost``
    is set."""
    fields = _fields(ctx)
    record("start", **fields)
    try:
        try:
            await asyncio.wait_for(ctx.lease_lost.wait(), seconds)
        except TimeoutError:
            pass
        else:
            record("stop", how="lease_lost", lease_lost=True, **fields)
            return
    except BaseException as exc:
        record("stop", how=type(exc).__name__, lease_lost=ctx.lease_lost.is_set(), **fields)
        raise
    record("end", **fields)


@task(name=TASK)
async def tick(ctx: JobContext) -> None:
    await _body(ctx, 0.1)


if SCENARIO == "pooler":

    @every(seconds=1, name=POOLER_FORBID, overlap="forbid")
    async def pool_forbid(ctx: JobContext) -> None:
        await _body(ctx, 0.3)

    @every(seconds=1, name=POOLER_ALLOW, overlap="allow")
    async def pool_allow(ctx: JobContext) -> None:
        await _body(ctx, 1.5)  # runs of consecutive slots overlap: allowed

    @cron(NEVER, name=ON_DEMAND)
    async def on_demand(ctx: JobContext) -> None:
        await _body(ctx, 0.1)

elif SCENARIO == "failover":
    # Forbid jobs whose runs take 3 s: at any moment most of them have a run in flight.
    def _slow(name: str) -> None:
        @every(seconds=1, name=name, overlap="forbid")
        async def job(ctx: JobContext) -> None:
            await _body(ctx, 3.0)

    for _name in SLOW_FORBID:
        _slow(_name)

    @every(seconds=1, name=QUICK_FORBID, overlap="forbid")
    async def quick_forbid(ctx: JobContext) -> None:
        await _body(ctx, 0.2)

    @every(seconds=1, name=QUICK_ALLOW, overlap="allow")
    async def quick_allow(ctx: JobContext) -> None:
        await _body(ctx, 0.2)

    # Allow jobs whose runs take 8 s: every second of the lost commits claims one that is still
    # in flight when the instances reach the new primary.
    def _long(name: str) -> None:
        @every(seconds=1, name=name, overlap="allow")
        async def job(ctx: JobContext) -> None:
            await _body(ctx, 8.0)

    for _name in LONG_ALLOW:
        _long(_name)

elif SCENARIO == "read-only":

    @every(seconds=1, name=READ_ONLY_JOBS[0], overlap="forbid")
    async def ro_forbid(ctx: JobContext) -> None:
        await _body(ctx, 0.5)

    @every(seconds=1, name=READ_ONLY_JOBS[1], overlap="allow")
    async def ro_allow(ctx: JobContext) -> None:
        await _body(ctx, 0.2)

elif SCENARIO == "idle":

    @cron(NEVER, name=IDLE_JOB)
    async def idle(ctx: JobContext) -> None:
        await _body(ctx, 0.1)
