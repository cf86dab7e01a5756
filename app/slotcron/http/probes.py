"""What Kubernetes and Prometheus ask: liveness, readiness, metrics.

``/healthz`` answers while the service's event loop does: a blocked loop answers nothing
within :data:`HEALTH_TIMEOUT` (503), or the probe times out first. ``/readyz`` is 200 only
while the instance is running (not starting, not draining) and the database answers within
:data:`READY_TIMEOUT`; it turns 503 at phase 1 of shutdown, so a load balancer stops sending
work while the runs drain.

``/metrics`` is rendered on a worker thread, never on the scheduler's loop, and one rendering
is shared by every scrape for :data:`METRICS_FRESH_SECONDS` (scrapes that arrive while it is
being made wait for it): any number of scrapers cost at most one rendering a second.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from slotcron.http.bridge import ServiceBridge
from slotcron.lifeline.outage import DB_ERRORS, describe
from slotcron.status import InstanceState

if TYPE_CHECKING:
    from slotcron.instance import Instance

READY_TIMEOUT = 2.0
"""Seconds the readiness check waits for the database (keep the probe's timeoutSeconds above)."""


HEALTH_TIMEOUT = 5.0
"""Seconds ``/healthz`` waits for the service's event loop to answer (it runs on another)."""

METRICS_FRESH_SECONDS = 1.0
"""How long one rendering of ``/metrics`` answers every scraper."""


async def _nothing() -> None:
    return None


class Probes:
    """Served on the HTTP thread; what they ask of the service runs on the service's loop
    (through ``bridge``), so ``/healthz`` still says whether *that* loop answers."""

    def __init__(
        self, instance: Instance, registry: CollectorRegistry, bridge: ServiceBridge
    ) -> None:
        self.instance = instance
        self.registry = registry
        self.bridge = bridge
        self._ping: asyncio.Task[str | None] | None = None
        self.exposition = Exposition(registry)

    async def healthz(self, request: web.Request) -> web.Response:
        instance = self.instance
        try:
            async with asyncio.timeout(HEALTH_TIMEOUT):
                await self.bridge.call(_nothing())
        except TimeoutError:
            body = {"status": "event loop not answering", "instance": instance.instance_id}
            return web.json_response(body, status=503)
        return web.json_response(
            {"status": "ok", "instance": instance.instance_id, "state": instance.state}
        )

    async def readyz(self, request: web.Request) -> web.Response:
        state = self.instance.state
        problem = await self.bridge.call(self._database_problem())
        # A background loop that failed recently (it is being restarted) is named here.
        roles = [p for role in self.instance.roles if (p := role.problem) is not None]
        replication = self.instance.reconnection.replication
        if state != InstanceState.RUNNING or problem is not None or roles:
            body: dict[str, object] = {
                "status": "not ready",
                "state": state,
                "database": problem or "ok",
            }
            if roles:
                body["roles"] = roles
            if replication is not None:
                body["replication"] = replication.describe()
            return web.json_response(body, status=503)
        ready: dict[str, object] = {"status": "ready", "state": state, "database": "ok"}
        if replication is not None:
            # Ready either way: said so an operator sees what a failover would cost.
            ready["replication"] = replication.describe()
        return web.json_response(ready)

    async def _database_problem(self) -> str | None:
        """None when the database answered in time, else why not. Concurrent probes share one
        round trip, so a hung database cannot pile up connections."""
        if self._ping is None or self._ping.done():
            self._ping = asyncio.create_task(self._ping_once())
        return await asyncio.shield(self._ping)

    async def _ping_once(self) -> str | None:
        if self.instance.db.read_only:
            # It answers, but refuses our writes: no slot can be claimed here.
            return "read-only: the database refuses writes (a standby, or a demoted primary)"
        try:
            async with asyncio.timeout(READY_TIMEOUT):
                await self.instance.db.ping()
        except TimeoutError:
            return f"no answer within {READY_TIMEOUT:g} s"
        except DB_ERRORS as exc:
            return describe(exc)
        return None

    async def metrics(self, request: web.Request) -> web.Response:
        body, content_type = await self.exposition.render(request.headers.get("Accept", ""))
        return web.Response(body=body, headers={"Content-Type": content_type})


@dataclass(frozen=True)
class _Rendering:
    body: bytes
    at: float


class Exposition:
    """The registry's text, rendered on a worker thread (the counters are prometheus-client's,
    safe to read from any thread; the instance's own figures are plain attributes) and kept
    for :data:`METRICS_FRESH_SECONDS`, one rendering per format (Prometheus text, OpenMetrics).
    Lives on the HTTP server's loop."""

    def __init__(self, registry: CollectorRegistry, fresh: float = METRICS_FRESH_SECONDS) -> None:
        self.registry = registry
        self.fresh = fresh
        self.renderings = 0
        """How many times the text was made (what scrapers cost)."""
        self._kept: dict[str, _Rendering] = {}
        self._flights: dict[str, asyncio.Future[_Rendering]] = {}

    async def render(self, accept: str) -> tuple[bytes, str]:
        """The text for a scraper that sent ``accept``, and its content type."""
        encode, content_type = choose_encoder(accept)
        kept = self._kept.get(content_type)
        if kept is None or time.monotonic() - kept.at > self.fresh:
            flight = self._flights.get(content_type)
            if flight is None:
                flight = asyncio.ensure_future(self._render(encode, content_type))
                self._flights[content_type] = flight
                flight.add_done_callback(lambda _: self._flights.pop(content_type, None))
            kept = await asyncio.shield(flight)
        return kept.body, content_type

    async def _render(self, encode: Callable[[CollectorRegistry], bytes], kind: str) -> _Rendering:
        body = await asyncio.to_thread(encode, self.registry)
        self.renderings += 1
        rendering = self._kept[kind] = _Rendering(body, time.monotonic())
        return rendering
