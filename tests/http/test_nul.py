"""A NUL character is refused on every endpoint (issue 26, item 5): in a path, a query parameter
(its name or its value) or any string of a JSON body, a 400 naming the field, before a handler
can take it to a database (PostgreSQL answered ``/api/timeline?job=a%00b`` with 503 "database
unavailable"). On every backend, since the handlers behind these paths reach the database."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from slotcron import JobContext
from slotcron.jobs.registry import Registry, cron, task
from yarl import URL

from tests.conftest import Services
from tests.http.conftest import TOKEN, auth, base_url

YEARLY = "0 0 1 1 *"


def nul_jobs() -> Registry:
    registry = Registry()

    @cron(YEARLY, name="nul.job", registry=registry)
    async def job() -> None:
        pass

    @task(name="nul.task", registry=registry)
    async def tenant(ctx: JobContext) -> None:
        pass

    return registry


@pytest.fixture
async def url(services: Services) -> str:
    registry = nul_jobs()
    service = await services.start(
        list(registry), tasks=registry.tasks(), http_port=0, admin_token=TOKEN
    )
    return base_url(service)


# (method, path and query as sent, already percent-encoded; JSON body; field named)
REFUSED: list[tuple[str, str, Any, str]] = [
    ("GET", "/api/timeline?job=a%00b", None, "job"),
    ("GET", "/api/timeline?job=nul.job&job=%00", None, "job"),
    ("GET", "/api/executions?job=a%00b", None, "job"),
    ("GET", "/api/executions?status=FAILED%00", None, "status"),
    ("GET", "/api/executions?since=1h&a%00b=1", None, "a\\x00b"),
    ("GET", "/api/schedules?task=nul.task%00", None, "task"),
    ("GET", "/api/schedules/tenant%00x", None, "id"),
    ("PATCH", "/api/schedules/tenant%00x", {"every": 60}, "id"),
    ("DELETE", "/api/schedules/tenant%00x", None, "id"),
    ("GET", "/api/executions/1%00", None, "id"),
    ("POST", "/api/jobs/nul%00job/trigger", {}, "name"),
    ("POST", "/api/jobs/nul%00job/pause", None, "name"),
    ("POST", "/api/jobs/nul.job/trigger", {"params": {"tenant": "a\x00b"}}, "params"),
    ("POST", "/api/jobs/nul.job/trigger", {"params": {"deep": [{"k\x00": 1}]}}, "params"),
    ("POST", "/api/jobs/nul.job/pause", {"reason": "\x00"}, "reason"),
    ("POST", "/api/schedules", {"task": "nul.task", "every": 60, "id": "t\x00"}, "id"),
    ("POST", "/api/schedules", {"task": "nul.task", "every": 60, "params": ["\x00"]}, "params"),
    ("POST", "/api/schedules", ["\x00"], "body"),
    ("GET", "/healthz?probe=%00", None, "probe"),
    ("GET", "/metrics?x=%00", None, "x"),
    ("GET", "/no/such%00/path", None, "path"),
]


async def test_a_nul_anywhere_is_a_400_naming_the_field_on_every_endpoint(
    url: str, backend: str
) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as client:
        for method, path, body, field in REFUSED:
            async with client.request(
                method, URL(url + path, encoded=True), json=body, headers=auth()
            ) as response:
                answer = await response.json()
                assert response.status == 400, (backend, method, path, answer)
                assert answer["field"] == field, (method, path, answer)
                assert "NUL" in answer["error"], answer
        # A raw NUL byte in a body (no JSON has one outside a string) names the body.
        async with client.post(
            f"{url}/api/jobs/nul.job/trigger", data=b'{"params": {}}\x00', headers=auth()
        ) as response:
            assert (response.status, (await response.json())["field"]) == (400, "body")
        # The escape of a backslash followed by "u0000" is no NUL: it goes on to the handler.
        async with client.post(
            f"{url}/api/jobs/nul.job/pause", data=b'{"reason": "C:\\\\u0000"}', headers=auth()
        ) as response:
            assert response.status == 200, await response.text()
        # Nothing reached the database to fail there: the instance reads and answers as before.
        async with client.get(f"{url}/api/jobs", headers=auth()) as response:
            assert response.status == 200
            [job] = (await response.json())["jobs"]
            assert job["name"] == "nul.job" and job["paused"]
        async with client.get(f"{url}/readyz") as response:
            assert response.status == 200
