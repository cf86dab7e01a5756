"""POSTing alert events to ``SCHEDULER_ALERT_WEBHOOK_URL``, off the scheduler's path.

Queuing an event is a non-blocking append to a bounded queue; one task POSTs, retrying with
backoff. A full queue drops the event and counts it; a dead webhook costs counters
(``slotcron_alerts_*``) and a warning at most once a minute, never a slot.

**Whatever the endpoint does.** The endpoint is outside slotcron's control, and may be hostile
(whoever controls it, or its DNS). A POST has a connect timeout (:data:`CONNECT_TIMEOUT`) and a
total one (:data:`POST_TIMEOUT`) covering headers and body; redirects are not followed (a 307
would re-POST the event to a host nobody configured, a 302 turn it into a GET that "succeeds"):
a 3xx is a failed delivery, retried and logged like a 5xx; at most :data:`ANSWER_LIMIT` bytes of
an answer are read (a longer one's connection is closed, never drained), undecompressed. A slow,
huge, looping or silent endpoint costs this one task its time, never the scheduler's loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from slotcron.masking import mask

if TYPE_CHECKING:
    import aiohttp

log = logging.getLogger("slotcron.alerts")

QUEUE_LIMIT = 1000
"""Events waiting to be sent; past it, new events are dropped (and counted)."""
POST_TIMEOUT = 10.0
"""Seconds one POST may take in all: connecting, sending, the answer's headers and body."""
CONNECT_TIMEOUT = 5.0
"""Seconds to get a connection (DNS included): a black-holed address fails fast."""
ANSWER_LIMIT = 64 * 1024
"""Bytes of an answer read at the most; past it the connection is closed."""
RETRY_FIRST, RETRY_CAP = 1.0, 60.0
MAX_ATTEMPTS = 8
"""POSTs of one event before it is dropped (about two minutes of backoff)."""
STOP_SECONDS = 2.0
"""How long shutdown waits for queued events (phase 4: the runs are already recorded)."""
LOG_EVERY_SECONDS = 60.0


@dataclass
class AlertStats:
    sent: int = 0
    failed: int = 0  # POST attempts that failed (each retry counts)
    dropped: int = 0  # events given up: queue full, retries exhausted, refused, or shutdown
    queued: int = 0


