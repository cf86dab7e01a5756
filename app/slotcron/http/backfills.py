"""Backfills over HTTP, as ``slotcron backfill`` does (:mod:`slotcron.store.backfills`):

- ``POST /api/jobs/{name}/backfill`` (body ``{"from": T1, "to": T2, "rate": N, "dry_run": B}``)
  answers 201 with the backfill (200 and the slots it would run with ``dry_run``);
- ``GET /api/backfills[?job=NAME]``: the newest first (one job's), with their progress;
- ``DELETE /api/backfills/{id}``: cancel one.

Bad input is 400 naming the field; an unknown job or backfill 404; a paused job, or a backfill
already ended, 409."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from aiohttp import web

from slotcron.errors import UsageError
from slotcron.http.api import _audit, _body, _instant, _job_name, _operation, _query
from slotcron.http.auth import TokenCheck
from slotcron.http.bridge import ServiceBridge
from slotcron.http.errors import ApiError
from slotcron.store import backfills
from slotcron.store.backfills import check_rate

if TYPE_CHECKING:
    from slotcron.instance import Instance

MAX_ID = 2**63 - 1


class BackfillsApi:
    def __init__(self, instance: Instance, auth: TokenCheck, bridge: ServiceBridge) -> None:
        self.instance = instance
        self.auth = auth
        self.bridge = bridge

    def register(self, app: web.Application) -> None:
        app.router.add_post("/api/jobs/{name:.+}/backfill", self.create)
        app.router.add_get("/api/backfills", self.listing)
        app.router.add_delete("/api/backfills/{id}", self.cancel)

    async def create(self, request: web.Request) -> web.Response:
        self.auth.write(request)
        name = _job_name(request)
        body = await _body(request, allowed=("from", "to", "rate", "dry_run"))
        start, end = _moment(body, "from"), _moment(body, "to")
        rate = _rate(body.get("rate"))
        dry_run = body.get("dry_run", False)
        if not isinstance(dry_run, bool):
            raise ApiError(400, "dry_run must be true or false", field="dry_run")
        answer = await self._call(
            backfills.request(
                self.instance.db,
                job=name,
                start=start,
                end=end,
                rate=rate,
                dry_run=dry_run,
                now=self.instance.clock.now(),
                retention_days=self.instance.settings.history_retention_days,
            )
        )
        if dry_run:
            return web.json_response(answer)
        _audit(request, f"backfill {name} from {answer['from']} to {answer['to']}")
        return web.json_response(answer, status=201)

    async def listing(self, request: web.Request) -> web.Response:
        self.auth.read(request)
        job = _query(request, allowed=("job",)).get("job")
        if job is not None and not 0 < len(job) <= 200:
            raise ApiError(400, "a job name has 1 to 200 characters", field="job")
        found = await self.bridge.call(backfills.listing(self.instance.db, job=job))
        return web.json_response([b.as_dict() for b in found])

    async def cancel(self, request: web.Request) -> web.Response:
        self.auth.write(request)
        raw = request.match_info["id"]
        if not raw.isdigit() or not 0 < int(raw) <= MAX_ID:
            raise ApiError(400, "a backfill id is a positive whole number", field="id")
        settled = await self._call(
            backfills.cancel(self.instance.db, int(raw), now=self.instance.clock.now())
        )
        _audit(request, f"cancel backfill {raw}")
        return web.json_response({"id": int(raw), "status": "CANCELLED", "skipped": settled})

    async def _call(self, work: Any) -> Any:
        return await _operation(self.bridge, work, bad=_bad)


def _bad(exc: UsageError) -> ApiError:
    """The store's refusal as the API says it: the field it names (``--to``), else ``from``."""
    message = str(exc)
    field = next((f for f in ("rate", "to", "from") if f"--{f}" in message), "from")
    return ApiError(400, message.replace("--", ""), field=field)


def _moment(body: dict[str, Any], key: str) -> datetime:
    return _instant(body.get(key), key, "an ISO-8601 time")


def _rate(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ApiError(400, "rate must be a number of starts a second", field="rate")
    try:
        return check_rate(float(value))
    except UsageError as exc:
        raise ApiError(400, str(exc).removeprefix("--"), field="rate") from None
