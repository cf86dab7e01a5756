"""The periodic horizon refresh of runtime schedules waits while a burst is being claimed
(reading again the 100,000 schedules of a burst took the CPU its claims needed), for a bounded
time; a refresh asked for by a write never waits."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest
from slotcron.engine import runtime
from slotcron.engine.runtime import DEFER_REFRESH_SECONDS, Runtime


def loader(claiming: int) -> tuple[Any, list[int]]:
    """A loader that listens (no change token polled), whose periodic refresh is due."""
    refreshed: list[int] = []
    loader: Any = Runtime.__new__(Runtime)

    async def refresh() -> None:
        refreshed.append(1)
        loader._refreshed_at = time.monotonic()

    async def nothing() -> None:
        pass

    loader.__dict__.update(
        _listening=SimpleNamespace(alive=True),
        _refresh_due=False,
        _reread=set(),
        _taking=set(),
        _deferred_since=None,
        refresh_every=30.0,
        _refreshed_at=time.monotonic() - 31.0,
        planner=SimpleNamespace(burst=SimpleNamespace(claiming=claiming)),
        refresh=refresh,
        _report_unknown=nothing,
    )
    return loader, refreshed


@pytest.fixture(autouse=True)
def no_poll_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "DEFER_POLL_SECONDS", 0.0)


async def test_the_periodic_refresh_waits_while_a_burst_is_claimed() -> None:
    idle, refreshed = loader(claiming=0)
    await idle.step()
    assert refreshed == [1]

    busy, refreshed = loader(claiming=1)
    await busy.step()
    await busy.step()
    assert refreshed == []
    busy.planner.burst.claiming = 0  # claimed: the refresh goes at once
    await busy.step()
    assert refreshed == [1]


async def test_the_periodic_refresh_waits_a_bounded_time() -> None:
    busy, refreshed = loader(claiming=1)
    await busy.step()
    assert refreshed == []
    busy._deferred_since = time.monotonic() - DEFER_REFRESH_SECONDS - 0.1
    await busy.step()
    assert refreshed == [1]


async def test_a_refresh_asked_for_by_a_write_never_waits() -> None:
    busy, refreshed = loader(claiming=1)
    busy._refresh_due = True  # a schedule added within the horizon was heard of
    await busy.step()
    assert refreshed == [1]
