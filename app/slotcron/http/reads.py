"""The admin plane's reads, kept from ever costing a cron slot (issue 13, item 1).

The API's and the dashboard's reads run on their own small connection pool (never the
scheduler's, whose connections claim slots, renew leases and write outcomes), at most
:data:`CONCURRENCY` at a time, each within :data:`TIMEOUT`, with at most :data:`MAX_WAITING`
waiting (more are answered 503 with ``Retry-After`` at once). Identical reads share one query
(single flight) and its answer for :data:`FRESH_SECONDS`: a hundred open dashboard tabs cost
one query a second, not a hundred. Every answer carries an ``ETag``; a client that sends it
back in ``If-None-Match`` gets ``304 Not Modified`` with no body when nothing changed.

The answers kept are bounded by bytes, not by count (issue 26, item 9): at most
:data:`CACHE_BYTES` in all, an answer larger than :data:`MAX_CACHED_ANSWER` is never kept, and
answers older than :data:`FRESH_SECONDS` (which nothing serves any more) go first. A page of
schedules holding 64 KB params each is 32 MB: kept by count, 128 of them held gigabytes.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from slotcron.http.errors import ApiError
from slotcron.store.database import Database

POOL_SIZE = 2
CONCURRENCY = 2
TIMEOUT = 5.0
MAX_WAITING = 64
FRESH_SECONDS = 1.0
CACHE_BYTES = 32 * 1024 * 1024
"""Bytes of answers kept at most (bodies and keys)."""
MAX_CACHED_ANSWER = CACHE_BYTES // 4
"""An answer larger than this is served to the requests that share its query, never kept: one
huge page must not push every dashboard's small answers out."""
_OVERHEAD = 200
"""Bytes an entry costs besides its body and key (its objects), counted so that many tiny
answers are bounded too."""

Produce = Callable[[Database], Awaitable[Any]]


@dataclass(frozen=True)
class _Answer:
    body: bytes
    etag: str
    at: float


class AdminReads:
    def __init__(self, db: Database) -> None:
        self.db = db.sibling(POOL_SIZE)
        self._gate = asyncio.Semaphore(CONCURRENCY)
        self._waiting = 0
        self._answers: OrderedDict[str, _Answer] = OrderedDict()
        """Oldest first (an answer is moved to the end when made)."""
        self._bytes = 0
        self._flights: dict[str, asyncio.Future[_Answer]] = {}

    async def respond(self, request: web.Request, key: str, produce: Produce) -> web.Response:
        """The JSON answer of ``produce`` for the read named ``key`` (path and validated
        query), fresh within :data:`FRESH_SECONDS`, or 304 when the client has it."""
        answer = self._answers.get(key)
        if answer is None or time.monotonic() - answer.at > FRESH_SECONDS:
            flight = self._flights.get(key)
            if flight is None:
                flight = asyncio.ensure_future(self._query(key, produce))
                self._flights[key] = flight
                flight.add_done_callback(lambda _: self._flights.pop(key, None))
            answer = await asyncio.shield(flight)
        headers = {"ETag": answer.etag, "Cache-Control": "no-cache"}
        if answer.etag in _etags(request.headers.get("If-None-Match", "")):
            return web.Response(status=304, headers=headers)
        return web.Response(
            body=answer.body, content_type="application/json", charset="utf-8", headers=headers
        )

    async def _query(self, key: str, produce: Produce) -> _Answer:
        if self._waiting >= MAX_WAITING:
            raise _busy("too many reads are waiting")
        self._waiting += 1
        try:
            async with asyncio.timeout(TIMEOUT), self._gate:
                payload = await produce(self.db)
        except TimeoutError:
            raise _busy(f"the read took longer than {TIMEOUT:g} s") from None
        finally:
            self._waiting -= 1
        body = _encode(payload)
        etag = f'"{hashlib.blake2b(body, digest_size=12).hexdigest()}"'
        answer = _Answer(body, etag, time.monotonic())
        self._keep(key, answer)
        return answer

    def _keep(self, key: str, answer: _Answer) -> None:
        self._drop(key)
        size = _size(key, answer)
        if size > MAX_CACHED_ANSWER:
            return
        self._answers[key] = answer
        self._bytes += size
        stale = answer.at - FRESH_SECONDS
        while self._answers:
            oldest_key, oldest = next(iter(self._answers.items()))
            if self._bytes <= CACHE_BYTES and oldest.at >= stale:
                break
            self._drop(oldest_key)

    def _drop(self, key: str) -> None:
        answer = self._answers.pop(key, None)
        if answer is not None:
            self._bytes -= _size(key, answer)

    @property
    def kept_bytes(self) -> int:
        """What the kept answers cost, as counted against :data:`CACHE_BYTES`."""
        return self._bytes

    def forget(self) -> None:
        """Drop every kept answer: a write through the API is seen by the next read."""
        self._answers.clear()
        self._bytes = 0

    async def close(self) -> None:
        await self.db.close()


def _size(key: str, answer: _Answer) -> int:
    return len(answer.body) + len(key) + _OVERHEAD


def _busy(why: str) -> ApiError:
    return ApiError(503, f"admin API busy ({why}); try again", headers={"Retry-After": "1"})


def _etags(header: str) -> set[str]:
    return {tag.strip().removeprefix("W/") for tag in header.split(",") if tag.strip()}


def _encode(payload: Any) -> bytes:
    try:
        return json.dumps(payload, allow_nan=False, separators=(",", ":")).encode()
    except ValueError:
        # A non-finite number stored before the API refused them: null, so the JSON stays valid.
        return json.dumps(_finite(payload), separators=(",", ":")).encode()


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value
