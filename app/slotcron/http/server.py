"""The HTTP server, on an event loop and thread of its own (aiohttp's AppRunner; no signal
handlers of its own: the service owns SIGTERM and SIGINT).

The admin plane never shares the scheduler's loop: parsing, authenticating, reading and
encoding any number of requests cannot delay a timer of the scheduler by more than the
interpreter's thread switch interval (5 ms). What must run beside the scheduler (a write, the
readiness ping, the metrics) is handed to its loop through :class:`ServiceBridge`; the reads
have their own pool (:mod:`slotcron.http.reads`).

Started first when the instance opens, so ``/healthz`` and ``/readyz`` answer while the
database is waited out; stopped in the last phase of shutdown, so ``/readyz`` says 503 for
the whole drain.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Coroutine
from importlib import resources
from typing import Any, Protocol, TypeVar

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from aiohttp.web_protocol import RequestHandler

from slotcron.errors import ConfigError
from slotcron.http.api import READS_KEY, AdminApi
from slotcron.http.auth import HostCheck, TokenCheck
from slotcron.http.backfills import BackfillsApi
from slotcron.http.bridge import ServiceBridge
from slotcron.http.errors import ApiError, json_errors
from slotcron.http.probes import Probes
from slotcron.http.reads import AdminReads
from slotcron.http.schedules import SchedulesApi
from slotcron.http.skips import SkipsApi
from slotcron.http.timeline import TimelineApi
from slotcron.instance import Instance, ReplicationSeen
from slotcron.observe.metrics import InstanceCollector, PrometheusMetrics, Scraped
from slotcron.text import displayable

log = logging.getLogger("slotcron.http")

T = TypeVar("T")

MAX_BODY = 64 * 1024
KEEPALIVE_SECONDS = 10.0
"""How long a connection may sit without a whole request: idle between requests, silent after
connecting, or trickling its headers (aiohttp arms this timer at the connection's start and
closes the connection when no complete request arrived by then)."""
MAX_CONNECTIONS = 256
"""Connections served at once. A new one beyond it evicts the oldest idle connection, so a
flood of idle sockets can neither exhaust the process's file descriptors (jobs need them) nor
keep a probe out."""
HARD_MAX_CONNECTIONS = MAX_CONNECTIONS + 64
BACKLOG = 128
"""Also how many connections asyncio accepts in one burst before the cap sees them: at most
``HARD_MAX_CONNECTIONS + BACKLOG`` descriptors, for a moment, go to HTTP."""
"""Beyond this, with no idle connection to evict, a new connection is closed at once."""
SHUTDOWN_SECONDS = 2.0
"""How long stopping waits for requests in progress (the phases before it already drained)."""

_STATIC = {
    "/": ("dashboard.html", "text/html"),
    "/dashboard.js": ("dashboard.js", "text/javascript"),
    "/dashboard.css": ("dashboard.css", "text/css"),
}
# The dashboard's own files only, no inline script: a response that echoed job data could
# not run code, and no other site can frame the buttons.
_STATIC_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


class _Reconnection(ReplicationSeen, Protocol):
    @property
    def fenced(self) -> int: ...


class Served(Instance, Scraped, Protocol):
    """What the server reads of its instance: the handlers' view and the metrics' figures."""

    @property
    def reconnection(self) -> _Reconnection: ...


class HttpServer:
    def __init__(self, instance: Served, metrics: PrometheusMetrics) -> None:
        settings = instance.settings
        assert settings.http_port is not None
        self.host = settings.http_host
        self.port = settings.http_port
        self.instance = instance
        metrics.registry.register(InstanceCollector(instance))
        self.bridge = ServiceBridge()
        self.app = build_app(instance, metrics, self.bridge)
        self._runner: web.AppRunner | None = None
        self._listener: asyncio.Server | None = None
        self._thread: _LoopThread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> None:
        """Serve on a thread of its own (see :class:`ServiceBridge`), listening once this
        returns; a port that cannot be bound is a :class:`ConfigError`."""
        self.bridge.attach(asyncio.get_running_loop())
        thread = _LoopThread()
        thread.start()
        try:
            await thread.call(self._serve())
        except BaseException:
            await thread.close()
            raise
        self._thread = thread
        log.info("http listening on %s", self.url)
        log.log(
            logging.INFO if self.instance.settings.admin_token is not None else logging.WARNING,
            "%s",
            self.instance.settings.admin_api_protection,
        )

    async def _serve(self) -> None:
        runner = web.AppRunner(
            self.app,
            access_log=None,
            handle_signals=False,
            shutdown_timeout=SHUTDOWN_SECONDS,
            keepalive_timeout=KEEPALIVE_SECONDS,
        )
        await runner.setup()
        assert runner.server is not None
        try:
            self._listener = await asyncio.get_running_loop().create_server(
                _Capped(runner.server), self.host, self.port, reuse_address=True, backlog=BACKLOG
            )
        except OSError as exc:
            await runner.cleanup()
            raise ConfigError(
                "SCHEDULER_HTTP_PORT", f"cannot listen on {self.url}: {exc.strerror or exc}"
            ) from None
        self._runner = runner
        # The port the kernel chose, when configured as 0.
        self.port = int(self._listener.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        thread, self._thread = self._thread, None
        if thread is None:
            return
        try:
            await thread.call(self._cleanup())
        finally:
            await thread.close()
        log.info("http stopped")

    async def _cleanup(self) -> None:
        runner, self._runner = self._runner, None
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        if runner is not None:
            await runner.cleanup()


class _LoopThread:
    """An event loop on a daemon thread of its own: the HTTP server's."""

    def __init__(self) -> None:
        self.loop = _new_loop()
        self._thread = threading.Thread(target=self._run, name="slotcron-http", daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()

    def start(self) -> None:
        self._thread.start()

    async def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on this thread's loop and await its result from the caller's loop."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    async def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        await asyncio.to_thread(self._thread.join, 10)


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency except on Windows
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class _Capped:
    """The protocol factory of the listening socket: aiohttp's, with :data:`MAX_CONNECTIONS`
    enforced by evicting the oldest idle connection (one with no request in progress)."""

    def __init__(self, server: web.Server) -> None:
        self._server = server

    def __call__(self) -> asyncio.Protocol:
        handlers = self._server.connections
        if len(handlers) >= MAX_CONNECTIONS:
            idle = next((h for h in handlers if _idle(h)), None)
            if idle is not None:
                idle.force_close()
            elif len(handlers) >= HARD_MAX_CONNECTIONS:
                return _Refused()
        return self._server()


def _idle(handler: RequestHandler) -> bool:
    # aiohttp keeps the request being served here; None between requests and before the first.
    # A handler evicted earlier in the same burst of accepts has no transport any more, but is
    # counted until its connection_lost runs: it is not evicted again.
    return getattr(handler, "_current_request", True) is None and handler.transport is not None


class _Refused(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


_PROBES = frozenset({"/healthz", "/readyz", "/metrics"})


ADMIN_REQUESTS_PER_SECOND = 300.0
"""The pace of API and dashboard requests (the probes are not paced): beyond it requests wait
their turn, so the admin plane's share of the interpreter (which it shares with the scheduler's
thread) stays bounded however many clients read."""


def _paced(rate: float) -> Middleware:
    next_turn = 0.0

    @web.middleware
    async def pace(request: web.Request, handler: Handler) -> web.StreamResponse:
        nonlocal next_turn
        if request.path not in _PROBES:
            now = time.monotonic()
            turn = max(next_turn, now)
            next_turn = turn + 1 / rate
            if turn > now:
                await asyncio.sleep(turn - now)
        return await handler(request)

    return pace


def _host_guard(hosts: HostCheck) -> Middleware:
    """The API and the dashboard answer only to this server's own names (see
    :class:`HostCheck`); the probes answer to any, as a kubelet asks by pod IP or name."""

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path not in _PROBES:
            hosts.check(request)
        return await handler(request)

    return guard


@web.middleware
async def refuse_nul(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A NUL character anywhere in the path, a query parameter or a string of a JSON body is
    a 400 naming the field, on every endpoint, before any handler: PostgreSQL cannot store or
    compare one (a query holding one failed as "database unavailable"), and no name, id or
    value of slotcron ever holds one."""
    if "\x00" in request.path:
        where = next((k for k, v in request.match_info.items() if "\x00" in v), "path")
        raise ApiError(400, f"{where} contains a NUL character", field=where)
    for key, value in request.query.items():
        if "\x00" in key or "\x00" in value:
            shown = displayable(key, newlines=False)[:100]
            raise ApiError(400, f"{shown} contains a NUL character", field=shown)
    if request.body_exists:
        raw = await request.read()  # kept by aiohttp: the handler reads the same bytes
        # A NUL reaches a JSON string as a raw byte or as the escape \u0000.
        if b"\x00" in raw or b"\\u0000" in raw:
            field = _nul_field(raw)
            if field is not None:
                raise ApiError(400, f"{field} contains a NUL character", field=field)
    return await handler(request)


def _nul_field(raw: bytes) -> str | None:
    """The top-level field of a JSON body whose keys or strings hold a NUL (``body`` when the
    body is not an object, or not JSON: a raw NUL byte outside any string); None when no
    string holds one (an escaped backslash followed by ``u0000`` is no NUL)."""
    try:
        value = json.loads(raw, strict=False)
    except (ValueError, RecursionError):
        return "body" if b"\x00" in raw else None
    if not isinstance(value, dict):
        return "body" if _holds_nul(value) else None
    for key, inner in value.items():
        if "\x00" in key or _holds_nul(inner):
            return displayable(key, newlines=False)[:100]
    return None


def _holds_nul(value: Any) -> bool:
    stack = [value]  # iterative: a deep body must not exhaust the stack
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def build_app(
    instance: Instance, metrics: PrometheusMetrics, bridge: ServiceBridge
) -> web.Application:
    settings = instance.settings
    auth = TokenCheck(settings.admin_tokens, settings.read_tokens)
    hosts = HostCheck(settings.http_host, settings.http_allowed_hosts)
    probes = Probes(instance, metrics.registry, bridge)
    reads = AdminReads(instance.db)
    api = AdminApi(instance, auth, reads, bridge)

    async def close_reads(_app: web.Application) -> None:
        await reads.close()

    app = web.Application(
        middlewares=[
            json_errors,
            _host_guard(hosts),
            _paced(ADMIN_REQUESTS_PER_SECOND),
            refuse_nul,
        ],
        client_max_size=MAX_BODY,
    )
    app[READS_KEY] = reads
    app.on_cleanup.append(close_reads)
    app.router.add_get("/healthz", probes.healthz)
    app.router.add_get("/readyz", probes.readyz)
    app.router.add_get("/metrics", probes.metrics)
    app.router.add_get("/api/jobs", api.jobs)
    app.router.add_get("/api/executions", api.executions)
    app.router.add_get("/api/instances", api.instances)
    # A job name may hold any character, "/" included (the client percent-encodes it).
    app.router.add_post("/api/jobs/{name:.+}/trigger", api.trigger)
    app.router.add_post("/api/jobs/{name:.+}/pause", api.pause)
    app.router.add_post("/api/jobs/{name:.+}/resume", api.resume)
    app.router.add_post("/api/executions/{id}/restart", api.restart)
    TimelineApi(instance, auth, reads).register(app)
    SchedulesApi(instance, auth, reads, bridge).register(app)
    SkipsApi(instance, auth, bridge).register(app)
    BackfillsApi(instance, auth, bridge).register(app)
    for path, (name, content_type) in _STATIC.items():
        app.router.add_get(path, _static(name, content_type))
    return app


def _static(name: str, content_type: str) -> Handler:
    body = resources.files("slotcron.http").joinpath("static", name).read_bytes()

    async def serve(request: web.Request) -> web.Response:
        return web.Response(
            body=body, content_type=content_type, charset="utf-8", headers=_STATIC_HEADERS
        )

    return serve
