"""Skipping one slot over HTTP, as ``slotcron skip`` / ``unskip`` do
(:mod:`slotcron.store.skips`): ``POST /api/jobs/{name}/skip`` (body ``{"at": T, "reason": R}``)
answers 201 with the skip (200 when that slot was already skipped: its reason is replaced), and
``DELETE /api/jobs/{name}/skip?at=T`` takes it back. A time that is not one of the job's slots is
400 naming ``at``; a slot already decided, or not skipped, is 409; an unknown job 404."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from aiohttp import web

from slotcron.http.api import _audit, _body, _instant, _job_name, _operation, _query, _reason
from slotcron.http.auth import TokenCheck
from slotcron.http.bridge import ServiceBridge
from slotcron.http.errors import ApiError
from slotcron.store import skips
from slotcron.text import iso

if TYPE_CHECKING:
    from slotcron.instance import Instance


class SkipsApi:
    def __init__(self, instance: Instance, auth: TokenCheck, bridge: ServiceBridge) -> None:
        self.instance = instance
        self.auth = auth
        self.bridge = bridge

    def register(self, app: web.Application) -> None:
        app.router.add_post("/api/jobs/{name:.+}/skip", self.skip)
        app.router.add_delete("/api/jobs/{name:.+}/skip", self.unskip)

    async def skip(self, request: web.Request) -> web.Response:
        self.auth.write(request)
        name = _job_name(request)
        body = await _body(request, allowed=("at", "reason"))
        at = _at(body.get("at"))
        reason = _reason(body)
        done = await self._call(
            skips.skip(
                self.instance.db,
                job=name,
                at=at,
                reason=reason,
                now=self.instance.clock.now(),
            )
        )
        _audit(request, f"skip {name} at {iso(done.at)}")
        answer = {"job": name, "at": iso(done.at), "reason": done.reason, "skipped": True}
        return web.json_response(answer, status=201 if done.created else 200)

    async def unskip(self, request: web.Request) -> web.Response:
        self.auth.write(request)
        name = _job_name(request)
        at = _at(_query(request, allowed=("at",)).get("at"))
        await _body(request, allowed=())
        await self._call(skips.unskip(self.instance.db, job=name, at=at))
        _audit(request, f"unskip {name} at {iso(at)}")
        return web.json_response({"job": name, "at": iso(at), "skipped": False})

    async def _call(self, work: Any) -> Any:
        return await _operation(
            self.bridge, work, bad=lambda exc: ApiError(400, str(exc), field="at")
        )


def _at(value: Any) -> datetime:
    return _instant(value, "at", "the slot's time, ISO-8601")
