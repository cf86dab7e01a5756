"""A hostile alert webhook on 127.0.0.1: it redirects, answers without end, trickles, or
accepts and never answers. And a second server, the host a redirect points at, that records
every request it receives (the alert sender must send it none).

Runs in the test's process (:func:`hostile`), or alone (``python -m tests.hostile_webhook``,
printing its base URL and the bystander's on one line), for measurements of the sender in a
process of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from aiohttp import web

HUGE_BYTES = 200 * 1024 * 1024
"""The size of the ``/huge`` answer: 200 MB."""
CHUNK = b"x" * 65536


@dataclass
class Bystander:
    """The host a redirect points at. Nothing should ever reach it."""

    url: str = ""
    hits: list[str] = field(default_factory=list)  # "METHOD /path" of every request

    async def handle(self, request: web.Request) -> web.Response:
        await request.read()
        self.hits.append(f"{request.method} {request.path}")
        return web.Response(status=204)


@dataclass
class Hostile:
    """The webhook's endpoints, under :attr:`url`: ``/redirect/<3xx>`` (to the bystander),
    ``/redirect/loop`` (a 307 to itself), ``/huge`` (200, a 200 MB body), ``/trickle``
    (200, then a byte a second), ``/slow-headers`` (no answer at all, the request read).
    :attr:`silent` is a raw TCP port that accepts connections and never reads nor answers."""

    bystander: Bystander
    url: str = ""
    silent: str = ""
    posts: list[str] = field(default_factory=list)  # the path of every request received
    huge_sent: list[int] = field(default_factory=list)  # bytes of /huge written, per answer

    async def redirect(self, request: web.Request) -> web.Response:
        self.posts.append(request.path)
        code = request.match_info["code"]
        if code == "loop":
            return web.Response(status=307, headers={"Location": f"{self.url}/redirect/loop"})
        return web.Response(status=int(code), headers={"Location": f"{self.bystander.url}/stolen"})

    async def huge(self, request: web.Request) -> web.StreamResponse:
        self.posts.append(request.path)
        response = web.StreamResponse(status=200)
        response.content_length = HUGE_BYTES
        await response.prepare(request)
        sent = 0
        try:
            while sent < HUGE_BYTES:
                await response.write(CHUNK)
                sent += len(CHUNK)
        except (ConnectionError, RuntimeError):  # the sender hung up: what it should do
            pass
        finally:
            self.huge_sent.append(sent)
        return response

    async def trickle(self, request: web.Request) -> web.StreamResponse:
        self.posts.append(request.path)
        response = web.StreamResponse(status=200)
        await response.prepare(request)
        with contextlib.suppress(ConnectionError, RuntimeError):
            while True:
                await response.write(b"x")
                await asyncio.sleep(1.0)
        return response

    async def slow_headers(self, request: web.Request) -> web.Response:
        self.posts.append(request.path)
        await request.read()
        await asyncio.sleep(3600)
        return web.Response(status=204)


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    # shutdown_timeout: the handlers that never answer must not hold the test's teardown.
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


@contextlib.asynccontextmanager
async def hostile() -> AsyncIterator[Hostile]:
    """Serve a :class:`Hostile` webhook and its :class:`Bystander`, each on a port of its own."""
    bystander = Bystander()
    target = web.Application()
    target.router.add_route("*", "/{tail:.*}", bystander.handle)
    target_runner, bystander.url = await _serve(target)

    hook = Hostile(bystander)
    app = web.Application()
    app.router.add_post("/redirect/{code}", hook.redirect)
    app.router.add_post("/huge", hook.huge)
    app.router.add_post("/trickle", hook.trickle)
    app.router.add_post("/slow-headers", hook.slow_headers)
    runner, hook.url = await _serve(app)

    held: list[asyncio.StreamWriter] = []

    async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # kept open, never read: the request sits in the socket's buffer

    silent = await asyncio.start_server(never_answer, "127.0.0.1", 0)
    hook.silent = f"http://127.0.0.1:{silent.sockets[0].getsockname()[1]}/hook"
    try:
        yield hook
    finally:
        for writer in held:
            writer.close()
        silent.close()
        await silent.wait_closed()
        await runner.cleanup()
        await target_runner.cleanup()


async def _main() -> None:
    async with hostile() as hook:
        print(hook.url, hook.bystander.url, hook.silent, flush=True)
        while True:  # until killed; the bystander's hits are printed as they come
            await asyncio.sleep(0.5)
            if hook.bystander.hits:
                print("BYSTANDER", *hook.bystander.hits, flush=True)
                hook.bystander.hits.clear()
            if hook.huge_sent:
                print("HUGE_SENT", *hook.huge_sent, flush=True)
                hook.huge_sent.clear()


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main())
    sys.exit(0)
