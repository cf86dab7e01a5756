"""The admin plane is isolated from the scheduler (issue 13, item 1): no amount of reading the
API delays a claim, a heartbeat or an outcome write. Judged by the job's own records, not by
the scheduler's tables; and the listings are paged by index, with ETags for dashboards."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from slotcron.store.database import Database
from slotcron.store.tables import executions
from sqlalchemy import insert

from tests.cluster.harness import percentile, read_records, slot_time, wait_until
from tests.conftest import Spawn
from tests.http.conftest import TOKEN, auth, base_url, listening_url

CLIENTS = 200
LOAD_SECONDS = 10.0
SEEDED = 2000
TRACEBACK = "Traceback (most recent call last):\n" + '  File "job.py", line 1\n' * 40 + "Boom"


async def seed(db: Database, count: int) -> None:
    """Failed executions with long error text: every listing page is heavy. Recent, so the
    leader's retention pruning leaves them."""
    base = datetime.now(UTC).replace(microsecond=0) - timedelta(days=1)
    rows = [
        {
            "job_name": f"seed.{i % 20}",
            "scheduled_at": base + timedelta(seconds=i),
            "trigger": "cron",
            "status": "FAILED",
            "attempt": 1,
            "instance_id": "gone",
            "created_at": base,
            "error": TRACEBACK,
            "params": {"i": i},
            "state": {},
        }
        for i in range(count)
    ]
    async with db.transaction() as conn:
        await conn.execute(insert(executions), rows)


@pytest.mark.load
async def test_200_clients_reading_the_api_for_10_s_cost_a_one_second_job_no_slot_and_no_lag(
    db: Database, spawn: Spawn, records_path: Path
) -> None:
    await seed(db, SEEDED)
    proc = spawn("loaded", "tests.http.jobs_load", SCHEDULER_ADMIN_TOKEN=TOKEN)
    url = listening_url(proc)
    await asyncio.to_thread(
        wait_until, lambda: len(read_records(records_path)) >= 2, 30, "the job to run"
    )

    statuses: Counter[int] = Counter()
    stop = asyncio.Event()

    async def reader(session: aiohttp.ClientSession, n: int) -> None:
        paths = ("/api/executions?limit=500", "/api/jobs", f"/api/executions?job=seed.{n % 20}")
        i = 0
        while not stop.is_set():
            try:
                async with session.get(url + paths[i % 3], headers=auth()) as response:
                    await response.read()
                    statuses[response.status] += 1
            except (aiohttp.ClientError, TimeoutError):
                statuses[0] += 1
            i += 1

    connector = aiohttp.TCPConnector(limit=CLIENTS)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=30)
    ) as session:
        load_start = time.time()
        readers = [asyncio.create_task(reader(session, n)) for n in range(CLIENTS)]
        await asyncio.sleep(LOAD_SECONDS)
        stop.set()
        await asyncio.gather(*readers)
        load_end = time.time()

    await asyncio.to_thread(
        wait_until,
        lambda: any(slot_time(r["slot"]) > load_end + 1 for r in read_records(records_path)),
        10,
        "a slot after the load",
    )
    starts = [
        r
        for r in read_records(records_path)
        if load_start <= slot_time(r["slot"]) <= load_end and r["job"] == "load.tick"
    ]
    slots = sorted(slot_time(r["slot"]) for r in starts)
    expected = {float(s) for s in range(int(load_start) + 1, int(load_end) + 1)}
    lost = sorted(expected - set(slots))
    lags = [r["wall"] - slot_time(r["slot"]) for r in starts]
    doubled = [s for s, n in Counter(slots).items() if n > 1]
    print(
        f"\n{CLIENTS} clients x {LOAD_SECONDS:g} s: {sum(statuses.values())} reads "
        f"({dict(statuses)}); one-second job: {len(expected)} slots, {len(lost)} lost, "
        f"start lag p50 {percentile(lags, 0.5) * 1000:.1f} ms, "
        f"p99 {percentile(lags, 0.99) * 1000:.1f} ms, max {max(lags) * 1000:.1f} ms"
    )
    assert not lost, f"slots lost under read load: {lost}"
    assert not doubled
    assert percentile(lags, 0.99) < 0.100, sorted(lags)[-5:]
    assert statuses[200] > CLIENTS, dict(statuses)
    assert proc.alive()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"], indirect=True)
async def test_executions_page_by_keyset_cursor_and_answer_304_when_unchanged(
    db: Database, serve: Any, client: aiohttp.ClientSession
) -> None:
    await seed(db, 120)
    service = await serve([], admin_token=TOKEN)
    url = f"{base_url(service)}/api/executions"
    seen: list[int] = []
    before = None
    pages = 0
    while True:
        query = f"?limit=50&before={before}" if before else "?limit=50"
        async with client.get(url + query, headers=auth()) as response:
            assert response.status == 200, await response.text()
            body = await response.json()
        seen.extend(e["id"] for e in body["executions"])
        pages += 1
        before = body["next_before"]
        if before is None:
            break
    assert pages == 3 and len(seen) == 120 == len(set(seen))
    async with client.get(url + "?limit=500", headers=auth()) as response:
        listing = await response.json()
        assert response.status == 200, listing
        everything = [e["id"] for e in listing["executions"]]
        etag = response.headers["ETag"]
    assert seen == everything, "keyset pages are the offset listing, in order"
    async with client.get(
        url + "?limit=500", headers={**auth(), "If-None-Match": etag}
    ) as response:
        assert response.status == 304
        assert await response.read() == b""
    async with client.get(url + "?offset=5&before=x~1", headers=auth()) as response:
        assert response.status == 400
    async with client.get(url + "?offset=10001", headers=auth()) as response:
        assert response.status == 400 and (await response.json())["field"] == "offset"


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_admin_reads_use_their_own_pool_not_the_schedulers(
    serve: Any, client: aiohttp.ClientSession
) -> None:
    service = await serve([], admin_token=TOKEN)
    pool = service.db.engine.pool
    checked_out: list[int] = []
    original = pool.checkedout

    async with client.get(f"{base_url(service)}/api/executions", headers=auth()) as response:
        assert response.status == 200
    checked_out.append(original())
    assert service.http is not None
    reads = service.http.app[__import__("slotcron.http.api", fromlist=["READS_KEY"]).READS_KEY]
    assert reads.db is not service.db
    assert reads.db.engine.pool is not pool