def safe_url(url: str) -> str:
    """The webhook URL fit to print: no user, password, query or fragment."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


class Poster:
    """The queue of events for one webhook URL and the task that POSTs them."""

    def __init__(self, url: str, secrets: tuple[str, ...]) -> None:
        self.url = url
        self.safe_url = safe_url(url)
        self._secrets = secrets
        self.stats = AlertStats()
        self._queue: deque[dict[str, Any]] = deque()
        self._ready = asyncio.Event()  # something is queued
        self._idle = asyncio.Event()  # nothing is queued
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._logged_at = -LOG_EVERY_SECONDS

    def enqueue(self, body: dict[str, Any]) -> None:
        if len(self._queue) >= QUEUE_LIMIT:
            self.stats.dropped += 1
            self._warn(
                "alert queue full (%d events): %s event of %s dropped",
                QUEUE_LIMIT,
                body["event"],
                body["job"],
            )
            return
        self._queue.append(body)
        self.stats.queued = len(self._queue)
        self._idle.clear()
        self._ready.set()

    async def open(self) -> None:
        import aiohttp  # imported only when a webhook is configured

        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(
                total=POST_TIMEOUT, connect=CONNECT_TIMEOUT, sock_connect=CONNECT_TIMEOUT
            ),
            headers={"User-Agent": "slotcron-alerts", "Accept-Encoding": "identity"},
            # The answer is never looked at: a compressed one is not worth inflating (a small
            # gzip answer can inflate to gigabytes).
            auto_decompress=False,
        )
        self._task = asyncio.create_task(self._send_loop(), name="slotcron-alerts")

    async def close(self) -> None:
        """Send what is queued, for up to :data:`STOP_SECONDS`, then close."""
        if self._task is not None:
            if self._queue:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._idle.wait(), STOP_SECONDS)
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._queue:
            self.stats.dropped += len(self._queue)
            log.warning("alerts: %d events not sent before shutdown", len(self._queue))
            self._queue.clear()
        self.stats.queued = 0
        if self._session is not None:
            await self._session.close()

    async def _send_loop(self) -> None:
        while True:
            await self._ready.wait()
            while self._queue:
                body = self._queue[0]
                try:
                    await self._deliver(body)
                except Exception:  # a bug here must cost one event, not every later one
                    self.stats.dropped += 1
                    log.exception("alerts: could not send a %s event", body.get("event"))
                self._queue.popleft()
                self.stats.queued = len(self._queue)
            self._ready.clear()
            self._idle.set()

    async def _deliver(self, body: dict[str, Any]) -> None:
        """POST until a 2xx, a refusal (a 4xx other than 408 and 429: sending it again would
        not help), or :data:`MAX_ATTEMPTS`. A 3xx is a failure like a 5xx: not followed."""
        data = json.dumps(body).encode()
        delay = RETRY_FIRST
        for attempt in range(1, MAX_ATTEMPTS + 1):
            problem = await self._attempt(data)
            if problem is None:
                return
            if problem.startswith("refused"):
                self.stats.failed += 1
                self.stats.dropped += 1
                self._warn("alert webhook %s %s: dropped", self.safe_url, problem)
                return
            self.stats.failed += 1
            self._warn(
                "alert webhook %s failed (%s, attempt %d of %d); retrying in %g s",
                self.safe_url,
                problem,
                attempt,
                MAX_ATTEMPTS,
                delay,
            )
            if attempt < MAX_ATTEMPTS:
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_CAP)
        self.stats.dropped += 1
        self._warn(
            "alert webhook %s: %s event of %s dropped after %d attempts",
            self.safe_url,
            body["event"],
            body["job"],
            MAX_ATTEMPTS,
        )

    async def _attempt(self, data: bytes) -> str | None:
        """One POST: None when it was taken, else what went wrong (``refused …`` when sending
        it again would not help)."""
        import aiohttp

        try:
            status = await self._post(data)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            said = str(exc) or f"no whole answer within {POST_TIMEOUT:g} s"
            return f"{type(exc).__name__}: {mask(said, self._secrets)}"[:200]
        if 200 <= status < 300:
            self.stats.sent += 1
            return None
        problem = f"HTTP {status}"
        if 300 <= status < 400:
            problem += " (a redirect: not followed, an alert goes to the URL configured)"
        if 400 <= status < 500 and status not in (408, 429):
            return f"refused an event ({problem})"
        return problem

    async def _post(self, data: bytes) -> int:
        """One POST; its answer's status. Reads at most :data:`ANSWER_LIMIT` bytes of the answer
        (to its end when it is that short, so the connection can serve the next POST), and
        closes the connection of a longer one instead of draining it."""
        assert self._session is not None
        # The session's total timeout bounds the request; this bounds the whole of it, the
        # answer's body and the closing included, whatever aiohttp's version counts in "total".
        async with (
            asyncio.timeout(POST_TIMEOUT),
            self._session.post(
                self.url,
                data=data,
                headers={"Content-Type": "application/json"},
                allow_redirects=False,
            ) as response,
        ):
            read = 0
            while read <= ANSWER_LIMIT:
                chunk = await response.content.read(ANSWER_LIMIT + 1 - read)
                if not chunk:
                    return response.status
                read += len(chunk)
            response.close()
            return response.status

    def _warn(self, message: str, *args: object) -> None:
        """At most one warning a minute: a dead webhook must not flood the log."""
        now = time.monotonic()
        if now - self._logged_at >= LOG_EVERY_SECONDS:
            self._logged_at = now
            log.warning(
                message + " (failed POSTs so far: %d, events dropped: %d)",
                *args,
                self.stats.failed,
                self.stats.dropped,
            )
