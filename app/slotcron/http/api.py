"""The JSON admin API: the operator commands of the CLI, over HTTP, through the same store
functions (so the same rules: a COMPLETED slot is never restarted, a trigger needs a live
instance).

Reads: ``GET /api/jobs``, ``GET /api/executions`` (filters ``job``, ``status``, ``since``;
paging ``limit`` and ``offset`` (up to :data:`MAX_OFFSET`) or ``before``: the
``next_before`` of the previous page, as deep as it goes at the cost of one index seek),
``GET /api/instances``; each answered with an ``ETag`` (``If-None-Match`` gets 304 when
nothing changed). Writes: ``POST /api/jobs/{name}/trigger`` (body ``{"params": {...}}``),
``/pause`` (body ``{"reason": "..."}``), ``/resume``, ``POST /api/executions/{id}/restart``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Collection
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from aiohttp import web

from slotcron.errors import InvalidJobError, NotFound, QueueFull, Refused, UsageError
from slotcron.filters import parse_instant, parse_since, parse_status
from slotcron.http.auth import TokenCheck
from slotcron.http.bridge import ServiceBridge
from slotcron.http.errors import ApiError
from slotcron.http.reads import AdminReads
from slotcron.records import execution_json, instance_json, job_json, queued_json
from slotcron.store import operations
from slotcron.store.database import Database
from slotcron.store.history import ExecutionRecord, list_executions
from slotcron.store.registrations import list_instances
from slotcron.text import displayable, iso

if TYPE_CHECKING:
    from slotcron.instance import Instance

log = logging.getLogger("slotcron.http")

DEFAULT_LIMIT = 50
MAX_LIMIT = 500
MAX_NAME = 200  # as the jobs table
MAX_REASON = 400  # as the jobs table's paused_reason
_MAX_ID = 2**63 - 1
READS_KEY = web.AppKey("slotcron_reads", AdminReads)
MAX_OFFSET = 10_000
"""Deeper pages are read with ``before`` (keyset), which costs the same at any depth."""


def cursor(record: ExecutionRecord) -> str:
    """The ``before`` of the page after ``record``: its slot and id."""
    return f"{iso(record.scheduled_at)}~{record.id}"


def parse_cursor(text: str) -> tuple[datetime, int]:
    slot, sep, row_id = text.rpartition("~")
    if not sep or not row_id.isascii() or not row_id.isdigit() or len(row_id) > 19:
        raise ValueError("expected the next_before of a previous page (<slot>~<id>)")
    try:
        moment = datetime.fromisoformat(slot.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError("expected the next_before of a previous page (<slot>~<id>)") from None
    if moment.tzinfo is None:
        raise ValueError("the slot of a cursor is in UTC (ends in Z)")
    return moment.astimezone(UTC), int(row_id)


class AdminApi:
    """Reads go through :class:`AdminReads` (their own pool, bounded, shared); writes are rare,
    need an admin token, and use the service's database (on SQLite its one writer lock)."""

    def __init__(
        self, instance: Instance, auth: TokenCheck, reads: AdminReads, bridge: ServiceBridge
    ) -> None:
        self.instance = instance
        self.auth = auth
        self.reads = reads
        self.bridge = bridge

    # Reads

    async def jobs(self, request: web.Request) -> web.Response:
        self.auth.read(request)
        _query(request, allowed=())
        now = self.instance.clock.now()
        live_within = self.instance.settings.lease_seconds

        async def produce(db: Database) -> dict[str, Any]:
            records = await operations.list_jobs(db, now=now, live_within=live_within)
            return {"jobs": [job_json(r) for r in records]}

        return await self.reads.respond(request, "jobs", produce)

    async def executions(self, request: web.Request) -> web.Response:
        self.auth.read(request)
        query = _query(request, allowed=("job", "status", "since", "limit", "offset", "before"))
        job = query.get("job") or None
        if job is not None and len(job) > MAX_NAME:
            raise ApiError(400, f"a job name has at most {MAX_NAME} characters", field="job")
        status = _parsed(query, "status", parse_status)
        since = _parsed(query, "since", lambda text: parse_since(text, self.instance.clock.now()))
        limit = _integer(query, "limit", DEFAULT_LIMIT, low=1, high=MAX_LIMIT)
        offset = _integer(query, "offset", 0, low=0, high=MAX_OFFSET)
        before = _parsed(query, "before", parse_cursor)
        if before is not None and offset:
            raise ApiError(400, "give offset or before, not both", field="before")
        key = "executions?" + urlencode(sorted(query.items()))

        async def produce(db: Database) -> dict[str, Any]:
            # One more than asked: whether there is a next page, without counting the table.
            records = await list_executions(
                db,
                job=job,
                status=status,
                since=since,
                limit=limit + 1,
                offset=offset,
                before=before,
            )
            more = len(records) > limit
            page = records[:limit]
            return {
                "executions": [execution_json(r) for r in page],
                "limit": limit,
                "offset": offset,
                "next_offset": offset + limit if more and offset + limit <= MAX_OFFSET else None,
                "next_before": cursor(page[-1]) if more else None,
            }

        return await self.reads.respond(request, key, produce)

    async def instances(self, request: web.Request) -> web.Response:
        self.auth.read(request)
        _query(request, allowed=())

        async def produce(db: Database) -> dict[str, Any]:
            records = await list_instances(db)
            return {"instances": [instance_json(r) for r in records]}

        return await self.reads.respond(request, "instances", produce)

    # Writes

    async def trigger(self, request: web.Request) -> web.Response:
        self.auth.write(request)
        name = _job_name(request)
        body = await _body(request, allowed=("params",))
        params = body.get("params", {})
        if not isinstance(params, dict):
            raise ApiError(400, "params must be a JSON object", field="params")
        try:
            queued = await self.bridge.call(
                operations.trigger_live(
                    self.instance.db,
                    job=name,
                    params=params,
                    now=self.instance.clock.now(),
                    live_within=self.instance.settings.lease_seconds,
                )
            )
        except NotFound as exc:
            raise ApiError(404, str(exc), field="name") from None
        except InvalidJobError as exc:
            raise ApiError(400, exc.problem, field=exc.field) from None
        except QueueFull as exc:
            raise ApiError(429, str(exc)) from None
        except Refused as exc:
            raise ApiError(409, str(exc)) from None
        _audit(request, f"trigger {name}: queued execution {queued.execution_id}")
        return web.json_response(queued_json(queued), status=202)

    async def pause(self, request: web.Request) -> web.Response:
        self.auth.write(request)
        name = _job_name(request)
        body = await _body(request, allowed=("reason",))
        return await self._set_paused(request, name, True, _reason(body))

    async def resume(self, request: web.Request) -> web.Response:
        self.auth.write(request)
        name = _job_name(request)
        await _body(request, allowed=())
        return await self._set_paused(request, name, False, None)

    async def _set_paused(
        self, request: web.Request, name: str, paused: bool, reason: str | None
    ) -> web.Response:
        try:
            changed = await self.bridge.call(
                operations.set_paused(self.instance.db, job=name, paused=paused, reason=reason)
            )
        except NotFound as exc:
            raise ApiError(404, str(exc), field="name") from None
        if changed:
            _audit(request, f"{'pause' if paused else 'resume'} {name}")
        return web.json_response({"job": name, "paused": paused, "changed": changed})

    async def restart(self, request: web.Request) -> web.Response:
        self.auth.write(request)
        text = request.match_info["id"]
        if not text.isascii() or not text.isdigit():
            raise ApiError(400, f"execution id must be a whole number, got {text!r}", field="id")
        execution_id = int(text)
        if not 1 <= execution_id <= _MAX_ID:
            raise ApiError(400, f"execution id must be positive, got {execution_id}", field="id")
        await _body(request, allowed=())
        try:
            queued = await self.bridge.call(
                operations.restart(
                    self.instance.db, execution_id=execution_id, now=self.instance.clock.now()
                )
            )
        except NotFound as exc:
            raise ApiError(404, str(exc), field="id") from None
        except QueueFull as exc:
            raise ApiError(429, str(exc)) from None
        except Refused as exc:
            raise ApiError(409, str(exc)) from None
        _audit(request, f"restart {execution_id}: queued execution {queued.execution_id}")
        return web.json_response(queued_json(queued), status=202)


