"""The queue poller's timers: a timer cancelled before its first step (at shutdown) leaves no
coroutine unawaited behind it."""

from __future__ import annotations

import asyncio
import gc
import types
import warnings

from slotcron.engine.queued import QueuedRuns


async def test_a_timer_cancelled_before_its_first_step_leaves_no_coroutine_unawaited() -> None:
    poller = types.SimpleNamespace(_timers=set(), _wake=asyncio.Event())
    made: list[str] = []

    async def wait() -> None:
        made.append("wait")
        await asyncio.sleep(3600)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        QueuedRuns._wake_after(poller, wait)  # type: ignore[arg-type]
        [timer] = poller._timers
        timer.cancel()  # before its first step
        for _ in range(3):  # its end, then its done callback
            await asyncio.sleep(0)
        gc.collect()
    assert timer.cancelled() and poller._timers == set()
    assert made == []  # the wait was never made
    assert not [w for w in caught if "never awaited" in str(w.message)]

    QueuedRuns._wake_after(poller, lambda: asyncio.sleep(0))  # type: ignore[arg-type]
    await asyncio.wait_for(poller._wake.wait(), 5)  # a timer that runs wakes the poller
