"""The dashboard's slot timeline and its cheap reads, beside the admin API.

``GET /api/timeline?job=A&job=B&limit=100&next=1`` → ``{"timelines": [{"job", "known",
"paused", "next_slots": [...], "slots": [cell, ...]}, ...], "limit"}``: for each job asked (a
schedule id works the same way: it is the ``job`` of its executions), its last ``limit``
slots, newest first, each slot as its latest attempt (``id``, ``slot``, ``status``,
``attempt``, ``trigger``, ``instance_id``, ``lag_ms``, ``duration_ms``), and its next ``next``
slots not yet decided, with ``next_notes`` (``{slot: why}``: those that will be recorded
``SKIPPED``, by an operator's skip or the job's calendar) and ``skips`` (``[{"at", "reason"}]``:
the upcoming slots an operator skipped). A ``SKIPPED`` or ``MISSED`` cell has its ``reason``.
``job`` repeats (a job name may hold a comma); one request serves a
page of jobs, with one bounded query per job.

``GET /api/executions/{id}`` → one execution, as in ``/api/executions`` (what a timeline cell
opens).

``GET /api/changes`` → ``{"marker": "..."}``, an opaque value that changes when executions or
jobs may have changed: the dashboard polls it and refetches its listings only when it moves.

All three are reads: they need a token (read or admin) once one is configured, as the other reads.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from aiohttp import web

from slotcron.http.auth import TokenCheck
from slotcron.http.errors import ApiError
from slotcron.http.reads import AdminReads
from slotcron.jobs.calendars import excluded
from slotcron.jobs.registry import Job
from slotcron.records import execution_json
from slotcron.store import timeline as store
from slotcron.store.database import Database
from slotcron.store.skips import skip_reason
from slotcron.text import iso

if TYPE_CHECKING:
    from slotcron.instance import Instance

MAX_JOBS = 100
"""Jobs per timeline request: a dashboard page, not the whole cluster."""
DEFAULT_LIMIT = 100
MAX_LIMIT = 500
MAX_NEXT = 20
MAX_NAME = 200  # as the jobs table
_MAX_ID = 2**63 - 1


class TimelineApi:
    def __init__(self, instance: Instance, auth: TokenCheck, reads: AdminReads) -> None:
        self.instance = instance
        self.auth = auth
        # The HTTP server has its own loop: reads go through the admin plane's own pool.
        self.reads = reads
        self._code_jobs: dict[str, Job] = {job.name: job for job in instance.jobs}

    def register(self, app: web.Application) -> None:
        """Add the routes (one line in the server's route table)."""
        app.router.add_get("/api/timeline", self.timeline)
        app.router.add_get("/api/changes", self.changes)
        app.router.add_get("/api/executions/{id}", self.execution)

    async def timeline(self, request: web.Request) -> web.Response:
        self.auth.read(request)
        names = _names(request)
        limit = _integer(request, "limit", DEFAULT_LIMIT, high=MAX_LIMIT, low=1)
        upcoming = _integer(request, "next", 1, high=MAX_NEXT, low=0)

        async def produce(db: Database) -> dict[str, Any]:
            found = await store.timelines(db, names, limit=limit)
            return {"timelines": [self._json(t, upcoming) for t in found], "limit": limit}

        key = f"timeline:{limit}:{upcoming}:" + "\x00".join(names)
        return await self.reads.respond(request, key, produce)

    async def changes(self, request: web.Request) -> web.Response:
        self.auth.read(request)
        _only(request, ())

        async def produce(db: Database) -> dict[str, Any]:
            return {"marker": await store.change_marker(db)}

        return await self.reads.respond(request, "changes", produce)

    async def execution(self, request: web.Request) -> web.Response:
        self.auth.read(request)
        _only(request, ())
        text = request.match_info["id"]
        if not text.isascii() or not text.isdigit() or not 1 <= int(text) <= _MAX_ID:
            raise ApiError(
                400, f"execution id must be a positive whole number, got {text!r}", field="id"
            )

        async def produce(db: Database) -> dict[str, Any]:
            record = await store.execution(db, int(text))
            if record is None:
                raise ApiError(404, f"no execution with id {text}", field="id")
            return execution_json(record)

        return await self.reads.respond(request, f"execution:{int(text)}", produce)

    def _next_slots(self, found: store.JobTimeline, count: int) -> list[datetime]:
        """The slot the cluster expects next, then the ones after it by the job's schedule when
        this instance has its code (a job only another version knows shows its next slot)."""
        if count == 0 or found.next_slot is None:
            return []
        slots = [found.next_slot]
        job = self._code_jobs.get(found.job)
        if job is not None:
            schedule = job.schedule(self.instance.settings.timezone)
            while len(slots) < count:
                slots.append(schedule.next_after(slots[-1]))
        return slots

    def _json(self, found: store.JobTimeline, upcoming: int) -> dict[str, Any]:
        slots = self._next_slots(found, upcoming)
        return {
            "job": found.job,
            "known": found.known,
            "paused": found.paused,
            "next_slots": [iso(s) for s in slots],
            "next_notes": self._notes(found, slots),
            "skips": [{"at": iso(at), "reason": why} for at, why in found.skips],
            "slots": [_cell_json(c) for c in found.cells],
        }

    def _notes(self, found: store.JobTimeline, slots: list[datetime]) -> dict[str, str]:
        """Why some of the next ``slots`` will be recorded SKIPPED: an operator's skip, or a day
        the job's calendar excludes (when this instance has its code)."""
        notes: dict[str, str] = {}
        skipped = dict(found.skips)
        job = self._code_jobs.get(found.job)
        zone = (job.timezone if job else None) or self.instance.settings.timezone
        for slot in slots:
            if slot in skipped:
                notes[iso(slot)] = skip_reason(skipped[slot])
            elif job is not None and (why := excluded(job, slot, zone)) is not None:
                notes[iso(slot)] = why
        return notes


def _cell_json(cell: store.SlotCell) -> dict[str, Any]:
    return {
        "id": cell.id,
        "slot": iso(cell.slot),
        "status": cell.status,
        "attempt": cell.attempt,
        "trigger": cell.trigger,
        "instance_id": cell.instance_id,
        "lag_ms": cell.lag_ms,
        "duration_ms": cell.duration_ms,
        "reason": cell.reason,
    }


def _only(request: web.Request, allowed: tuple[str, ...]) -> None:
    for key in request.query:
        if key not in allowed:
            choices = ", ".join(allowed) or "none"
            raise ApiError(400, f"unknown query parameter {key!r} (accepted: {choices})", field=key)


def _names(request: web.Request) -> list[str]:
    _only(request, ("job", "limit", "next"))
    names = request.query.getall("job", [])
    if not names:
        raise ApiError(400, "name at least one job: ?job=NAME (repeat job for more)", field="job")
    if len(names) > MAX_JOBS:
        raise ApiError(400, f"at most {MAX_JOBS} jobs per request, got {len(names)}", field="job")
    for name in names:
        if not name or len(name) > MAX_NAME:
            raise ApiError(400, f"a job name has 1 to {MAX_NAME} characters", field="job")
    return names


def _integer(request: web.Request, field: str, default: int, *, low: int, high: int) -> int:
    given = request.query.getall(field, [])
    if len(given) > 1:
        raise ApiError(400, f"query parameter {field!r} given more than once", field=field)
    if not given or given[0] == "":
        return default
    text = given[0]
    try:
        value = int(text)
    except ValueError:
        raise ApiError(400, f"{field} must be a whole number, got {text!r}", field=field) from None
    if not low <= value <= high:
        raise ApiError(400, f"{field} must be between {low} and {high}, got {value}", field=field)
    return value
