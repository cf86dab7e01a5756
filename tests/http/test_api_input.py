"""Bad input gets a 4xx JSON error naming the field: never a 500, never a traceback."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import aiohttp
import pytest
from slotcron.jobs.registry import Registry, cron

from tests.http.conftest import READ_TOKEN, TOKEN, auth, base_url

LONG = "x" * 201
DEEP = "[" * 40 + "]" * 40

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
    # Issue 13: every malformed value is a 400 naming the field, and nothing is stored.
    ("POST", "/api/jobs/input.job/trigger", '{"params": {"x": 1e400}}', 400, "body"),
    ("POST", "/api/jobs/input.job/trigger", '{"params": {"x": -1e400}}', 400, "body"),
    ("POST", "/api/jobs/input.job/trigger", '{"params": {"x": "a\\u0000b"}}', 400, "params"),
    ("POST", "/api/jobs/input.job/trigger", '{"params": {"a\\u0000": 1}}', 400, "params"),
    ("POST", "/api/jobs/input.job/trigger", '{"params": {"x": "\\ud800"}}', 400, "params"),
    ("POST", "/api/jobs/input.job/trigger", '{"params": ' + DEEP + "}", 400, "params"),
    ("POST", "/api/jobs/input.job/trigger", "[" * 60000 + "]" * 60000, 413, None),
    ("POST", "/api/jobs/input.job/trigger", '{"params": ' + "[" * 30000, 400, "body"),
    ("POST", "/api/jobs/input.job/pause", '{"reason": "a\\u0000"}', 400, "reason"),
    ("POST", "/api/jobs/a%00b/trigger", None, 400, "name"),
    ("GET", "/api/executions?job=a%00b", None, 400, "job"),
    ("GET", "/api/executions?since=0001-01-01T00:00:00%2B01:00&limit=1", None, 200, None),
    ("GET", "/api/executions?since=999999999d", None, 200, None),
    ("GET", "/api/executions?since=9999-12-31T23:59:59-05:00", None, 400, "since"),
    ("GET", "/api/executions?offset=99999999999999999999999", None, 400, "offset"),
    ("GET", "/api/executions?limit=%EF%BC%95", None, 400, "limit"),
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
        assert "Traceback" not in text, text
        assert status == 200 or "error" in payload, text
    assert not wrong, "\n".join(wrong)
    async with client.get(f"{url}/api/executions", headers=auth()) as response:
        assert (await response.json())["executions"] == [], "a refused request stored something"


async def raw_request(url: str, head: bytes) -> tuple[int, bytes]:
    """Send ``head`` as is (aiohttp's client will not send undecodable headers)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(head)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    status = int(answer.split(b" ", 2)[1])
    return status, answer.partition(b"\r\n\r\n")[2]


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_an_undecodable_authorization_header_is_a_400_naming_it_not_a_traceback(
    serve: Any, caplog: pytest.LogCaptureFixture
) -> None:
    service = await serve([], admin_token=TOKEN, read_token=READ_TOKEN)
    status, body = await raw_request(
        base_url(service),
        b"GET /api/executions HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
        b"Authorization: Bearer \xff\xfe\r\n\r\n",
    )
    assert status == 400, body
    assert json.loads(body)["field"] == "Authorization"
    assert "Traceback" not in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_the_api_answers_only_to_its_own_host_names_and_the_probes_to_any(
    serve: Any, client: aiohttp.ClientSession
) -> None:
    service = await serve([], http_allowed_hosts=["cron.example.com"])
    url = base_url(service)
    answers = {}
    for host in (
        "evil.example",
        "evil.example:80",
        "localhost",
        "localhost:8080",
        "127.0.0.1:1",
        "[::1]:8080",
        "cron.example.com",
        "CRON.EXAMPLE.COM:443",
    ):
        async with client.get(f"{url}/api/executions", headers={"Host": host}) as response:
            answers[host] = response.status
    async with client.get(f"{url}/", headers={"Host": "evil.example"}) as response:
        answers["dashboard evil.example"] = response.status
        assert (await response.json())["field"] == "Host"
    async with client.get(f"{url}/healthz", headers={"Host": "evil.example"}) as response:
        answers["healthz evil.example"] = response.status
    assert answers == {
        "evil.example": 421,
        "evil.example:80": 421,
        "localhost": 200,
        "localhost:8080": 200,
        "127.0.0.1:1": 200,
        "[::1]:8080": 200,
        "cron.example.com": 200,
        "CRON.EXAMPLE.COM:443": 200,
        "dashboard evil.example": 421,
        "healthz evil.example": 200,
    }


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_failed_token_attempts_are_logged_rate_limited_and_slowed_per_peer(
    serve: Any,
    client: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
    back_off: None,
) -> None:
    service = await serve([], admin_token=TOKEN, read_token=READ_TOKEN)
    url = base_url(service)
    async with client.get(f"{url}/api/executions", headers=auth()) as response:
        assert response.status == 200  # the first answer's own costs are not the back-off's
    took = []
    for _ in range(5):
        started = time.monotonic()
        async with client.get(f"{url}/api/executions", headers=auth("wrong")) as response:
            assert response.status == 403
        took.append(time.monotonic() - started)
    lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(lines) == 1, "one line per peer per 10 s, not one per attempt"
    assert "a wrong token" in lines[0] and "127.0.0.1" in lines[0]
    assert "wrong" not in lines[0].replace("a wrong token", ""), "the token given is not logged"
    assert max(took[:3]) < 0.4, f"the first few failures are answered at once: {took}"
    assert took[3] >= 0.45 and took[4] >= 0.95, f"repeated failures are slowed, doubling: {took}"
    started = time.monotonic()
    async with client.get(f"{url}/api/executions", headers=auth()) as response:
        assert response.status == 200
    # Slowed, it would wait the 2 s the peer's next failure waits.
    assert time.monotonic() - started < 1.0, "the right token is never slowed"
