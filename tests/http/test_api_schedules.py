"""``/api/schedules`` on an in-process service with HTTP, on every backend (issue 15): the
contract's paths, codes and shapes, the token on writes, and bad input refused with nothing
written."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
from yarl import URL

from app import JobContext
from app.registry import Registry, cron, task
from app.store import schedules as store
from app.store.database import Database
from tests.http.conftest import TOKEN, auth, base_url

TASK = "api.send_report"
CODE_JOB = "api.code-job"


def registry() -> Registry:
    jobs = Registry()

    @cron("0 0 1 1 *", name=CODE_JOB, registry=jobs)
    async def code_job() -> None:
        pass

    @task(name=TASK, registry=jobs)
    async def send_report(ctx: JobContext) -> None:
        pass

    return jobs


async def start(db: Database, serve: Any) -> str:
    jobs = registry()
    # What an instance of the task code records at its start.
    await store.register_tasks(
        db, jobs.tasks(), now=datetime.now(UTC), instance_id="t", version="0"
    )
    service = await serve(list(jobs), admin_token=TOKEN)
    return base_url(service)


async def call(
    client: aiohttp.ClientSession,
    method: str,
    url: str | URL,
    json: Any = None,
    *,
    token: str | None = TOKEN,
) -> tuple[int, Any]:
    headers = auth(token) if token is not None else {}
    async with client.request(method, url, json=json, headers=headers) as response:
        if response.status == 204:
            assert await response.read() == b""
            return 204, None
        assert response.content_type == "application/json", await response.text()
        return response.status, await response.json()


async def test_schedules_are_created_listed_read_patched_and_deleted_over_http(
    db: Database, serve: Any, client: aiohttp.ClientSession
) -> None:
    url = await start(db, serve)
    body = {"task": TASK, "cron": "0 9 * * *", "timezone": "Asia/Seoul", "params": {"t": 1}}
    status, created = await call(client, "POST", f"{url}/api/schedules", body)
    assert status == 201, created
    assert created["id"].startswith(f"{TASK}/") and created["next_slot"].endswith("T00:00:00Z")
    for i in range(3):
        status, _ = await call(
            client, "POST", f"{url}/api/schedules", {"task": TASK, "every": 60, "id": f"t/{i}"}
        )
        assert status == 201

    status, page = await call(client, "GET", URL(f"{url}/api/schedules").with_query(limit=2))
    assert status == 200
    assert [s["id"] for s in page["schedules"]] == [created["id"], "t/0"]
    assert (page["limit"], page["offset"], page["next_offset"]) == (2, 0, 2)
    query = URL(f"{url}/api/schedules").with_query(task=TASK, limit=2, offset=2)
    status, last = await call(client, "GET", query)
    assert [s["id"] for s in last["schedules"]] == ["t/1", "t/2"] and last["next_offset"] is None

    one = f"{url}/api/schedules/{quote('t/1', safe='')}"
    status, got = await call(client, "GET", one, token=TOKEN)
    assert status == 200 and got["id"] == "t/1" and got["every"] == 60
    status, patched = await call(client, "PATCH", one, {"cron": "*/5 * * * *", "params": {"a": 2}})
    assert status == 200 and patched["cron"] == "*/5 * * * *" and patched["params"] == {"a": 2}
    status, _ = await call(client, "DELETE", one)
    assert status == 204
    status, gone = await call(client, "GET", one)
    assert status == 404 and gone["field"] == "id"
    assert "t/1" not in [r.spec.id for r in await store.list_schedules(db)]


async def test_writes_need_the_token(
    db: Database, serve: Any, client: aiohttp.ClientSession
) -> None:
    url = await start(db, serve)
    body = {"task": TASK, "every": 5, "id": "guarded"}
    assert (await call(client, "POST", f"{url}/api/schedules", body, token=None))[0] == 401
    assert (await call(client, "POST", f"{url}/api/schedules", body, token="wrong"))[0] == 403
    assert await store.list_schedules(db) == []
    assert (await call(client, "POST", f"{url}/api/schedules", body))[0] == 201
    for method in ("PATCH", "DELETE"):
        status, _ = await call(client, method, f"{url}/api/schedules/guarded", {}, token=None)
        assert status == 401
    assert [r.spec.id for r in await store.list_schedules(db)] == ["guarded"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"task": "api.unknown", "every": 5}, "task"),
        ({"task": TASK, "cron": "0 25 * * *"}, "cron"),
        ({"task": TASK, "cron": "0 9 * * *", "timezone": "Atlantis/Capital"}, "timezone"),
        ({"task": TASK, "every": 0}, "every"),
        ({"task": TASK, "every": 5, "params": "tenant=1"}, "params"),
        ({"task": TASK, "every": 5, "jitter": -2}, "jitter"),
        ({"task": TASK, "every": 5, "id": CODE_JOB}, "id"),
        ({"task": TASK, "every": 5, "when": "now"}, "when"),
    ],
)
async def test_bad_input_is_400_naming_the_field_and_writes_nothing(
    db: Database, serve: Any, client: aiohttp.ClientSession, body: dict[str, Any], field: str
) -> None:
    url = await start(db, serve)
    status, answer = await call(client, "POST", f"{url}/api/schedules", body)
    assert (status, answer.get("field")) == (400, field), answer
    assert await store.list_schedules(db) == []


async def test_a_code_job_is_409_and_an_unknown_id_404(
    db: Database, serve: Any, client: aiohttp.ClientSession
) -> None:
    url = await start(db, serve)
    code_job = f"{url}/api/schedules/{CODE_JOB}"
    assert (await call(client, "PATCH", code_job, {"every": 5}))[0] == 409
    assert (await call(client, "DELETE", code_job))[0] == 409
    assert (await call(client, "GET", code_job))[0] == 404
    status, answer = await call(client, "PATCH", f"{url}/api/schedules/nope", {"every": 5})
    assert (status, answer["field"]) == (404, "id")
    status, answer = await call(client, "PATCH", f"{url}/api/schedules/nope", {"task": "x"})
    assert (status, answer["field"]) == (400, "task")
