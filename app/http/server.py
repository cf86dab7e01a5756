"""The HTTP server, on the service's own event loop (aiohttp's AppRunner and TCPSite: no
thread, no signal handlers of its own; the service owns SIGTERM and SIGINT).

Started first in :meth:`Service.start`, so ``/healthz`` and ``/readyz`` answer while the
database is waited out; stopped in the last phase of shutdown, so ``/readyz`` says 503 for
the whole drain.
"""

from __future__ import annotations

import logging
from importlib import resources
from typing import TYPE_CHECKING

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from app.errors import ConfigError
from app.http.api import AdminApi
from app.http.auth import HostCheck, TokenCheck
from app.http.errors import json_errors
from app.http.probes import Probes
from app.metrics import InstanceCollector, PrometheusMetrics

if TYPE_CHECKING:
    from app.service import Service

log = logging.getLogger("slotcron.http")

MAX_BODY = 64 * 1024
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


class HttpServer:
    def __init__(self, service: Service, metrics: PrometheusMetrics) -> None:
        settings = service.settings
        assert settings.http_port is not None
        self.host = settings.http_host
        self.port = settings.http_port
        self.service = service
        metrics.registry.register(InstanceCollector(service))
        self.app = build_app(service, metrics)
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> None:
        runner = web.AppRunner(
            self.app, access_log=None, handle_signals=False, shutdown_timeout=SHUTDOWN_SECONDS
        )
        await runner.setup()
        try:
            await web.TCPSite(runner, self.host, self.port).start()
        except OSError as exc:
            await runner.cleanup()
            raise ConfigError(
                "SCHEDULER_HTTP_PORT", f"cannot listen on {self.url}: {exc.strerror or exc}"
            ) from None
        self._runner = runner
        bound = runner.addresses[0]
        self.port = int(bound[1])  # the port the kernel chose, when configured as 0
        log.info("http listening on %s", self.url)
        log.log(
            logging.INFO if self.service.settings.admin_token is not None else logging.WARNING,
            "%s",
            self.service.settings.admin_api_protection,
        )

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
            log.info("http stopped")


_PROBES = frozenset({"/healthz", "/readyz", "/metrics"})


def _host_guard(hosts: HostCheck) -> Middleware:
    """The API and the dashboard answer only to this server's own names (see
    :class:`HostCheck`); the probes answer to any, as a kubelet asks by pod IP or name."""

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path not in _PROBES:
            hosts.check(request)
        return await handler(request)

    return guard


def build_app(service: Service, metrics: PrometheusMetrics) -> web.Application:
    settings = service.settings
    auth = TokenCheck(settings.admin_token)
    hosts = HostCheck(settings.http_host, settings.http_allowed_hosts)
    probes = Probes(service, metrics.registry)
    api = AdminApi(service, auth)
    app = web.Application(middlewares=[json_errors, _host_guard(hosts)], client_max_size=MAX_BODY)
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
    for path, (name, content_type) in _STATIC.items():
        app.router.add_get(path, _static(name, content_type))
    return app


def _static(name: str, content_type: str) -> Handler:
    body = resources.files("app.http").joinpath("static", name).read_bytes()

    async def serve(request: web.Request) -> web.Response:
        return web.Response(
            body=body, content_type=content_type, charset="utf-8", headers=_STATIC_HEADERS
        )

    return serve
