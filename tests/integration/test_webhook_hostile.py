"""The alert sender against a hostile webhook on 127.0.0.1 (tests/hostile_webhook.py): it never
follows a redirect (a 307 must not re-POST the alert to another host, a 302 must not become a
GET counted as sent), reads at most 64 KB of an answer, gives up at its timeouts, and nothing the
endpoint does delays the scheduler's loop, judged by a loop-lag probe and by a 1 s job's own
records."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from slotcron import JobContext
from slotcron.clock import SystemClock
from slotcron.config import Settings
from slotcron.jobs.registry import Registry, every
from slotcron.observe import webhook as posting
from slotcron.observe.alerts import Webhook
from slotcron.store.database import Database
from slotcron.store.lifeline import Abandoned
from slotcron.store.tables import executions
from sqlalchemy import select

from tests.conftest import ServiceFactory, wait_for
from tests.hostile_webhook import HUGE_BYTES, Hostile, hostile

RSS_GROWTH_LIMIT_MB = 50.0
LAG_LIMIT = 0.1
"""How late a 10 ms sleep of the probe, or a 1 s job, may wake while the webhook misbehaves."""


@pytest.fixture
async def endpoint() -> AsyncIterator[Hostile]:
    async with hostile() as hook:
        yield hook


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    """Short retries and timeouts, so a test takes seconds."""
    monkeypatch.setattr(posting, "RETRY_FIRST", 0.05)
    monkeypatch.setattr(posting, "MAX_ATTEMPTS", 2)
    monkeypatch.setattr(posting, "POST_TIMEOUT", 1.0)
    monkeypatch.setattr(posting, "CONNECT_TIMEOUT", 0.5)


@contextlib.asynccontextmanager
async def sender(url: str) -> AsyncIterator[Webhook]:
    hook = Webhook(Settings(alert_webhook_url=url), alerting={}, clock=SystemClock())
    await hook.start()
    try:
        yield hook
    finally:
        await hook.stop()


def event(execution_id: int = 1) -> Abandoned:
    moment = datetime(2026, 1, 1, tzinfo=UTC)
    return Abandoned(execution_id, "hostile.job", moment, "ghost", moment, None)


async def settled(hook: Webhook, timeout: float = 10.0) -> None:
    """Until the event is sent or dropped."""
    await wait_for(
        lambda: hook.stats.sent + hook.stats.dropped >= 1, timeout=timeout, what="the event"
    )


class LoopProbe:
    """Sleeps 10 ms again and again; :attr:`worst` is how much later than asked it woke."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            asked = time.perf_counter()
            await asyncio.sleep(0.01)
            self.worst = max(self.worst, time.perf_counter() - asked - 0.01)

    def __enter__(self) -> LoopProbe:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


def rss_mb(field: str = "VmRSS") -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field} in /proc/self/status")


