"""The alert webhook, against a real HTTP listener on 127.0.0.1 and real databases: each event
is sent once by the cluster (by the instance that won its outcome's write), retried when the
webhook fails, and never carries a password or the admin token."""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import aiohttp
import pytest
from slotcron import JobContext
from slotcron.jobs.registry import Registry, every
from slotcron.observe import alerts
from slotcron.observe import webhook as posting
from slotcron.service.service import Service
from slotcron.store.database import Database
from slotcron.store.tables import executions
from sqlalchemy import insert, select, update

from tests.conftest import ServiceFactory, wait_for
from tests.webhook import Listener, webhook

TOKEN = "admin-token-7d2e9"
PASSWORD = "hook-s3cret-pw"


@pytest.fixture
async def listener() -> AsyncIterator[Listener]:
    async with webhook() as hook:
        yield hook


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    """Short MISSED windows and retry delays, so the tests take seconds."""
    monkeypatch.setattr(alerts, "MISSED_WINDOW", 0.5)
    monkeypatch.setattr(posting, "RETRY_FIRST", 0.1)


def failing_jobs(*, quiet: bool = False) -> Registry:
    registry = Registry()

    @every(seconds=1, name="alerts.broken", registry=registry)
    async def broken() -> None:
        raise RuntimeError("broken on purpose")

    if quiet:

        @every(seconds=1, name="alerts.quiet", alert=False, registry=registry)
        async def silent() -> None:
            raise RuntimeError("fails, but asked for no alert")

    return registry


async def rows(db: Database, job: str, status: str) -> list[Any]:
    async with db.read() as conn:
        return list(
            (
                await conn.execute(
                    select(executions.c.id, executions.c.scheduled_at).where(
                        executions.c.job_name == job, executions.c.status == status
                    )
                )
            ).all()
        )


async def two_instances(
    start_service: ServiceFactory, jobs: Registry, url: str, **overrides: Any
) -> list[Service]:
    return [
        await start_service(
            list(jobs), instance_id=name, alert_webhook_url=url, admin_token=TOKEN, **overrides
        )
        for name in ("alpha", "beta")
    ]


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


