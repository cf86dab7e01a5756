"""The slot timeline API: a page of jobs' last slots in one request, each slot as its latest
attempt, one bounded query per job; the change marker the dashboard polls; one execution by id.
On every backend."""

from __future__ import annotations

import asyncio
import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import pytest
from slotcron.http.api import READS_KEY
from slotcron.jobs.registry import Registry, cron, every
from slotcron.service.service import Service
from slotcron.store.database import Database
from slotcron.store.tables import executions, jobs
from slotcron.text import iso
from sqlalchemy import event, insert, update
from yarl import URL

from tests.conftest import wait_for
from tests.http.conftest import READ_TOKEN, TOKEN, auth, base_url

YEARLY = "0 0 1 1 *"  # never due during a test: the rows are the test's own
COMMA = "report,eu/daily"  # a comma and a slash: why `job` repeats instead of a list
T0 = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(days=1)
"""The rows' first slot: a day back, well within the history's retention (a fixed date left it
30 days later, and the leader's pruning may take the rows from under a test)."""
NEXT_NEW_YEAR = iso(datetime(datetime.now(UTC).year + 1, 1, 1, tzinfo=UTC))


def at(seconds: float) -> str:
    """``T0`` plus ``seconds``, as the API writes a slot."""
    return iso(T0 + timedelta(seconds=seconds))


def timeline_jobs() -> Registry:
    registry = Registry()

    @cron(YEARLY, name="t.alpha", registry=registry)
    async def alpha() -> None: ...

    @cron(YEARLY, name=COMMA, registry=registry)
    async def comma() -> None: ...

    @every(seconds=3600, name="t.hourly", registry=registry)
    async def hourly() -> None: ...

    return registry


async def add_run(
    db: Database,
    job: str,
    minute: int,
    status: str,
    *,
    attempt: int = 1,
    lag_ms: int | None = 250,
    took_ms: int | None = 1500,
    instance: str = "inst-a",
) -> int:
    slot = T0 + timedelta(minutes=minute)
    started = slot + timedelta(milliseconds=lag_ms) if lag_ms is not None else None
    finished = (
        started + timedelta(milliseconds=took_ms)
        if started is not None and took_ms is not None
        else None
    )
    async with db.transaction() as conn:
        result = await conn.execute(
            insert(executions).values(
                job_name=job,
                scheduled_at=slot,
                trigger="cron" if attempt == 1 else "retry",
                status=status,
                attempt=attempt,
                instance_id=instance if started is not None else None,
                created_at=slot,
                started_at=started,
                finished_at=finished,
                error="boom" if status == "FAILED" else None,
                params={},
                state={},
            )
        )
    key = result.inserted_primary_key
    assert key is not None
    return int(key[0])


async def get(
    client: aiohttp.ClientSession, url: str | URL, token: str | None = TOKEN
) -> tuple[int, dict[str, Any]]:
    headers = auth(token) if token else {}
    async with client.get(url, headers=headers) as response:
        assert response.content_type == "application/json", await response.text()
        return response.status, await response.json()


def timeline_url(service: Service, jobs: list[str], **params: Any) -> URL:
    query: list[tuple[str, str]] = [("job", j) for j in jobs]
    query += [(k, str(v)) for k, v in params.items()]
    return URL(f"{base_url(service)}/api/timeline").with_query(query)