def _query(request: web.Request, *, allowed: Collection[str]) -> dict[str, str]:
    """The query parameters, each given at most once; an unknown one is an error (a typo must
    not silently widen a filter)."""
    values: dict[str, str] = {}
    for key, value in request.query.items():
        if key not in allowed:
            choices = ", ".join(allowed) or "none"
            shown = displayable(key, newlines=False)[:100]
            raise ApiError(
                400, f"unknown query parameter {shown!r} (accepted: {choices})", field=key[:100]
            )
        if key in values:
            raise ApiError(400, f"query parameter {key!r} given more than once", field=key)
        values[key] = _check_text(value, key)
    return values


def _parsed(query: dict[str, str], field: str, parse: Any) -> Any:
    text = query.get(field)
    if not text:
        return None
    try:
        return parse(text)
    except ValueError as exc:
        raise ApiError(400, f"{field}: {exc}", field=field) from None


def _integer(query: dict[str, str], field: str, default: int, *, low: int, high: int) -> int:
    text = query.get(field)
    if text is None or text == "":
        return default
    if not text.isascii() or not text.lstrip("+-").isdigit() or len(text) > 30:
        shown = displayable(text, newlines=False)[:40]
        raise ApiError(400, f"{field} must be a whole number, got {shown!r}", field=field)
    value = int(text)
    if not low <= value <= high:
        raise ApiError(400, f"{field} must be between {low} and {high}, got {value}", field=field)
    return value