async def test_each_failure_and_abandoned_run_is_sent_once_by_a_cluster_of_two(
    db: Database, start_service: ServiceFactory, listener: Listener
) -> None:
    services = await two_instances(start_service, failing_jobs(), listener.url)
    # A run whose instance died long ago: the leader (one of the two) records it ABANDONED.
    async with db.transaction() as conn:
        inserted = (
            await conn.execute(
                insert(executions).values(
                    job_name="alerts.broken",
                    scheduled_at=datetime(2020, 1, 1, tzinfo=UTC),
                    trigger="interval",
                    status="RUNNING",
                    attempt=1,
                    instance_id="ghost",
                    created_at=datetime(2020, 1, 1, tzinfo=UTC),
                    # Its body started: a run that never started would be handed back instead.
                    started_at=datetime(2020, 1, 1, tzinfo=UTC),
                    lease_until=datetime(2020, 1, 1, 0, 1, tzinfo=UTC),
                    lease_ms=60_000,
                )
            )
        ).inserted_primary_key
    assert inserted is not None
    ghost = inserted[0]

    async def enough() -> bool:
        return len(await rows(db, "alerts.broken", "FAILED")) >= 6 and bool(
            listener.events("ABANDONED")
        )

    await wait_for(enough, timeout=30, what="six failures and the abandoned run")
    for service in services:
        await service.stop()  # sends what is queued
    failed = {row.id for row in await rows(db, "alerts.broken", "FAILED")}
    sent = listener.events("FAILED", "alerts.broken")
    ids = [event["execution_id"] for event in sent]
    assert len(ids) == len(set(ids)), "a failure was sent twice"
    assert set(ids) == failed, "every failure is sent, and only failures"
    # (The two no longer race for every slot: the job is its owner's once they know each other,
    # within seconds of starting; a claim lost meanwhile sends nothing, as asserted above.)
    abandoned = listener.events("ABANDONED")
    assert [event["execution_id"] for event in abandoned] == [ghost]
    assert abandoned[0]["instance"] == "ghost" and abandoned[0]["slot"] == "2020-01-01T00:00:00Z"
    first = sent[0]
    assert first["status"] == "FAILED" and first["attempt"] == 1
    assert "RuntimeError: broken on purpose" in first["error"]
    assert first["dashboard"] is None  # no HTTP port configured
    delays = [
        r.at - datetime.fromisoformat(r.body["at"]).timestamp()
        for r in listener.accepted
        if r.body["event"] == "FAILED"
    ]
    # The figure the issue asks for: how long an event takes to reach the webhook.
    print(
        f"\nwebhook delivery: {len(sent)} FAILED + {len(abandoned)} ABANDONED events, "
        f"duplicates {len(ids) - len(set(ids))}, delay p99 {p99(delays) * 1000:.1f} ms, "
        f"sent by {sorted({event['sent_by'] for event in sent})}"
    )
    assert p99(delays) < 5.0


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_missed_slots_are_summed_per_job_and_sent_once_across_instances(
    db: Database, start_service: ServiceFactory, listener: Listener, db_url: str
) -> None:
    registry = Registry()

    @every(seconds=1, name="alerts.missable", registry=registry)
    async def missable() -> None:
        pass

    first = await start_service(list(registry), instance_id="first")
    await wait_for(lambda: rows(db, "alerts.missable", "COMPLETED"), what="a first run")
    await first.stop()
    stopped_at = time.monotonic()
    # Nobody is up for four slots: the next instance to start records them MISSED.
    await wait_for(lambda: time.monotonic() - stopped_at > 4.5, what="four slots to pass")
    await two_instances(start_service, registry, listener.url)

    async def all_sent() -> tuple[list[Any], list[dict[str, Any]]] | None:
        # One look at both: a slot missed later (an instance starting late under load) may be
        # recorded after it, its event not yet sent.
        missed = await rows(db, "alerts.missable", "MISSED")
        events = listener.events("MISSED")
        summed = len(missed) >= 2 and sum(e["count"] for e in events) == len(missed)
        return (missed, events) if summed else None

    missed, events = await wait_for(
        all_sent, timeout=15, what="the MISSED slots summed up in events"
    )
    slots = sorted(row.scheduled_at for row in missed)
    assert events[0]["slot"] == slots[0].isoformat().replace("+00:00", "Z")
    assert events[-1]["until"] == slots[-1].isoformat().replace("+00:00", "Z")
    assert len(events) == len({e["id"] for e in events})


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"], indirect=True)
async def test_a_failed_post_is_retried_until_the_webhook_takes_it(
    db: Database, start_service: ServiceFactory, listener: Listener
) -> None:
    listener.fail_first = 2
    service = await start_service(
        list(failing_jobs()),
        alert_webhook_url=listener.url,
        alert_events="FAILED",
        http_port=0,
    )
    # The listener records a POST before it answers: the sender counts it sent once it has
    # heard the answer (on a loaded machine, a while after).
    await wait_for(
        lambda: listener.accepted and service.alerts.stats.sent >= 1,
        timeout=20,
        what="an event accepted after two 500s, and its sender told so",
    )
    first_id = listener.posts[0].body["id"]
    assert [p.body["id"] for p in listener.posts[:3]] == [first_id] * 3
    assert listener.accepted[0].body["id"] == first_id
    assert service.alerts.stats.failed == 2
    assert service.alerts.stats.sent >= 1
    assert service.http is not None
    async with (
        aiohttp.ClientSession() as client,
        client.get(f"{service.http.url}/metrics") as response,
    ):
        text = await response.text()
    assert "slotcron_alerts_failed_total 2.0" in text
    assert listener.accepted[0].body["dashboard"] == f"{service.http.url}/"


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_no_event_nor_log_line_carries_the_webhook_password_or_the_admin_token(
    start_service: ServiceFactory, listener: Listener, caplog: pytest.LogCaptureFixture
) -> None:
    registry = Registry()

    @every(seconds=1, name="alerts.leaky", registry=registry)
    async def leaky() -> None:
        raise RuntimeError(
            f"could not reach http://hook-user:{PASSWORD}@example.com with token {TOKEN}"
        )

    listener.fail_first = 1  # so the failure is logged, with the URL
    secret_url = listener.url.replace("://", f"://hook-user:{PASSWORD}@")
    caplog.set_level(logging.DEBUG)
    service = await start_service(
        list(registry), alert_webhook_url=secret_url, admin_token=TOKEN, http_port=0
    )
    await wait_for(lambda: len(listener.accepted) >= 2, timeout=20, what="two events")
    await service.stop()
    for post in listener.posts:
        assert PASSWORD.encode() not in post.raw and TOKEN.encode() not in post.raw
        # The URL's password is the webhook's own credential: sent as basic auth, only there.
        assert post.headers["Authorization"] == "Basic " + base64.b64encode(
            f"hook-user:{PASSWORD}".encode()
        ).decode("ascii")
    assert "***" in listener.accepted[0].body["error"]
    logged = "\n".join(r.getMessage() for r in caplog.records if r.name == "slotcron.alerts")
    assert "alert webhook http://127.0.0.1:" in logged  # the failure was logged, URL masked
    assert PASSWORD not in logged and TOKEN not in logged


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_a_job_declared_alert_false_sends_nothing(
    db: Database, start_service: ServiceFactory, listener: Listener
) -> None:
    await start_service(list(failing_jobs(quiet=True)), alert_webhook_url=listener.url)

    async def both_failed() -> bool:
        return (
            len(await rows(db, "alerts.quiet", "FAILED")) >= 3
            and len(listener.events("FAILED", "alerts.broken")) >= 3
        )

    await wait_for(both_failed, timeout=20, what="both jobs to fail three times")
    assert listener.events("FAILED", "alerts.quiet") == []
    assert all(r.body["job"] != "alerts.quiet" for r in listener.posts)


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_a_run_whose_record_was_taken_is_sent_as_fenced_by_its_instance(
    db: Database, start_service: ServiceFactory, listener: Listener
) -> None:
    registry = Registry()
    taken: list[int] = []

    @every(seconds=1, name="alerts.fenced", registry=registry)
    async def fenced(ctx: JobContext) -> None:
        if taken:
            return
        # The cluster recorded this run otherwise meanwhile: its finish is no longer ours.
        async with db.transaction() as conn:
            await conn.execute(
                update(executions)
                .where(executions.c.id == ctx.execution_id)
                .values(status="ABANDONED", error="taken by the test")
            )
        taken.append(ctx.execution_id)

    service = await start_service(list(registry), alert_webhook_url=listener.url)
    await wait_for(lambda: listener.events("FENCED"), what="the FENCED event")
    event = listener.events("FENCED")[0]
    assert event["execution_id"] == taken[0]
    assert event["instance"] == service.instance_id
    assert "no longer ours" in event["error"]


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_events_wait_in_a_bounded_queue_and_a_dead_webhook_costs_only_counters(
    start_service: ServiceFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing listens on the webhook's port: runs go on, events are counted failed, then
    dropped once the queue is full."""
    monkeypatch.setattr(posting, "QUEUE_LIMIT", 2)
    monkeypatch.setattr(posting, "RETRY_FIRST", 5.0)
    registry = failing_jobs()
    service = await start_service(
        list(registry), alert_webhook_url="http://127.0.0.1:9/hook", alert_events="FAILED"
    )

    async def dropping() -> bool:
        return service.alerts.stats.dropped >= 2

    await wait_for(dropping, timeout=20, what="events to be dropped")
    assert service.alerts.stats.failed >= 1
    assert service.alerts.stats.queued <= 2
    assert service.alerts.stats.sent == 0
