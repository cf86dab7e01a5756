"""Jobs for the gray-failure tests (test_gray.py); SLOTCRON_GRAY names the scenario's set.

Every run records, with the real clock, its ``start``, then either its ``end`` (the body ran to
its end) or a ``stop`` (it was cancelled, failed, or saw ``ctx.lease_lost`` and gave up), with
the job, slot, attempt, trigger, instance, execution id, pid and ``ctx.fencing_token``. ``mono``
is the monotonic clock, which libfaketime leaves alone (FAKETIME_DONT_FAKE_MONOTONIC=1): the
test turns it into real time when the process's wall clock is faked.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

from slotcron import JobContext, cron, every

from tests.cluster.harness import record

SCENARIO = os.environ.get("SLOTCRON_GRAY", "")


def _fields(ctx: JobContext) -> dict[str, Any]:
    return {
        "job": ctx.job,
        "slot": ctx.scheduled_at.isoformat(),
        "attempt": ctx.attempt,
        "trigger": str(ctx.trigger),
        "instance": ctx.instance_id,
        "id": ctx.execution_id,
        # The documented JobContext's (docs/reference/jobs.md); None where the app lacks it.
        "token": getattr(ctx, "fencing_token", None),
    }


async def _body(
    ctx: JobContext, seconds: float, *, block: bool = False, fail: bool = False
) -> None:
    fields = _fields(ctx)
    record("start", mono=time.monotonic(), **fields)
    lost: asyncio.Event | None = getattr(ctx, "lease_lost", None)
    try:
        if fail:
            raise RuntimeError("planned failure")
        if block:
            time.sleep(seconds)  # noqa: ASYNC251 (blocks the event loop: the scenario)
        elif lost is None:
            await asyncio.sleep(seconds)
        else:
            try:
                await asyncio.wait_for(lost.wait(), seconds)
            except TimeoutError:
                pass
            else:  # fenced: a well-behaved job stops here
                record("stop", mono=time.monotonic(), how="lease_lost", lease_lost=True, **fields)
                return
    except BaseException as exc:
        seen = lost.is_set() if lost is not None else None
        record("stop", mono=time.monotonic(), how=type(exc).__name__, lease_lost=seen, **fields)
        raise
    record("end", mono=time.monotonic(), **fields)


def _first_time(name: str) -> bool:
    """True once per test run across the cluster (a file created O_EXCL next to the records)."""
    path = Path(os.environ["SLOTCRON_TEST_RECORD"]).parent / f"{name}.once"
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


if SCENARIO == "hang":
    # Long forbid runs (10 s: past the 3 s lease, so they live on renewals, and past a hang's
    # first seconds) and an allow job with
    # retries whose runs are long too.
    def _long(i: int) -> None:
        @cron("* * * * * *", name=f"long-{i}", overlap="forbid")
        async def job(ctx: JobContext) -> None:
            await _body(ctx, 10.0)

    for _i in range(3):
        _long(_i)

    @cron("*/2 * * * * *", name="allow-retry", overlap="allow", max_attempts=3, retry_backoff=1)
    async def allow_retry(ctx: JobContext) -> None:
        await _body(ctx, 4.0)

    def _short(i: int) -> None:
        @cron("* * * * * *", name=f"short-{i}")
        async def job(ctx: JobContext) -> None:
            await _body(ctx, 0.1)

    for _i in range(3):
        _short(_i)

elif SCENARIO == "pause":

    @cron("* * * * * *", name="paused", overlap="forbid")
    async def paused(ctx: JobContext) -> None:
        await _body(ctx, 8.0)

elif SCENARIO == "block":

    @cron("*/4 * * * * *", name="blocker", overlap="forbid")
    async def blocker(ctx: JobContext) -> None:
        await _body(ctx, 6.0, block=True)

elif SCENARIO == "step":

    def _step(i: int) -> None:
        @cron("* * * * * *", name=f"step-{i}")
        async def job(ctx: JobContext) -> None:
            await _body(ctx, 0.1)

    for _i in range(4):
        _step(_i)

    def _steady(i: int) -> None:
        @cron("* * * * * *", name=f"steady-{i}", overlap="forbid")
        async def job(ctx: JobContext) -> None:
            await _body(ctx, 2.5)

    # Twelve: each job is planned by one instance (rendezvous hashing), and the leader-step
    # test needs runs on the instance that joins second (it owns three of these).
    for _i in range(12):
        _steady(_i)

elif SCENARIO == "late":

    @cron("*/2 * * * * *", name="late-cron")
    async def late_cron(ctx: JobContext) -> None:
        await _body(ctx, 0.1)

    @every(seconds=3, name="late-every")
    async def late_every(ctx: JobContext) -> None:
        await _body(ctx, 0.1)

elif SCENARIO == "queued":
    # Its first run fails; the retry comes due (7 s later) while the next slot's run (8 s long)
    # holds the lease, and must start soon after that run ends, before the slot after.
    @every(seconds=6, name="queued", overlap="forbid", max_attempts=2, retry_backoff=7)
    async def queued(ctx: JobContext) -> None:
        await _body(ctx, 8.0, fail=ctx.attempt == 1 and _first_time("queued"))

elif SCENARIO == "token":
    # Every third slot's first attempt fails, so retries take tokens too.
    @cron("* * * * * *", name="token", overlap="forbid", max_attempts=2, retry_backoff=0.3)
    async def token(ctx: JobContext) -> None:
        fail = ctx.attempt == 1 and int(ctx.scheduled_at.timestamp()) % 3 == 0
        await _body(ctx, 0.1, fail=fail)
