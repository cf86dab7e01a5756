"""Tokens of the admin API (issue 26, item 10): several admin tokens at once (rotation), read
tokens that read and never write, reads closed once a read token is set while the probes and
/metrics stay open, and a peer's failed attempts slowed whatever its successes."""

from __future__ import annotations

import time
from typing import Any

import aiohttp
import pytest
from slotcron import JobContext
from slotcron.jobs.registry import Registry, cron

from tests.http.conftest import auth, base_url
from tests.http.test_api import call

ADMIN = "admin-token-one-7c4e1f"
ROTATED = "admin-token-two-0b93aa"
READER = "read-only-token-5d21e8"
OTHER_READER = "read-only-token-9f0c33"
YEARLY = "0 0 1 1 *"

WRITES = [
    ("POST", "/api/jobs/tok.job/pause"),
    ("POST", "/api/jobs/tok.job/resume"),
    ("POST", "/api/jobs/tok.job/trigger"),
    ("POST", "/api/executions/1/restart"),
    ("POST", "/api/schedules"),
    ("PATCH", "/api/schedules/some-id"),
    ("DELETE", "/api/schedules/some-id"),
]
READS = [
    "/api/jobs",
    "/api/executions",
    "/api/instances",
    "/api/timeline?job=tok.job",
    "/api/changes",
    "/api/schedules",
]
OPEN = ["/healthz", "/readyz", "/metrics", "/", "/dashboard.js", "/dashboard.css"]


def token_jobs() -> Registry:
    registry = Registry()

    @cron(YEARLY, name="tok.job", registry=registry)
    async def job(ctx: JobContext) -> None:
        pass

    return registry


async def status_of(
    client: aiohttp.ClientSession, method: str, url: str, token: str | None = None
) -> tuple[int, Any]:
    headers = auth(token) if token is not None else None
    async with client.request(method, url, headers=headers) as response:
        body = await response.json() if response.content_type == "application/json" else None
        return response.status, body


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_every_admin_token_of_a_rotation_reads_and_writes(
    serve: Any, client: aiohttp.ClientSession
) -> None:
    service = await serve(list(token_jobs()), admin_token=f"{ADMIN},{ROTATED}")
    url = base_url(service)
    for token in (ADMIN, ROTATED):
        status, body, _ = await call(
            client, "POST", f"{url}/api/jobs/tok.job/pause", headers=auth(token)
        )
        assert status == 200, body
        await call(client, "POST", f"{url}/api/jobs/tok.job/resume", headers=auth(token))
        for path in READS:
            assert (await status_of(client, "GET", url + path, token))[0] == 200, path
    # Neither is a prefix of the other, nor a concatenation.
    for wrong in (ADMIN + ROTATED, f"{ADMIN},{ROTATED}", ADMIN[:-1]):
        status, body = await status_of(client, "POST", f"{url}/api/jobs/tok.job/pause", wrong)
        assert (status, body) == (403, {"error": "wrong admin token"})


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"], indirect=True)
async def test_a_read_token_reads_everything_and_writes_nothing_and_reads_need_a_token(
    serve: Any, client: aiohttp.ClientSession
) -> None:
    service = await serve(
        list(token_jobs()), admin_token=ADMIN, read_token=f"{READER},{OTHER_READER}"
    )
    url = base_url(service)
    for path in READS:
        for token in (READER, OTHER_READER, ADMIN):
            assert (await status_of(client, "GET", url + path, token))[0] == 200, (path, token)
        status, body = await status_of(client, "GET", url + path)
        assert status == 401, (path, body)
        assert "a read or admin token" in body["error"]
        assert (await status_of(client, "GET", url + path, "not-a-token-at-all"))[0] == 403
    for method, path in WRITES:
        status, body = await status_of(client, method, url + path, READER)
        assert status == 403, (path, body)
        assert "may only read" in body["error"], body
        assert (await status_of(client, method, url + path))[0] == 401, path
    for path in OPEN:
        assert (await status_of(client, "GET", url + path))[0] == 200, path
    # The write refused to the read token was not done; the admin token does it.
    jobs = (await status_of(client, "GET", f"{url}/api/jobs", READER))[1]["jobs"]
    assert [j["paused"] for j in jobs] == [False]
    status, _ = await status_of(client, "POST", f"{url}/api/jobs/tok.job/pause", ADMIN)
    assert status == 200


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_with_read_tokens_only_every_write_is_refused_and_reads_need_one(
    serve: Any, client: aiohttp.ClientSession
) -> None:
    service = await serve(list(token_jobs()), read_token=READER)
    url = base_url(service)
    assert (await status_of(client, "GET", f"{url}/api/jobs", READER))[0] == 200
    assert (await status_of(client, "GET", f"{url}/api/jobs"))[0] == 401
    for token in (READER, None):
        status, body = await status_of(client, "POST", f"{url}/api/jobs/tok.job/pause", token)
        assert status == 403 and "SCHEDULER_ADMIN_TOKEN" in body["error"]


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_a_success_does_not_reset_the_back_off_of_a_peers_failures(
    serve: Any, client: aiohttp.ClientSession, back_off: None
) -> None:
    service = await serve([], admin_token=ADMIN, read_token=READER)
    url = f"{base_url(service)}/api/executions"

    async def timed(token: str) -> tuple[int, float]:
        started = time.monotonic()
        status, _ = await status_of(client, "GET", url, token)
        return status, time.monotonic() - started

    assert (await timed(READER))[0] == 200  # the first answer's own costs are not the back-off's
    for _ in range(5):
        assert (await timed("guess-guess-guess-1"))[0] == 403
    # Slowed, a right token would wait the 2 s the peer's next failure waits.
    status, took = await timed(READER)
    assert status == 200 and took < 1.0, f"the right token is never slowed ({took:.2f} s)"
    status, took = await timed("guess-guess-guess-2")
    assert status == 403
    assert took >= 1.9, f"the next failure still waits its turn ({took:.2f} s)"
    status, took = await timed(ADMIN)
    assert status == 200 and took < 1.0, f"the right token is never slowed ({took:.2f} s)"


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_a_read_token_on_a_write_is_no_guess_and_costs_no_back_off(
    serve: Any, client: aiohttp.ClientSession, back_off: None
) -> None:
    service = await serve(list(token_jobs()), admin_token=ADMIN, read_token=READER)
    url = f"{base_url(service)}/api/jobs/tok.job/pause"
    took = []
    for _ in range(6):
        started = time.monotonic()
        assert (await status_of(client, "POST", url, READER))[0] == 403
        took.append(time.monotonic() - started)
    # Counted as guesses, the fourth to sixth would wait 0.5, 1 and 2 s.
    assert sum(took[3:]) < 1.5, took
