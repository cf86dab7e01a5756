"""Runtime schedules over HTTP (docs/reference/http.md).

``GET /api/schedules?task=&limit=&offset=`` → ``{"schedules": [...], "limit", "offset",
"next_offset"}``, each schedule listed with its ``last_status`` and ``last_run_at`` besides (what
the dashboard shows); ``GET /api/schedules/{id}``; ``POST /api/schedules`` (a schedule's
fields) → 201 and the schedule; ``PATCH /api/schedules/{id}`` (the fields to change) → 200 and
the schedule; ``DELETE /api/schedules/{id}`` → 204. An id may hold "/" (a generated one does): the
client percent-encodes it.

The checks are :mod:`slotcron.jobs.schedules`' (400 naming the field, nothing written); an unknown
id is
404; an id already taken, and updating or removing a ``@cron``/``@every`` job, are 409. An
unreadable schedule (a row broken outside slotcron) is listed with its ``error``. A task is
known when this instance registers it or any instance recorded it. Reads use the admin plane's
own pool; writes need the token and run on the service's database, as the other writes.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlencode

from aiohttp import web

from slotcron.errors import InvalidJobError, NotFound, Refused
from slotcron.http.api import _audit, _body, _check_text, _integer, _query
from slotcron.http.auth import TokenCheck
from slotcron.http.bridge import ServiceBridge
from slotcron.http.errors import ApiError
from slotcron.http.reads import AdminReads
from slotcron.jobs.schedule_fields import check_text
from slotcron.jobs.schedules import CHANGEABLE, FIELDS, IdTaken, ScheduleRecord, schedule_json
from slotcron.store import due
from slotcron.store import schedules as store
from slotcron.store.database import Database
from slotcron.text import iso

if TYPE_CHECKING:
    from slotcron.instance import Instance

T = TypeVar("T")

DEFAULT_LIMIT = 50
MAX_LIMIT = 500
MAX_OFFSET = 10_000_000
MAX_ID = 200  # as the jobs table


class SchedulesApi:
    def __init__(
        self, instance: Instance, auth: TokenCheck, reads: AdminReads, bridge: ServiceBridge
    ) -> None:
        self.instance = instance
        self.auth = auth
        self.reads = reads
        self.bridge = bridge

    def register(self, app: web.Application) -> None:
        """Add the routes (one line in the server's route table)."""
        app.router.add_get("/api/schedules", self.listing)
        app.router.add_post("/api/schedules", self.add)
        app.router.add_get("/api/schedules/{id:.+}", self.one)
        app.router.add_patch("/api/schedules/{id:.+}", self.change)
        app.router.add_delete("/api/schedules/{id:.+}", self.remove)

    # Reads

    async def listing(self, request: web.Request) -> web.Response:
        self.auth.read(request)
        query = _query(request, allowed=("task", "limit", "offset"))
        task = query.get("task") or None
        if task is not None and len(task) > MAX_ID:
            raise ApiError(400, f"a task name has at most {MAX_ID} characters", field="task")
        limit = _integer(query, "limit", DEFAULT_LIMIT, low=1, high=MAX_LIMIT)
        offset = _integer(query, "offset", 0, low=0, high=MAX_OFFSET)
        key = "schedules?" + urlencode(sorted(query.items()))

        async def produce(db: Database) -> dict[str, Any]:
            # One more than asked: whether there is a next page, without counting the table.
            records = await store.list_schedules(db, task=task, limit=limit + 1, offset=offset)
            more = len(records) > limit
            page = records[:limit]
            # The page's latest outcomes: one more bounded query, never one per schedule.
            last = await store.last_runs(db, [r.spec.id for r in page])
            return {
                "schedules": [_listed(r, last.get(r.spec.id)) for r in page],
                "limit": limit,
                "offset": offset,
                "next_offset": offset + limit if more else None,
            }

        return await self.reads.respond(request, key, produce)

    async def one(self, request: web.Request) -> web.Response:
        self.auth.read(request)
        _query(request, allowed=())
        schedule_id = _id(request)

        lapse = self.instance.settings.lease_seconds

        async def produce(db: Database) -> dict[str, Any]:
            record = await _found(store.get(db, schedule_id))
            # Whether its slots are fired now, or wait for an instance with its task.
            live = await due.task_is_live(db, record.spec.task, lapse=lapse)
            return {**schedule_json(record), "task_live": live}

        return await self.reads.respond(request, f"schedule/{schedule_id}", produce)

    # Writes

    async def add(self, request: web.Request) -> web.Response:
        self.auth.write(request)
        body = await _body(request, allowed=FIELDS)
        settings = self.instance.settings
        records = await _checked(
            self.bridge.call(
                store.create(
                    self.instance.db,
                    [body],
                    default_timezone=settings.timezone,
                    by="api",
                    now=self.instance.clock.now(),
                )
            )
        )
        _audit(request, f"add schedule {records[0].spec.id}")
        return web.json_response(schedule_json(records[0]), status=201)

    async def change(self, request: web.Request) -> web.Response:
        self.auth.write(request)
        schedule_id = _id(request)
        body = await _body(request, allowed=CHANGEABLE)
        db = self.instance.db
        record = await _checked(
            self.bridge.call(
                store.update(db, schedule_id, body, now=self.instance.clock.now(), by="api")
            )
        )
        _audit(request, f"update schedule {schedule_id}")
        return web.json_response(schedule_json(record))

    async def remove(self, request: web.Request) -> web.Response:
        self.auth.write(request)
        schedule_id = _id(request)
        await _body(request, allowed=())
        now = self.instance.clock.now()
        await _checked(self.bridge.call(store.remove(self.instance.db, schedule_id, now=now)))
        _audit(request, f"remove schedule {schedule_id}")
        return web.Response(status=204)


def _listed(record: ScheduleRecord, last: store.LastRun | None) -> dict[str, Any]:
    """A schedule as listed: its contract fields, and what the dashboard shows beside them:
    ``last_status`` (its latest execution's, QUEUED aside, as ``/api/jobs`` reads a job's; null
    before its first) and ``last_run_at`` (that execution's slot)."""
    return {
        **schedule_json(record),
        "last_status": last.status if last is not None else None,
        "last_run_at": iso(last.scheduled_at) if last is not None else None,
    }


def _id(request: web.Request) -> str:
    schedule_id = request.match_info["id"]
    if not schedule_id or len(schedule_id) > MAX_ID:
        raise ApiError(400, f"a schedule id has 1 to {MAX_ID} characters", field="id")
    _check_text(schedule_id, "id")
    try:
        return check_text("?", "id", schedule_id)  # no control character: no id holds one
    except InvalidJobError as exc:
        raise ApiError(400, f"id {exc.problem}", field="id") from None


async def _found(work: Awaitable[T]) -> T:
    try:
        return await work
    except NotFound as exc:
        raise ApiError(404, str(exc), field="id") from None


async def _checked(work: Awaitable[T]) -> T:
    """A write's refusals in HTTP terms: bad input 400 naming the field, an unknown id 404, an
    id already taken or a code job 409."""
    try:
        return await _found(work)
    except InvalidJobError as exc:
        raise ApiError(400, str(exc), field=exc.field) from None
    except IdTaken as exc:
        raise ApiError(409, str(exc), field=exc.field) from None
    except Refused as exc:
        raise ApiError(409, str(exc)) from None