@contextlib.contextmanager
def peak_rss_growth() -> Iterator[list[float]]:
    """The growth of this process's peak RSS over the block, in MB (Linux: VmHWM, reset by
    writing 5 to clear_refs)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pytest.skip("cannot reset the peak RSS (/proc/self/clear_refs) here")
    before = rss_mb()
    growth: list[float] = []
    yield growth
    growth.append(rss_mb("VmHWM") - before)


@pytest.mark.parametrize("code", ["301", "302", "303", "307", "308", "loop"])
async def test_a_redirect_is_a_failed_delivery_retried_and_never_followed(
    endpoint: Hostile, code: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "slotcron.alerts")
    async with asyncio.timeout(20), sender(f"{endpoint.url}/redirect/{code}") as hook:
        hook.abandoned(event())
        await settled(hook)
        stats = hook.stats
        assert (stats.sent, stats.failed, stats.dropped) == (0, 2, 1), stats
    # Retried by the policy (two attempts here), each POSTed to the configured URL only.
    assert endpoint.posts == [f"/redirect/{code}"] * 2
    assert endpoint.bystander.hits == [], "the alert reached the host the redirect named"
    shown = "\n".join(r.getMessage() for r in caplog.records)
    status = "307" if code == "loop" else code
    assert f"HTTP {status} (a redirect: not followed" in shown


async def test_a_200_mb_answer_is_cut_at_64_kb_and_costs_neither_memory_nor_the_loop(
    endpoint: Hostile,
) -> None:
    async with asyncio.timeout(30), sender(f"{endpoint.url}/huge") as hook:
        with LoopProbe() as probe, peak_rss_growth() as growth:
            for number in range(1, 4):  # three events, three 200 MB answers
                hook.abandoned(event(number))
            await wait_for(lambda: hook.stats.sent >= 3, timeout=20, what="three answers")
        assert hook.stats.failed == 0
    await wait_for(lambda: len(endpoint.huge_sent) >= 3, timeout=5, what="the server to stop")
    print(
        f"\n200 MB answers x3: peak RSS growth {growth[0]:.1f} MB, loop lag worst "
        f"{probe.worst * 1000:.1f} ms, bytes the server got out per answer {endpoint.huge_sent}"
    )
    assert growth[0] < RSS_GROWTH_LIMIT_MB
    assert probe.worst < LAG_LIMIT
    # The sender hung up early: what the server wrote is its socket buffers' worth, not 200 MB.
    assert all(sent < HUGE_BYTES / 4 for sent in endpoint.huge_sent), endpoint.huge_sent


@pytest.mark.parametrize("where", ["silent", "slow-headers", "trickle"])
async def test_an_endpoint_that_never_finishes_answering_fails_at_the_total_timeout(
    endpoint: Hostile, where: str
) -> None:
    url = endpoint.silent if where == "silent" else f"{endpoint.url}/{where}"
    async with asyncio.timeout(20), sender(url) as hook:
        with LoopProbe() as probe:
            started = time.monotonic()
            hook.abandoned(event())
            await settled(hook)
            took = time.monotonic() - started
        assert (hook.stats.sent, hook.stats.failed, hook.stats.dropped) == (0, 2, 1)
    # Two attempts of POST_TIMEOUT (1 s) each, and the retry's delay.
    assert 1.9 < took < 5.0, took
    assert probe.worst < LAG_LIMIT


async def test_an_endpoint_that_never_accepts_the_connection_fails_at_the_connect_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A listener whose accept queue is full: the kernel drops further SYNs, as a black-holed
    address would, and the connection never comes."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    filling: list[socket.socket] = []
    try:
        for _ in range(4):  # fill the accept queue; these connections are never accepted
            client = socket.socket()
            client.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                client.connect(listener.getsockname())
            filling.append(client)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/hook"
        # Only the connect timeout (0.5 s) can end an attempt early.
        monkeypatch.setattr(posting, "POST_TIMEOUT", 30.0)
        async with asyncio.timeout(20), sender(url) as hook:
            started = time.monotonic()
            hook.abandoned(event())
            await settled(hook)
            took = time.monotonic() - started
        assert hook.stats.dropped == 1 and hook.stats.sent == 0
        assert took < 4.0, f"two attempts took {took:.1f} s: no connect timeout?"
    finally:
        for client in filling:
            client.close()
        listener.close()


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_a_one_second_job_keeps_its_slots_while_every_alert_gets_a_200_mb_answer(
    db: Database, start_service: ServiceFactory, endpoint: Hostile
) -> None:
    registry = Registry()
    lateness: list[float] = []

    @every(seconds=1, name="hostile.tick", alert=False, registry=registry)
    async def tick(ctx: JobContext) -> None:
        lateness.append((datetime.now(UTC) - ctx.scheduled_at).total_seconds())

    @every(seconds=1, name="hostile.broken", registry=registry)
    async def broken() -> None:
        raise RuntimeError("fails, so that an alert is sent every second")

    async with asyncio.timeout(60):
        service = await start_service(
            list(registry), alert_webhook_url=f"{endpoint.url}/huge", alert_events="FAILED"
        )
        await wait_for(lambda: service.alerts.stats.sent >= 5, timeout=30, what="five alerts")
        await service.stop()
    async with db.read() as conn:
        statuses = [
            row.status
            for row in await conn.execute(
                select(executions.c.status).where(executions.c.job_name == "hostile.tick")
            )
        ]
    settled_lateness = lateness[1:]  # the first run may start late: the service was starting
    latest = max(settled_lateness) * 1000
    print(
        f"\n1 s job beside 200 MB alert answers: {len(lateness)} runs, statuses "
        f"{sorted(set(statuses))}, latest start {latest:.0f} ms after its slot"
    )
    assert "MISSED" not in statuses and "SKIPPED" not in statuses
    assert len(settled_lateness) >= 4
    assert max(settled_lateness) < 1.0, "the loop is not held while an answer is read"