async def test_one_request_gives_each_job_its_last_slots_newest_first_each_as_its_latest_attempt(
    db: Database, serve: Any, client: aiohttp.ClientSession
) -> None:
    service = await serve(list(timeline_jobs()), admin_token=TOKEN)
    await add_run(db, "t.alpha", 0, "COMPLETED")
    await add_run(db, "t.alpha", 1, "FAILED")
    retried = await add_run(db, "t.alpha", 1, "COMPLETED", attempt=2, lag_ms=10_250)
    await add_run(db, "t.alpha", 2, "MISSED", lag_ms=None)
    await add_run(db, "t.alpha", 3, "SKIPPED", lag_ms=None)
    running = await add_run(db, "t.alpha", 4, "RUNNING", took_ms=None)
    await add_run(db, COMMA, 0, "ABANDONED", instance="inst-b")

    status, body = await get(
        client, timeline_url(service, ["t.alpha", COMMA, "t.gone", "t.alpha"], limit=4)
    )
    assert status == 200, body
    assert body["limit"] == 4
    by_job = {t["job"]: t for t in body["timelines"]}
    assert [t["job"] for t in body["timelines"]] == ["t.alpha", COMMA, "t.gone"]

    alpha = by_job["t.alpha"]
    # The four newest slots; the retried slot once, as its second attempt.
    assert [(c["slot"], c["status"], c["attempt"]) for c in alpha["slots"]] == [
        (at(240), "RUNNING", 1),
        (at(180), "SKIPPED", 1),
        (at(120), "MISSED", 1),
        (at(60), "COMPLETED", 2),
    ]
    retry_cell = alpha["slots"][3]
    assert retry_cell == {
        "id": retried,
        "slot": at(60),
        "status": "COMPLETED",
        "attempt": 2,
        "trigger": "retry",
        "instance_id": "inst-a",
        "lag_ms": 10_250,
        "duration_ms": 1500,
        "reason": None,  # only a SKIPPED or MISSED slot says why
    }
    assert alpha["slots"][0]["id"] == running
    assert alpha["slots"][0]["duration_ms"] is None
    assert alpha["slots"][2]["lag_ms"] is None  # a MISSED slot never started
    assert alpha["known"] is True and alpha["paused"] is False
    assert alpha["next_slots"] == [NEXT_NEW_YEAR]  # the job row's next slot

    assert [(c["status"], c["instance_id"]) for c in by_job[COMMA]["slots"]] == [
        ("ABANDONED", "inst-b")
    ]
    # A name no job has: no error (a removed schedule keeps its history), nothing to show.
    assert by_job["t.gone"] == {
        "job": "t.gone",
        "known": False,
        "paused": False,
        "next_slots": [],
        "next_notes": {},
        "skips": [],
        "slots": [],
    }


async def test_the_next_slots_follow_the_jobs_schedule_from_the_slot_the_cluster_expects(
    db: Database, serve: Any, client: aiohttp.ClientSession
) -> None:
    service = await serve(list(timeline_jobs()))
    status, body = await get(client, timeline_url(service, ["t.hourly"], next=3), token=None)
    assert status == 200, body
    slots = [datetime.fromisoformat(s) for s in body["timelines"][0]["next_slots"]]
    assert len(slots) == 3
    assert slots[0] > service.clock.now()
    assert slots[0].minute == slots[0].second == 0  # aligned to the hour
    assert [b - a for a, b in itertools.pairwise(slots)] == [timedelta(hours=1)] * 2
    status, body = await get(client, timeline_url(service, ["t.hourly"], next=0), token=None)
    assert body["timelines"][0]["next_slots"] == []


async def test_a_timeline_request_costs_one_bounded_query_per_job_whatever_the_history(
    db: Database, serve: Any, client: aiohttp.ClientSession
) -> None:
    service = await serve(list(timeline_jobs()))
    async with db.transaction() as conn:
        await conn.execute(
            insert(executions),
            [
                {
                    "job_name": "t.alpha",
                    "scheduled_at": T0 + timedelta(seconds=i),
                    "trigger": "cron",
                    "status": "COMPLETED",
                    "attempt": 1,
                    "created_at": T0,
                    "params": {},
                    "state": {},
                }
                for i in range(600)
            ],
        )
    statements: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if "later" in statement:  # the timeline query's alias, and nothing else's
            statements.append(statement)

    # Admin reads go through their own pool (app/slotcron/http/reads.py): listen to that engine.
    engine = service.http.app[READS_KEY].db.engine.sync_engine
    event.listen(engine, "before_cursor_execute", seen)
    try:
        status, body = await get(
            client, timeline_url(service, ["t.alpha", COMMA, "t.hourly"], limit=100), token=None
        )
    finally:
        event.remove(engine, "before_cursor_execute", seen)
    assert status == 200, body
    assert len(body["timelines"][0]["slots"]) == 100
    assert body["timelines"][0]["slots"][0]["slot"] == at(599)
    assert len(statements) == 3, statements
    assert all("LIMIT" in s.upper() for s in statements)


async def test_timeline_reads_need_a_token_once_a_read_token_is_configured(
    db: Database, serve: Any, client: aiohttp.ClientSession
) -> None:
    service = await serve(list(timeline_jobs()), admin_token=TOKEN, read_token=READ_TOKEN)
    url = timeline_url(service, ["t.alpha"])
    assert (await get(client, url, token=None))[0] == 401
    assert (await get(client, url, token="wrong-token"))[0] == 403
    assert (await get(client, url))[0] == 200
    for path in ("/api/changes", "/api/executions/1"):
        assert (await get(client, base_url(service) + path, token=None))[0] == 401


