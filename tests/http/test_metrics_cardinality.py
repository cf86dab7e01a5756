"""/metrics of bounded cardinality (issue 26, item 3): runtime schedules are counted under their
task, never as series of their own, so the text's size does not grow with the schedules; it is
rendered off the scheduler's loop and one rendering serves every scraper for a second, so
scrapers cost a one-second job no slot (judged by the job's own records)."""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from slotcron import JobContext
from slotcron.engine.runtime import ScheduledJob
from slotcron.jobs.registry import Registry, every, task
from slotcron.observe.metrics import OTHER, TASK_LABEL, PrometheusMetrics
from slotcron.service.service import Service
from slotcron.store import schedules as store
from slotcron.store.database import Database
from slotcron.store.tables import executions
from sqlalchemy import func, select

from tests.cluster.harness import percentile, read_records, slot_time, wait_until
from tests.conftest import Services, Spawn, wait_for
from tests.http.conftest import base_url, listening_url

CODE_JOB = "card.code"
TASK = "card.tenant"


def jobs_and_tasks() -> Registry:
    registry = Registry()

    @every(seconds=3600, name=CODE_JOB, registry=registry)
    async def code() -> None:
        pass

    @task(name=TASK, registry=registry)
    async def tenant(ctx: JobContext) -> None:
        pass

    return registry


Start = Callable[..., Awaitable[Service]]


@pytest.fixture
def start(services: Services) -> Start:
    """An instance with one code job and one task, serving HTTP (:class:`Services`)."""

    def start(**overrides: Any) -> Awaitable[Service]:
        registry = jobs_and_tasks()
        return services.start(
            list(registry), tasks=registry.tasks(), **{"http_port": 0, **overrides}
        )

    return start


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session


def schedule_of(service: Service, schedule_id: str) -> ScheduledJob:
    """A runtime schedule of :data:`TASK` as the service holds it while it runs: the task's job
    under the schedule's id (filled in place, as :func:`slotcron.engine.runtime.scheduled_job`
    fills it)."""
    [tenant] = service.tasks
    job = object.__new__(ScheduledJob)
    job.__dict__.update(
        {**tenant.__dict__, "name": schedule_id, "task": TASK, "version": None, "mark": ""}
    )
    return job


def ran(service: Service, names: list[str]) -> None:
    """What the engine reports for each schedule's run: a slot decided, a run started and
    finished, the loop held for a moment (the watchdog)."""
    metrics = service.metrics
    slot = datetime.now(UTC)
    for name in names:
        began = metrics.run_started(name, "interval", slot)
        metrics.run_finished(name, "COMPLETED", began)
        metrics.slot_recorded(name, "SKIPPED")
        metrics.loop_blocked(name, 0.01)


async def metrics_text(client: aiohttp.ClientSession, url: str) -> str:
    async with client.get(f"{url}/metrics") as response:
        assert response.status == 200
        return await response.text()


def job_labels(text: str) -> set[str]:
    return {
        sample.labels["job"]
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if "job" in sample.labels
    }


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_ten_thousand_schedules_are_as_many_series_as_a_hundred_and_no_id_shows(
    start: Start, client: aiohttp.ClientSession
) -> None:
    sizes: dict[int, int] = {}
    for count in (100, 10_000):
        service = await start(instance_id=f"card-{count}")
        held = [schedule_of(service, f"tenant-{i:05d}-acme") for i in range(count)]
        for job in held:
            service.schedules.hold(job)
        ran(service, [job.name for job in held])
        ran(service, [CODE_JOB, "gone.elsewhere"])
        await asyncio.sleep(1.1)  # past the shared rendering of an earlier scrape
        text = await metrics_text(client, base_url(service))
        sizes[count] = len(text.encode())
        assert "tenant-" not in text, "no schedule id (a tenant's) in /metrics"
        assert job_labels(text) == {CODE_JOB, TASK_LABEL + TASK, OTHER}
        completed = [
            s.value
            for f in text_string_to_metric_families(text)
            for s in f.samples
            if s.name == "slotcron_slots_total"
            and s.labels == {"job": TASK_LABEL + TASK, "outcome": "COMPLETED"}
        ]
        assert completed == [count], "every schedule's run counted under its task"
        await service.stop()
    print(f"\n/metrics: {sizes[100]} bytes with 100 schedules, {sizes[10_000]} with 10,000")
    # The same series; only the counts' digits differ.
    assert abs(sizes[10_000] - sizes[100]) < 200, sizes


