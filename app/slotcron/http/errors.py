"""Every HTTP error is a small JSON object: ``{"error": "...", "field": "..."}``.

Bad input names the field it is about; nothing a client sends can produce a traceback, and no
message carries a secret: every body is masked (:func:`slotcron.masking.mask`: URL passwords,
``password=``, ``token=``, ``secret=``, ``api_key=``, ``Bearer``/``Basic`` credentials).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from slotcron.lifeline.outage import DB_ERRORS, describe
from slotcron.masking import mask

log = logging.getLogger("slotcron.http")


class ApiError(Exception):
    """A request the API refuses, with its status and (for bad input) the field at fault."""

    def __init__(
        self, status: int, message: str, *, field: str | None = None, headers: Any = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field
        self.headers = headers
        self.delay = 0.0
        """Seconds to wait before answering (repeated failed token attempts)."""


def error_response(
    status: int, message: str, *, field: str | None = None, headers: Any = None
) -> web.Response:
    body: dict[str, Any] = {"error": mask(message)}
    if field is not None:
        body["field"] = mask(field)
    return web.json_response(body, status=status, headers=headers)


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        if exc.delay > 0:
            await asyncio.sleep(exc.delay)
        return error_response(exc.status, exc.message, field=exc.field, headers=exc.headers)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        # aiohttp's own refusals (unknown path, wrong method, body too large) in our shape.
        return error_response(exc.status, exc.reason, headers=_allow(exc))
    except DB_ERRORS as exc:
        log.warning("%s %s: database unavailable: %s", request.method, request.path, describe(exc))
        return error_response(503, f"database unavailable: {describe(exc)}")
    except Exception:
        log.exception("%s %s failed", request.method, request.path)
        return error_response(500, "internal error (logged by the instance)")


def _allow(exc: web.HTTPException) -> dict[str, str] | None:
    allow = exc.headers.get("Allow")
    return {"Allow": allow} if allow else None
