"""/metrics in Prometheus text format: the figures move as slots fire."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from slotcron.jobs.registry import Registry, every
from slotcron.store import operations
from slotcron.store.database import Database
from slotcron.version import __version__

from tests.conftest import wait_for
from tests.http.conftest import base_url

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def scrape(client: aiohttp.ClientSession, url: str) -> Samples:
    async with client.get(f"{url}/metrics") as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = await response.text()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def metric_jobs() -> Registry:
    registry = Registry()

    @every(seconds=1, name="m.ok", registry=registry)
    async def ok() -> None:
        await asyncio.sleep(0.05)

    @every(seconds=1, name="m.broken", registry=registry)
    async def broken() -> None:
        raise RuntimeError("broken on purpose")

    @every(seconds=1, name="m.paused", registry=registry)
    async def paused() -> None:
        pass

    return registry


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"], indirect=True)
async def test_metrics_move_when_slots_fire(
    db: Database, serve: Any, client: aiohttp.ClientSession
) -> None:
    service = await serve(list(metric_jobs()))
    url = base_url(service)
    await operations.set_paused(db, job="m.paused", paused=True, reason="metrics test")
    before = await scrape(client, url)
    assert value(
        before, "slotcron_instance_info", instance=service.instance_id, version=__version__
    )
    assert value(before, "slotcron_draining") == 0
    assert ("slotcron_database_clock_offset_seconds", ()) in before

    async def moved() -> Samples | None:
        now = await scrape(client, url)
        done = (
            value(now, "slotcron_slots_total", job="m.ok", outcome="COMPLETED") >= 2
            and value(now, "slotcron_slots_total", job="m.broken", outcome="FAILED") >= 2
            and value(now, "slotcron_slots_total", job="m.paused", outcome="SKIPPED") >= 1
            and value(now, "slotcron_leader") == 1
        )
        return now if done else None

    after: Samples = await wait_for(moved, timeout=10, interval=0.3, what="the figures to move")
    ok_runs = value(after, "slotcron_slots_total", job="m.ok", outcome="COMPLETED")
    runs = ok_runs + value(after, "slotcron_slots_total", job="m.broken", outcome="FAILED")
    assert value(after, "slotcron_run_duration_seconds_count", job="m.ok") >= ok_runs
    assert value(after, "slotcron_run_duration_seconds_sum", job="m.ok") >= 0.05 * ok_runs
    # Every run of a cron/interval slot has its fire lag observed, and it is small.
    lag_count = value(after, "slotcron_fire_lag_seconds_count")
    assert lag_count >= runs
    assert value(after, "slotcron_fire_lag_seconds_bucket", le="1.0") == lag_count
    assert value(after, "slotcron_claims_total") > value(before, "slotcron_claims_total")
    assert value(after, "slotcron_claims_lost_total") == 0
    assert value(after, "slotcron_database_errors_total") == 0
    assert value(after, "slotcron_runs_in_flight") >= 0


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_two_services_in_one_process_keep_metrics_of_their_own(
    serve: Any, client: aiohttp.ClientSession
) -> None:
    first = await serve(list(metric_jobs()), instance_id="first")
    second = await serve(list(metric_jobs()), instance_id="second")
    one = await scrape(client, base_url(first))
    two = await scrape(client, base_url(second))
    assert value(one, "slotcron_instance_info", instance="first", version=__version__) == 1
    assert value(one, "slotcron_instance_info", instance="second", version=__version__) == 0
    assert value(two, "slotcron_instance_info", instance="second", version=__version__) == 1