def test_a_name_is_labelled_by_its_code_job_its_task_or_other_and_nothing_else() -> None:
    from slotcron.clock import ManualClock
    from slotcron.observe.metrics import JobLabels

    schedules = {"s-1": SimpleNamespace(task="t.a"), "s-2": SimpleNamespace(task="t.unknown")}
    labels = JobLabels(["code.a"], ["t.a"], schedules.get)
    assert labels("code.a") == "code.a"
    assert labels("s-1") == "task:t.a"
    assert labels("s-2") == OTHER, "a task not registered here is no label of its own"
    assert labels("never-seen") == OTHER
    metrics = PrometheusMetrics(ManualClock(datetime.now(UTC)), labels)
    for i in range(1000):
        metrics.run_finished(f"x-{i}", "FAILED", time.monotonic())
        metrics.slot_recorded(f"y-{i}", "MISSED")
        metrics.loop_blocked(f"z-{i}", 0.5)
    children = set(metrics._slot_children) | {(k, "") for k in metrics._duration_children}
    assert {job for job, _ in children} == {OTHER}


class _Probe(Collector):
    """Records the thread each rendering runs on, and how many renderings there were."""

    def __init__(self) -> None:
        self.threads: list[int] = []

    def collect(self) -> Iterator[Metric]:
        self.threads.append(threading.get_ident())
        yield GaugeMetricFamily("card_probe", "renderings seen by the test", value=1)


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_metrics_render_off_the_schedulers_loop_and_one_rendering_serves_a_second_of_scrapes(
    start: Start, client: aiohttp.ClientSession
) -> None:
    service = await start()
    assert isinstance(service.metrics, PrometheusMetrics)
    probe = _Probe()
    service.metrics.registry.register(probe)
    url = base_url(service)
    loop_thread = threading.get_ident()  # the test's loop is the service's

    bodies = await asyncio.gather(*(metrics_text(client, url) for _ in range(20)))
    assert len(set(bodies)) == 1, "concurrent scrapes share one rendering"
    assert len(probe.threads) == 1, f"{len(probe.threads)} renderings for 20 concurrent scrapes"
    assert loop_thread not in probe.threads, "rendered off the scheduler's loop"
    await asyncio.sleep(1.2)
    await metrics_text(client, url)
    assert len(probe.threads) == 2, "a scrape after the second renders afresh"

    # While the scheduler's loop is blocked (a job that does not yield), /metrics still answers.
    def scrape_from_a_thread() -> tuple[int, float]:
        started = time.monotonic()
        with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
            response.read()
            return response.status, time.monotonic() - started

    answered: list[tuple[int, float]] = []
    scraper = threading.Thread(target=lambda: answered.append(scrape_from_a_thread()))
    await asyncio.sleep(1.1)
    scraper.start()
    time.sleep(1.5)  # noqa: ASYNC251 (blocks the service's loop on purpose)
    scraper.join(5)
    assert answered and answered[0][0] == 200
    assert answered[0][1] < 1.0, f"/metrics waited {answered[0][1]:.2f} s for a blocked loop"


# --- Two scrapers beside a one-second job, ten thousand schedules that ran (real process) ---

JOBS = "tests.http.jobs_metrics"
TICK = "metrics.tick"  # as in tests/http/jobs_metrics.py (not imported: it registers globally)
TENANT_TASK = "metrics.tenant"
SCHEDULES = 10_000
SCRAPE_SECONDS = 10.0
CREATE_WITHIN = 10.0
"""Seconds from now to the schedules' one slot: their 10,000 rows are written well before it
(1-2 s on PostgreSQL on loopback), and the test asserts that they were."""


def writer() -> Registry:
    """The task as a writer of schedules knows it."""
    registry = Registry()

    @task(name=TENANT_TASK, registry=registry)
    async def tenant(ctx: JobContext) -> None: ...

    return registry


async def completed_runs(db: Database) -> int:
    async with db.read() as conn:
        count = await conn.scalar(
            select(func.count())
            .select_from(executions)
            .where(executions.c.job_name.like("tenant-%"), executions.c.status == "COMPLETED")
        )
    return int(count or 0)


