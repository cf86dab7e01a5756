"""What Kubernetes and Prometheus ask: liveness, readiness, metrics.

``/healthz`` answers while the event loop does: a blocked loop answers nothing, and the probe
times out. ``/readyz`` is 200 only while the instance is running (not starting, not draining)
and the database answers within :data:`READY_TIMEOUT`; it turns 503 at phase 1 of shutdown, so
a load balancer stops sending work while the runs drain.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from app.outage import DB_ERRORS, describe
from app.status import InstanceState

if TYPE_CHECKING:
    from app.service import Service

READY_TIMEOUT = 2.0
"""Seconds the readiness check waits for the database (keep the probe's timeoutSeconds above)."""


class Probes:
    def __init__(self, service: Service, registry: CollectorRegistry) -> None:
        self.service = service
        self.registry = registry
        self._ping: asyncio.Task[str | None] | None = None

    async def healthz(self, request: web.Request) -> web.Response:
        service = self.service
        return web.json_response(
            {"status": "ok", "instance": service.instance_id, "state": service.state}
        )

    async def readyz(self, request: web.Request) -> web.Response:
        state = self.service.state
        problem = await self._database_problem()
        # A background loop that failed recently (it is being restarted) is named here.
        roles = [p for role in self.service.roles if (p := role.problem) is not None]
        if state != InstanceState.RUNNING or problem is not None or roles:
            body: dict[str, object] = {
                "status": "not ready",
                "state": state,
                "database": problem or "ok",
            }
            if roles:
                body["roles"] = roles
            return web.json_response(body, status=503)
        return web.json_response({"status": "ready", "state": state, "database": "ok"})

    async def _database_problem(self) -> str | None:
        """None when the database answered in time, else why not. Concurrent probes share one
        round trip, so a hung database cannot pile up connections."""
        if self._ping is None or self._ping.done():
            self._ping = asyncio.create_task(self._ping_once())
        return await asyncio.shield(self._ping)

    async def _ping_once(self) -> str | None:
        try:
            async with asyncio.timeout(READY_TIMEOUT):
                await self.service.db.ping()
        except TimeoutError:
            return f"no answer within {READY_TIMEOUT:g} s"
        except DB_ERRORS as exc:
            return describe(exc)
        return None

    async def metrics(self, request: web.Request) -> web.Response:
        encode, content_type = choose_encoder(request.headers.get("Accept", ""))
        return web.Response(body=encode(self.registry), headers={"Content-Type": content_type})
