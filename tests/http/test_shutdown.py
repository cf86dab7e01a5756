"""A real ``slotcron run`` told SIGTERM: /readyz turns 503 at phase 1, while a long run drains,
and /healthz keeps answering until the process stops serving in phase 4."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import aiohttp
import pytest

from tests.cluster.harness import read_records
from tests.cluster.test_shutdown import first_start
from tests.conftest import Spawn, wait_for
from tests.http.conftest import listening_url
from tests.http.test_metrics import scrape, value


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_readyz_turns_503_at_phase_1_while_a_long_run_drains_and_the_process_exits_0(
    spawn: Spawn, records_path: Path, client: aiohttp.ClientSession
) -> None:
    proc = spawn(
        "drainer",
        "tests.cluster.jobs_shutdown",
        SCHEDULER_SHUTDOWN_DRAIN_TIMEOUT=3,
        SCHEDULER_SHUTDOWN_CANCEL_TIMEOUT=2,
        SLEEP_SECONDS=60,
    )
    url = await asyncio.to_thread(listening_url, proc)
    started = await asyncio.to_thread(first_start, records_path)
    async with client.get(f"{url}/readyz") as response:
        assert response.status == 200, await response.text()

    proc.signal(signal.SIGTERM)
    signalled = time.monotonic()

    async def draining() -> dict[str, str] | None:
        async with client.get(f"{url}/readyz") as response:
            body: dict[str, str] = await response.json()
            return body if response.status == 503 else None

    body = await wait_for(draining, timeout=3, interval=0.05, what="/readyz 503 after SIGTERM")
    assert body["state"] == "draining", body
    async with client.get(f"{url}/healthz") as response:
        assert response.status == 200
        assert (await response.json())["state"] == "draining"
    figures = await scrape(client, url)
    assert value(figures, "slotcron_draining") == 1
    assert value(figures, "slotcron_runs_in_flight") == 1
    # The run is still draining (phase 2): it has neither ended nor been cancelled.
    events = [r["event"] for r in read_records(records_path) if r["id"] == started["id"]]
    assert events == ["start"], f"{events} {time.monotonic() - signalled:.1f} s after SIGTERM"

    assert await asyncio.to_thread(proc.wait, 20) == 0, proc.log()
    with pytest.raises(aiohttp.ClientConnectionError):
        async with client.get(f"{url}/healthz"):
            pass
    assert "http stopped" in proc.full_log()