async def test_bad_timeline_queries_are_refused_naming_the_field(
    db: Database, serve: Any, client: aiohttp.ClientSession
) -> None:
    service = await serve(list(timeline_jobs()))
    root = base_url(service)
    cases = [
        (URL(f"{root}/api/timeline"), "job"),
        (timeline_url(service, ["t.alpha"], limit=0), "limit"),
        (timeline_url(service, ["t.alpha"], limit=501), "limit"),
        (timeline_url(service, ["t.alpha"], limit="ten"), "limit"),
        (timeline_url(service, ["t.alpha"], next=21), "next"),
        (URL(f"{root}/api/timeline?jobs=t.alpha,t.hourly"), "jobs"),
        (timeline_url(service, [f"j{i}" for i in range(101)]), "job"),
        (timeline_url(service, ["x" * 201]), "job"),
        (URL(f"{root}/api/timeline?job=t.alpha&limit=1&limit=2"), "limit"),
        (URL(f"{root}/api/executions/abc"), "id"),
        (URL(f"{root}/api/executions/0"), "id"),
        (URL(f"{root}/api/changes?since=1"), "since"),
    ]
    for url, field in cases:
        status, body = await get(client, url, token=None)
        assert (status, body.get("field")) == (400, field), (str(url), body)
        assert body["error"]


async def test_an_execution_opens_by_id_in_the_history_shape(
    db: Database, serve: Any, client: aiohttp.ClientSession
) -> None:
    service = await serve(list(timeline_jobs()))
    failed = await add_run(db, "t.alpha", 7, "FAILED")
    status, body = await get(client, f"{base_url(service)}/api/executions/{failed}", token=None)
    assert status == 200, body
    assert body["id"] == failed
    assert (body["job"], body["status"], body["error"], body["duration_ms"]) == (
        "t.alpha",
        "FAILED",
        "boom",
        1500,
    )
    status, body = await get(client, f"{base_url(service)}/api/executions/999999", token=None)
    assert (status, body["field"]) == (404, "id")


async def test_the_change_marker_moves_with_every_change_the_dashboard_shows_and_only_then(
    db: Database, serve: Any, client: aiohttp.ClientSession
) -> None:
    # Yearly jobs only: t.hourly's slot at the top of an hour is a change (a row added), and it
    # moved the marker of a run that straddled 12:00:00.
    service = await serve([job for job in timeline_jobs() if job.name != "t.hourly"])
    url = f"{base_url(service)}/api/changes"

    async def marker() -> str:
        status, body = await get(client, url, token=None)
        assert status == 200, body
        value: str = body["marker"]
        return value

    # Answers are shared for up to a second (app/slotcron/http/reads.py): each change is awaited.
    async def moved(*before: str) -> str:
        async def new_value() -> str | None:
            value = await marker()
            return None if value in before else value

        value: str = await wait_for(new_value, timeout=5, what="the marker to move")
        return value

    first = await marker()
    assert await marker() == first  # nothing changed, nothing moves
    running = await add_run(db, "t.alpha", 0, "RUNNING", took_ms=None)
    added = await moved(first)
    # An existing row finishing (no row added): the in-flight set changed.
    async with db.transaction() as conn:
        await conn.execute(
            update(executions).where(executions.c.id == running).values(status="COMPLETED")
        )
    finished = await moved(first, added)
    async with db.transaction() as conn:
        await conn.execute(update(jobs).where(jobs.c.name == "t.alpha").values(paused=True))
    paused = await moved(first, added, finished)
    # Past the shared second, nothing changed: the marker holds still.
    await asyncio.sleep(1.2)
    assert await marker() == paused


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_the_dashboard_page_keeps_its_strict_content_security_policy(
    db: Database, serve: Any, client: aiohttp.ClientSession
) -> None:
    service = await serve(list(timeline_jobs()))
    async with client.get(f"{base_url(service)}/") as response:
        policy = response.headers["Content-Security-Policy"]
        page = await response.text()
    assert policy == "default-src 'self'; frame-ancestors 'none'; base-uri 'none'"
    assert "<script>" not in page and "style=" not in page and "http" not in page.split("<body")[1]