def _reason(body: dict[str, Any]) -> str | None:
    """A body's optional ``reason`` (a pause's, a skip's), checked; None when blank."""
    reason = body.get("reason")
    if reason is not None and not isinstance(reason, str):
        raise ApiError(400, "reason must be a string", field="reason")
    if reason is not None and len(reason) > MAX_REASON:
        raise ApiError(400, f"reason has at most {MAX_REASON} characters", field="reason")
    return reason or None


def _job_name(request: web.Request) -> str:
    name = request.match_info["name"]
    if not name or len(name) > MAX_NAME:
        raise ApiError(400, f"a job name has 1 to {MAX_NAME} characters", field="name")
    return _check_text(name, "name")


MAX_DEPTH = 32
"""Nesting allowed in a request body (deeper JSON is refused before it can exhaust the stack)."""


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        # Stored as Infinity it would make every later listing invalid JSON.
        raise ValueError(f"number {text[:40]} is out of range")
    return value


def _check_value(value: Any, field: str) -> None:
    """Walk a parsed body (iteratively: depth is what is being checked) and refuse what the
    databases cannot store as given: NUL characters, lone surrogates, too deep a nesting."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ApiError(400, f"{field} is nested deeper than {MAX_DEPTH} levels", field=field)
        if isinstance(item, dict):
            for key, inner in item.items():
                _check_text(key, field)
                stack.append((inner, depth + 1))
        elif isinstance(item, list):
            stack.extend((inner, depth + 1) for inner in item)
        elif isinstance(item, str):
            _check_text(item, field)


def _check_text(text: str, field: str) -> str:
    if "\x00" in text:
        raise ApiError(400, f"{field} contains a NUL character", field=field)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ApiError(
            400, f"{field} contains a lone surrogate (not valid Unicode)", field=field
        ) from None
    return text


async def _body(request: web.Request, *, allowed: Collection[str]) -> dict[str, Any]:
    """The request's JSON object (an empty body is ``{}``); unknown keys are an error, and so is
    any value no database would store as sent (see :func:`_check_value`)."""
    raw = await request.read()
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw, parse_constant=_no_constants, parse_float=_finite)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}", field="body") from None
    except RecursionError:
        raise ApiError(
            400, f"request body is nested deeper than {MAX_DEPTH} levels", field="body"
        ) from None
    if not isinstance(value, dict):
        raise ApiError(400, "request body must be a JSON object", field="body")
    for key in value:
        if key not in allowed:
            choices = ", ".join(allowed) or "none"
            shown = displayable(key, newlines=False)[:100]
            raise ApiError(400, f"unknown field {shown!r} (accepted: {choices})", field=key[:100])
    for key, inner in value.items():
        _check_value(inner, key)
    return value


def _audit(request: web.Request, what: str) -> None:
    reads = request.app.get(READS_KEY)
    if reads is not None:
        reads.forget()
    log.info("admin API: %s (from %s)", what, request.remote)


def _instant(value: Any, field: str, wanted: str) -> datetime:
    """A body's or query's ISO-8601 time ``field`` (``wanted`` says what it is when missing)."""
    if value is None:
        raise ApiError(400, f"{field} is required: {wanted}", field=field)
    if not isinstance(value, str) or len(value) > 100:
        raise ApiError(400, f"{field} must be an ISO-8601 time", field=field)
    try:
        return parse_instant(value)
    except ValueError as exc:
        raise ApiError(400, f"{field} {exc}", field=field) from None


async def _operation(
    bridge: ServiceBridge, work: Any, *, bad: Callable[[UsageError], ApiError]
) -> Any:
    """Run an operator's write: an unknown job or id is 404 (``name``), bad input the error
    ``bad`` makes of it (400 naming the field), a refusal 409."""
    try:
        return await bridge.call(work)
    except NotFound as exc:
        raise ApiError(404, str(exc), field="name") from None
    except UsageError as exc:
        raise bad(exc) from None
    except Refused as exc:
        raise ApiError(409, str(exc)) from None
