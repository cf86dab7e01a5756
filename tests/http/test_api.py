"""The JSON admin API: the CLI's operator commands over HTTP, with its auth and its refusals."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
from slotcron import JobContext
from slotcron.jobs import misfire
from slotcron.jobs.registry import Registry, cron, every
from slotcron.records import execution_json, job_json
from slotcron.store.database import Database
from slotcron.store.history import list_executions
from slotcron.store.operations import list_jobs, set_paused
from slotcron.text import iso
from yarl import URL

from tests.conftest import wait_for
from tests.http.conftest import TOKEN, auth, base_url

YEARLY = "0 0 1 1 *"  # never due during a test: only manual runs happen
ODD_NAME = "api/odd name"  # a slash and a space: the client must percent-encode it
CONTRACT_JOB_FIELDS = {"name", "schedule", "timezone", "next_slot", "paused", "last_status"}


def api_jobs(seen: list[dict[str, Any]]) -> Registry:
    registry = Registry()

    @cron(YEARLY, name="api.manual", registry=registry)
    async def manual(ctx: JobContext) -> None:
        seen.append({"id": ctx.execution_id, "trigger": ctx.trigger, "params": ctx.params})

    @cron(YEARLY, name=ODD_NAME, registry=registry)
    async def odd(ctx: JobContext) -> None:
        seen.append({"id": ctx.execution_id, "trigger": ctx.trigger, "params": ctx.params})

    @every(seconds=1, name="api.tick", registry=registry)
    async def tick() -> None:
        pass

    @every(seconds=1, name="api.broken", registry=registry)
    async def broken() -> None:
        raise RuntimeError("broken on purpose")

    return registry


async def call(
    client: aiohttp.ClientSession,
    method: str,
    url: str | URL,
    *,
    headers: dict[str, str] | None = None,
    json: Any = None,
    data: str | bytes | None = None,
) -> tuple[int, dict[str, Any], Mapping[str, str]]:
    async with client.request(method, url, headers=headers, json=json, data=data) as response:
        assert response.content_type == "application/json", await response.text()
        return response.status, await response.json(), response.headers


async def executions(client: aiohttp.ClientSession, url: str, **query: str) -> list[dict[str, Any]]:
    status, body, _ = await call(client, "GET", URL(f"{url}/api/executions").with_query(query))
    assert status == 200, body
    records: list[dict[str, Any]] = body["executions"]
    return records


async def test_reads_list_jobs_executions_and_instances_in_the_cli_shapes_and_page_history(
    db: Database, serve: Any, client: aiohttp.ClientSession
) -> None:
    service = await serve(list(api_jobs([])))
    url = base_url(service)
    await wait_for(
        lambda: _count(client, url, job="api.tick", status="COMPLETED", at_least=4),
        timeout=10,
        interval=0.2,
        what="four completed ticks",
    )
    status, body, _ = await call(client, "GET", f"{url}/api/jobs")
    assert status == 200
    jobs = {job["name"]: job for job in body["jobs"]}
    assert set(jobs) == {"api.manual", ODD_NAME, "api.tick", "api.broken"}
    stored = {
        r.name: job_json(r) for r in await list_jobs(db, now=service.clock.now(), live_within=60)
    }
    for name, job in jobs.items():
        assert set(job) == set(stored[name]) >= CONTRACT_JOB_FIELDS
    assert jobs["api.tick"]["paused"] is False
    assert jobs["api.tick"]["schedule"] and jobs["api.tick"]["next_slot"].endswith("Z")
    assert jobs["api.broken"]["last_status"] in ("FAILED", "RUNNING")

    # Offset paging over a table that grows between two requests shifts its pages: the tick is
    # paused, and its last run ended, before the pages are read.
    await set_paused(db, job="api.tick", paused=True, reason="paging")

    async def tick_at_rest() -> bool:
        return not await list_executions(db, job="api.tick", status="RUNNING")

    await wait_for(tick_at_rest, what="the paused tick's last run to end")
    first = await executions(client, url, job="api.tick", status="completed", limit="2")
    status, page, _ = await call(
        client,
        "GET",
        URL(f"{url}/api/executions").with_query(job="api.tick", status="COMPLETED", limit=2),
    )
    assert page["limit"] == 2 and page["offset"] == 0 and page["next_offset"] == 2
    second = await executions(
        client, url, job="api.tick", status="COMPLETED", limit="2", offset="2"
    )
    assert len(first) == len(second) == 2
    assert {r["job"] for r in first + second} == {"api.tick"}
    assert {r["status"] for r in first + second} == {"COMPLETED"}
    slots = [r["scheduled_at"] for r in first + second]
    assert slots == sorted(slots, reverse=True) and len(set(slots)) == 4  # newest first, no repeat
    # The same records the CLI's `history --json` prints (finished rows no longer change).
    recorded = {r.id: execution_json(r) for r in await list_executions(db, limit=500)}
    for record in first + second:
        assert record == recorded[record["id"]]

    failed = await executions(client, url, status="FAILED", job="api.broken")
    assert failed and "RuntimeError: broken on purpose" in failed[0]["error"]

    status, body, _ = await call(client, "GET", f"{url}/api/instances")
    assert status == 200
    (instance,) = body["instances"]
    assert instance["instance_id"] == service.instance_id
    assert instance["state"] == "running" and instance["heartbeat_at"].endswith("Z")


async def _count(client: aiohttp.ClientSession, url: str, *, at_least: int, **query: str) -> bool:
    return len(await executions(client, url, limit="100", **query)) >= at_least


WRITES = [
    ("POST", "/api/jobs/api.manual/trigger"),
    ("POST", "/api/jobs/api.manual/pause"),
    ("POST", "/api/jobs/api.manual/resume"),
    ("POST", "/api/executions/1/restart"),
]


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_a_passed_over_range_reads_back_with_its_until_and_other_records_with_null(
    db: Database, serve: Any, client: aiohttp.ClientSession
) -> None:
    service = await serve(list(api_jobs([])))
    url = base_url(service)
    await wait_for(
        lambda: _count(client, url, job="api.tick", status="COMPLETED", at_least=1),
        timeout=10,
        interval=0.2,
        what="a completed tick",
    )
    # api.manual (yearly) passed over from 2020 to 2025, recorded as the firing path does.
    job = service.firing.jobs["api.manual"]
    schedule = service.schedules["api.manual"]
    passed = misfire.passed_over(
        job, schedule, datetime(2020, 1, 1, tzinfo=UTC), service.clock.now()
    )
    assert passed is not None
    await service.firing.pass_over([(job, passed)], service.clock.now())
    [missed] = await executions(client, url, job="api.manual", status="MISSED")
    assert missed["scheduled_at"] == "2020-01-01T00:00:00Z" == iso(passed.first)
    assert missed["until"] == iso(passed.last) and passed.last.year >= 2025
    assert missed["error"] == passed.reason
    ticks = await executions(client, url, job="api.tick", status="COMPLETED")
    assert ticks and all(r["until"] is None for r in ticks)


async def test_with_no_admin_token_configured_every_write_is_refused_and_reads_are_open(
    serve: Any, client: aiohttp.ClientSession
) -> None:
    service = await serve(list(api_jobs([])))
    url = base_url(service)
    for method, path in WRITES:
        for headers in (None, auth("anything")):
            status, body, _ = await call(client, method, f"{url}{path}", headers=headers)
            assert status == 403, (path, body)
            assert "SCHEDULER_ADMIN_TOKEN" in body["error"]
    for path in ("/api/jobs", "/api/executions", "/api/instances"):
        assert (await call(client, "GET", f"{url}{path}"))[0] == 200


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_with_an_admin_token_writes_need_it_401_without_403_with_a_wrong_one(
    serve: Any, client: aiohttp.ClientSession
) -> None:
    service = await serve(list(api_jobs([])), admin_token=TOKEN)
    url = base_url(service)
    for method, path in WRITES:
        for headers in (None, {"Authorization": f"Basic {TOKEN}"}, {"Authorization": "Bearer"}):
            status, body, response_headers = await call(
                client, method, f"{url}{path}", headers=headers
            )
            assert status == 401, (path, headers, body)
            assert response_headers["WWW-Authenticate"].startswith("Bearer")
        for wrong in ("nope", TOKEN[:-1], TOKEN + "x"):
            status, body, _ = await call(client, method, f"{url}{path}", headers=auth(wrong))
            assert status == 403, (path, wrong, body)
            assert body == {"error": "wrong admin token"}
    # Reads need a token only once SCHEDULER_READ_TOKEN is set (docs/reference/http.md): open here.
    for path in ("/api/jobs", "/api/executions"):
        status, body, _ = await call(client, "GET", f"{url}{path}")
        assert status == 200, (path, body)
    status, body, _ = await call(client, "GET", f"{url}/api/jobs", headers=auth())
    assert status == 200 and body["jobs"]
    status, body, _ = await call(client, "POST", f"{url}/api/jobs/api.manual/pause", headers=auth())
    assert (status, body) == (200, {"job": "api.manual", "paused": True, "changed": True})
    # What holds no job data stays open: probes, metrics, the dashboard.
    for path in ("/healthz", "/readyz", "/metrics", "/", "/dashboard.js", "/dashboard.css"):
        async with client.get(f"{url}{path}") as response:
            assert response.status == 200, path


async def test_trigger_pause_resume_and_restart_act_as_the_cli_commands_do(
    serve: Any, client: aiohttp.ClientSession
) -> None:
    seen: list[dict[str, Any]] = []
    service = await serve(list(api_jobs(seen)), admin_token=TOKEN)
    url = base_url(service)

    status, queued, _ = await call(
        client,
        "POST",
        f"{url}/api/jobs/api.manual/trigger",
        headers=auth(),
        json={"params": {"who": "ops", "n": 3}},
    )
    assert status == 202, queued
    assert queued["job"] == "api.manual" and queued["trigger"] == "manual"
    assert queued["status"] == "QUEUED" and queued["attempt"] == 1
    await wait_for(lambda: any(s["id"] == queued["execution_id"] for s in seen), what="the run")
    assert {
        "id": queued["execution_id"],
        "trigger": "manual",
        "params": {"who": "ops", "n": 3},
    } in seen

    odd = URL(f"{url}/api/jobs/{quote(ODD_NAME, safe='')}/trigger", encoded=True)
    status, body, _ = await call(client, "POST", odd, headers=auth())
    assert status == 202 and body["job"] == ODD_NAME, body

    pause = f"{url}/api/jobs/api.tick/pause"
    status, body, _ = await call(client, "POST", pause, headers=auth(), json={"reason": "upgrade"})
    assert (status, body) == (200, {"job": "api.tick", "paused": True, "changed": True})
    status, body, _ = await call(client, "POST", pause, headers=auth())
    assert body["changed"] is False
    jobs = {
        j["name"]: j
        for j in (await call(client, "GET", f"{url}/api/jobs", headers=auth()))[1]["jobs"]
    }
    assert jobs["api.tick"]["paused"] is True and jobs["api.tick"]["paused_reason"] == "upgrade"
    status, body, _ = await call(client, "POST", f"{url}/api/jobs/api.tick/resume", headers=auth())
    assert (status, body) == (200, {"job": "api.tick", "paused": False, "changed": True})

    async def first(status: str, job: str) -> dict[str, Any] | None:
        _, page, _ = await call(
            client,
            "GET",
            URL(f"{url}/api/executions").with_query(job=job, status=status),
            headers=auth(),
        )
        return page["executions"][-1] if page["executions"] else None

    failed = await wait_for(lambda: first("FAILED", "api.broken"), what="a failed run")
    status, body, _ = await call(
        client, "POST", f"{url}/api/executions/{failed['id']}/restart", headers=auth()
    )
    assert status == 202, body
    assert (body["job"], body["attempt"], body["trigger"]) == ("api.broken", 2, "restart")
    assert body["scheduled_at"] == failed["scheduled_at"]

    completed = await wait_for(lambda: first("COMPLETED", "api.tick"), what="a completed run")
    status, body, _ = await call(
        client, "POST", f"{url}/api/executions/{completed['id']}/restart", headers=auth()
    )
    assert status == 409 and "never runs again" in body["error"], body


@pytest.mark.parametrize("backend", ["sqlite", "mariadb"], indirect=True)
async def test_a_trigger_past_a_jobs_hundred_queued_runs_is_refused_429_naming_the_cap(
    db: Database, serve: Any, client: aiohttp.ClientSession
) -> None:
    from datetime import timedelta

    from slotcron.store.tables import executions as executions_table
    from sqlalchemy import insert

    service = await serve(list(api_jobs([])), admin_token=TOKEN)
    url = base_url(service)
    later = datetime.now(UTC) + timedelta(days=1)  # queued, not due: nobody takes them now
    async with db.transaction() as conn:
        await conn.execute(
            insert(executions_table),
            [
                {
                    "job_name": "api.manual",
                    "scheduled_at": later + timedelta(seconds=i),
                    "trigger": "manual",
                    "status": "QUEUED",
                    "attempt": 1,
                    "created_at": later,
                    "available_at": later,
                    "params": {},
                    "state": {},
                }
                for i in range(100)
            ],
        )
    status, body, _ = await call(
        client, "POST", f"{url}/api/jobs/api.manual/trigger", headers=auth(), json={}
    )
    assert status == 429, body
    assert "100 runs waiting QUEUED" in body["error"]
    # Another job's queue is its own.
    status, body, _ = await call(
        client, "POST", f"{url}/api/jobs/{quote(ODD_NAME, safe='')}/trigger", headers=auth()
    )
    assert status == 202, body


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_a_trigger_with_params_past_the_limits_is_a_400_naming_params(
    serve: Any, client: aiohttp.ClientSession
) -> None:
    service = await serve(list(api_jobs([])), admin_token=TOKEN)
    url = f"{base_url(service)}/api/jobs/api.manual/trigger"
    digits = '{"params": {"n": ' + "9" * 100 + "}}"  # more than 64 digits
    status, answer, _ = await call(
        client, "POST", url, headers={**auth(), "Content-Type": "application/json"}, data=digits
    )
    assert (status, answer.get("field")) == (400, "params"), answer
    # Params past 64 KB cannot even be sent: the body is capped at 64 KB.
    blob = '{"params": {"blob": "' + "x" * 70_000 + '"}}'
    status, answer, _ = await call(
        client, "POST", url, headers={**auth(), "Content-Type": "application/json"}, data=blob
    )
    assert status == 413, answer
