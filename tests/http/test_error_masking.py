"""Every HTTP API error body is masked: whatever secret shape its message quotes (a client's
input echoed back, a driver's error text) comes out as ``***``, in the same JSON shape."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from slotcron.http.errors import ApiError, json_errors
from sqlalchemy.exc import OperationalError

from tests.test_masking import SECRET, SHAPES


async def refuse(request: web.Request) -> web.Response:
    """Echoes the client's input, as bad-input messages do."""
    raise ApiError(400, f"bad input: {request.query['text']}", field="params.token")


async def database_down(request: web.Request) -> web.Response:
    """Fails as a driver does, its message quoting what it was given."""
    raise OperationalError("SELECT 1", {}, ConnectionError(request.query["text"]))


@pytest.fixture
async def base_url() -> AsyncIterator[str]:
    app = web.Application(middlewares=[json_errors])
    app.router.add_get("/refuse", refuse)
    app.router.add_get("/down", database_down)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def fetch(url: str, text: str) -> tuple[int, Any]:
    async with (
        asyncio.timeout(10),
        aiohttp.ClientSession() as client,
        client.get(url, params={"text": text}) as response,
    ):
        return response.status, await response.json()


@pytest.mark.parametrize(("text", "kept"), SHAPES, ids=[kept for _, kept in SHAPES])
async def test_every_secret_shape_is_masked_in_an_api_error_body(
    base_url: str, text: str, kept: str
) -> None:
    status, body = await fetch(f"{base_url}/refuse", text)
    assert status == 400 and body["field"] == "params.token"
    assert SECRET not in body["error"] and kept in body["error"], body
    status, body = await fetch(f"{base_url}/down", text)
    assert status == 503 and body["error"].startswith("database unavailable: ")
    assert SECRET not in body["error"] and kept in body["error"], body
