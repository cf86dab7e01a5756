"""A webhook for the alert tests: an aiohttp server on 127.0.0.1 that records every POST."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class Received:
    body: dict[str, Any]
    raw: bytes
    headers: dict[str, str]
    at: float  # time.time() on arrival


@dataclass
class Listener:
    """A webhook on 127.0.0.1 that records every POST; it answers ``fail_first`` of them 500."""

    url: str = ""
    fail_first: int = 0
    posts: list[Received] = field(default_factory=list)  # every POST, failed ones included
    accepted: list[Received] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        got = Received(json.loads(raw), raw, dict(request.headers), time.time())
        self.posts.append(got)
        if len(self.posts) <= self.fail_first:
            return web.Response(status=500, text="down on purpose")
        self.accepted.append(got)
        return web.Response(status=204)

    def events(self, event: str, job: str | None = None) -> list[dict[str, Any]]:
        return [
            r.body
            for r in self.accepted
            if r.body["event"] == event and (job is None or r.body["job"] == job)
        ]


@contextlib.asynccontextmanager
async def webhook() -> AsyncIterator[Listener]:
    """Serve a :class:`Listener` on a port the kernel picks, at ``/hook``."""
    hook = Listener()
    app = web.Application()
    app.router.add_post("/hook", hook.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    hook.url = f"http://127.0.0.1:{runner.addresses[0][1]}/hook"
    try:
        yield hook
    finally:
        await runner.cleanup()