@pytest.mark.load
@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
async def test_two_scrapers_beside_a_one_second_job_and_10000_schedules_that_ran_cost_it_no_slot(
    db: Database, spawn: Spawn, records_path: Path
) -> None:
    proc = spawn("scraped", JOBS, SCHEDULER_POOL_SIZE=5)
    url = listening_url(proc)
    await asyncio.to_thread(
        wait_until, lambda: len(read_records(records_path)) >= 2, 30, "the job to run"
    )
    # Every schedule due once, at the same second some seconds from now (6 fields, seconds
    # first: daily at that second), so they have run, and run no more, when the scrapers start.
    due = (datetime.now(UTC) + timedelta(seconds=CREATE_WITHIN)).replace(microsecond=0)
    expression = f"{due.second} {due.minute} {due.hour} * * *"
    for first in range(0, SCHEDULES, 2000):
        await store.create(
            db,
            [
                {
                    "id": f"tenant-{i:05d}-acme",
                    "task": TENANT_TASK,
                    "cron": expression,
                    "params": {"tenant_id": i},
                }
                for i in range(first, first + 2000)
            ],
            default_timezone="UTC",
            by="test",
            registry=writer(),
        )
    # Written before their slot, or the late ones would wait a day and the wait below time out.
    assert datetime.now(UTC) < due - timedelta(seconds=1), "10,000 schedules written too slowly"
    await wait_for(
        lambda: _equal(completed_runs(db), SCHEDULES),
        timeout=120,
        interval=1,
        what="every schedule's run to complete",
    )

    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        took = []
        for _ in range(3):
            await asyncio.sleep(1.1)  # each scrape renders afresh
            started = time.monotonic()
            async with session.get(f"{url}/metrics") as response:
                body = await response.read()
            took.append(time.monotonic() - started)
        text = body.decode()
        print(
            f"\n/metrics after {SCHEDULES} schedules ran: {len(body):,} bytes, "
            f"{statistics.median(took) * 1000:.1f} ms per scrape (median of 3)"
        )

        statuses: Counter[int] = Counter()
        stop = asyncio.Event()

        async def scraper() -> None:
            while not stop.is_set():
                try:
                    async with session.get(f"{url}/metrics") as response:
                        await response.read()
                        statuses[response.status] += 1
                except (aiohttp.ClientError, TimeoutError):
                    statuses[0] += 1

        load_start = time.time()
        scrapers = [asyncio.create_task(scraper()) for _ in range(2)]
        await asyncio.sleep(SCRAPE_SECONDS)
        stop.set()
        await asyncio.gather(*scrapers)
        load_end = time.time()

    await asyncio.to_thread(
        wait_until,
        lambda: any(slot_time(r["slot"]) > load_end + 1 for r in read_records(records_path)),
        15,
        "a slot after the scrapes",
    )
    starts = [
        r
        for r in read_records(records_path)
        if r["job"] == TICK and load_start <= slot_time(r["slot"]) <= load_end
    ]
    slots = sorted(slot_time(r["slot"]) for r in starts)
    expected = {float(s) for s in range(int(load_start) + 1, int(load_end) + 1)}
    lost = sorted(expected - set(slots))
    lags = [r["wall"] - slot_time(r["slot"]) for r in starts]
    print(
        f"two scrapers x {SCRAPE_SECONDS:g} s: {sum(statuses.values())} scrapes "
        f"({dict(statuses)}); one-second job: {len(expected)} slots, {len(lost)} lost, start lag "
        f"p99 {percentile(lags, 0.99) * 1000:.1f} ms, max {max(lags, default=0) * 1000:.1f} ms"
    )
    assert "tenant-" not in text, "no schedule id (a tenant's) in /metrics"
    assert len(body) < 64 * 1024, f"{len(body)} bytes"
    assert f'job="{TASK_LABEL}{TENANT_TASK}"' in text
    assert not lost, f"slots lost to the scrapers: {lost}"
    assert statuses[200] > 2 * SCRAPE_SECONDS, dict(statuses)
    assert proc.alive()


async def _equal(count: Any, expected: int) -> bool:
    return bool(await count == expected)
