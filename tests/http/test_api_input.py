"""Bad input gets a 4xx JSON error naming the field: never a 500, never a traceback."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from app.registry import Registry, cron
from tests.http.conftest import TOKEN, auth, base_url

LONG = "x" * 201

# (method, path, body, status, field): body is sent as raw bytes when given.
CASES: list[tuple[str, str, str | bytes | None, int, str | None]] = [
    ("GET", "/api/executions?status=BOGUS", None, 400, "status"),
    ("GET", "/api/executions?status=FAILED&status=COMPLETED", None, 400, "status"),
    ("GET", "/api/executions?limit=0", None, 400, "limit"),
    ("GET", "/api/executions?limit=abc", None, 400, "limit"),
    ("GET", "/api/executions?limit=100000", None, 400, "limit"),
    ("GET", "/api/executions?offset=-1", None, 400, "offset"),
    ("GET", "/api/executions?since=yesterday", None, 400, "since"),
    ("GET", f"/api/executions?job={LONG}", None, 400, "job"),
    ("GET", "/api/executions?colour=red", None, 400, "colour"),
    ("GET", "/api/jobs?page=2", None, 400, "page"),
    ("POST", "/api/jobs/nope/trigger", None, 404, "name"),
    ("POST", "/api/jobs/nope/pause", None, 404, "name"),
    ("POST", "/api/jobs/nope/resume", None, 404, "name"),
    ("POST", f"/api/jobs/{LONG}/trigger", None, 400, "name"),
    ("POST", "/api/jobs/input.job/trigger", "{not json", 400, "body"),
    ("POST", "/api/jobs/input.job/trigger", "[1, 2]", 400, "body"),
    ("POST", "/api/jobs/input.job/trigger", '{"params": {"x": NaN}}', 400, "body"),
    ("POST", "/api/jobs/input.job/trigger", b"\xff\xfe", 400, "body"),
    ("POST", "/api/jobs/input.job/trigger", '{"params": [1]}', 400, "params"),
    ("POST", "/api/jobs/input.job/trigger", '{"parms": {}}', 400, "parms"),
    ("POST", "/api/jobs/input.job/pause", '{"reason": 5}', 400, "reason"),
    ("POST", "/api/jobs/input.job/pause", '{"reason": "' + "r" * 401 + '"}', 400, "reason"),
    ("POST", "/api/jobs/input.job/resume", '{"reason": "x"}', 400, "reason"),
    ("POST", "/api/executions/abc/restart", None, 400, "id"),
    ("POST", "/api/executions/0/restart", None, 400, "id"),
    ("POST", "/api/executions/-1/restart", None, 400, "id"),
    ("POST", "/api/executions/1.5/restart", None, 400, "id"),
    ("POST", "/api/executions/99999999999999999999999/restart", None, 400, "id"),
    ("POST", "/api/executions/123456/restart", None, 404, "id"),
    (
        "POST",
        "/api/jobs/input.job/trigger",
        "{" + '"params": {"k": "' + "v" * 70000 + '"}}',
        413,
        None,
    ),
    ("GET", "/api/nothing-here", None, 404, None),
    ("DELETE", "/api/jobs", None, 405, None),
    ("GET", "/api/jobs/input.job/trigger", None, 405, None),
]


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_bad_input_gets_a_4xx_json_error_naming_the_field(
    serve: Any, client: aiohttp.ClientSession
) -> None:
    registry = Registry()

    @cron("0 0 1 1 *", name="input.job", registry=registry)
    async def job() -> None:
        pass

    service = await serve(list(registry), admin_token=TOKEN)
    url = base_url(service)
    wrong = []
    for method, path, body, status, field in CASES:
        async with client.request(
            method,
            f"{url}{path}",
            headers=auth(),
            data=body.encode() if isinstance(body, str) else body,
        ) as response:
            text = await response.text()
            answer = (response.status, response.content_type)
            payload = await response.json() if response.content_type == "application/json" else {}
        if answer != (status, "application/json") or payload.get("field") != field:
            wrong.append(f"{method} {path[:60]} {body!r:.40}: {answer} {text[:200]}")
        assert "Traceback" not in text and "error" in payload, text
    assert not wrong, "\n".join(wrong)
