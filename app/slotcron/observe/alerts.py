"""Alerts: one JSON POST to ``SCHEDULER_ALERT_WEBHOOK_URL`` per outcome worth attention.

The events (``SCHEDULER_ALERT_EVENTS``, default all four):

- ``FAILED``: a run failed with no attempt left (a failure that will be retried is not news);
- ``ABANDONED``: a run whose instance stopped renewing its lease;
- ``MISSED``: slots recorded not run, summed per job over :data:`MISSED_WINDOW` seconds;
- ``FENCED``: a run this instance stopped because its lease lapsed or its record was taken.

**Sent once by the cluster, with no coordination.** Each event is emitted by the one instance
that won the conditional write of that outcome: the finishing instance for ``FAILED`` (its
``UPDATE … WHERE status = 'RUNNING' AND instance_id = me`` matched), the leader whose
``ABANDONED`` update matched, the claimer whose transaction recorded ``MISSED``, the fenced
instance itself for ``FENCED``. Another instance cannot have won the same write, so no table of
sent alerts is needed. A POST retried after a lost answer may reach the webhook twice: every
event carries an ``id`` the receiver can deduplicate on.

**Never in the way.** Emitting is a non-blocking put into a bounded queue; one task POSTs,
retrying with backoff. A full queue drops the event and counts it; a dead webhook costs
counters (``slotcron_alerts_*``) and a warning at most once a minute, never a slot. Events never
carry a secret: every text field is masked (:func:`slotcron.masking.mask`, and the admin token and
the webhook's own password by value), and the URL is printed masked.

**Whatever the endpoint does.** The endpoint is outside slotcron's control, and may be hostile
(whoever controls it, or its DNS). A POST has a connect timeout (:data:`CONNECT_TIMEOUT`) and a
total one (:data:`POST_TIMEOUT`) covering headers and body; redirects are not followed (a 307
would re-POST the event to a host nobody configured, a 302 turn it into a GET that "succeeds"):
a 3xx is a failed delivery, retried and logged like a 5xx; at most :data:`ANSWER_LIMIT` bytes of
an answer are read (a longer one's connection is closed, never drained), undecompressed. A slow,
huge, looping or silent endpoint costs this one task its time, never the scheduler's loop.

The emit points in the scheduling core are one-line calls: ``alerts.of(instance_id).…``, where
the instance id finds the service's sender (several services may share a process, as tests do).
Without a webhook, :func:`of` answers the no-op base.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from slotcron.clock import Clock
from slotcron.masking import mask, mask_value

if TYPE_CHECKING:
    import aiohttp

    from slotcron.config import Settings
    from slotcron.service.service import Service
    from slotcron.store.claims import Claim
    from slotcron.store.lifeline import Abandoned

log = logging.getLogger("slotcron.alerts")

QUEUE_LIMIT = 1000
"""Events waiting to be sent; past it, new events are dropped (and counted)."""
MISSED_WINDOW = 60.0
"""MISSED slots of one job recorded within this many seconds are one event."""
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
ERROR_CHARS = 4000


@dataclass
class AlertStats:
    sent: int = 0
    failed: int = 0  # POST attempts that failed (each retry counts)
    dropped: int = 0  # events given up: queue full, retries exhausted, refused, or shutdown
    queued: int = 0


class Alerts:
    """The emit points. This base sends nothing (no webhook configured)."""

    stats = AlertStats()

    def run_finished(
        self, claim: Claim, status: str, error: str | None, *, recorded: bool, final: bool
    ) -> None:
        """A run's outcome was written (``recorded``) or found no longer ours (not recorded).
        ``final``: no attempt is left (a failure will not be retried)."""

    def run_fenced(self, claim: Claim, why: str) -> None:
        """This instance stopped a run whose lease lapsed unrenewed; no outcome is written."""

    def abandoned(self, run: Abandoned) -> None:
        """This instance's conditional update recorded ``run`` ABANDONED."""

    def not_run(self, claim: Claim) -> None:
        """This instance's claim recorded a slot not run (``SKIPPED`` or ``MISSED``)."""

    async def start(self) -> None:
        """Open the HTTP client and start the sending task."""

    async def stop(self) -> None:
        """Send what is queued, for up to :data:`STOP_SECONDS`, then close."""


NO_ALERTS = Alerts()
_SENDERS: dict[str, Alerts] = {}


def of(instance_id: str) -> Alerts:
    """The alerts of the service running as ``instance_id`` (the no-op base if none)."""
    return _SENDERS.get(instance_id, NO_ALERTS)


def install(service: Service) -> Alerts:
    """The service's alerts: a :class:`Webhook` when ``SCHEDULER_ALERT_WEBHOOK_URL`` is set."""
    settings = service.settings
    if settings.alert_webhook_url is None:
        _SENDERS.pop(service.instance_id, None)
        return NO_ALERTS
    sender = Webhook(
        settings,
        alerting={job.name: job.alert for job in service.jobs},
        clock=service.clock,
        dashboard=lambda: _dashboard_link(service),
    )
    _SENDERS[service.instance_id] = sender
    return sender


def safe_url(url: str) -> str:
    """The webhook URL fit to print: no user, password, query or fragment."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _dashboard_link(service: Service) -> str | None:
    if service.http is None:
        return None
    host = service.http.host
    if host in ("0.0.0.0", "::", ""):  # bound to every address: name the machine instead
        host = socket.gethostname()
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{service.http.port}/"


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


@dataclass
class _Missed:
    """MISSED slots of one job, summed until its window closes."""

    count: int
    first: Claim
    last: datetime


class Webhook(Alerts):
    def __init__(
        self,
        settings: Settings,
        *,
        alerting: dict[str, bool],
        clock: Clock,
        dashboard: Callable[[], str | None] = lambda: None,
    ) -> None:
        self.clock = clock
        assert settings.alert_webhook_url is not None
        self.url = settings.alert_webhook_url.get_secret_value()
        self.safe_url = safe_url(self.url)
        self.events = settings.alert_events
        self.instance_id = settings.instance_id
        self.alerting = alerting
        self.dashboard = dashboard
        tokens = [t.get_secret_value() for t in (*settings.admin_tokens, *settings.read_tokens)]
        # Masked by value, wherever they appear: every token, and the webhook's own password.
        self._secrets = tuple(s for s in (*tokens, urlsplit(self.url).password) if s)
        self.stats = AlertStats()
        self._queue: deque[dict[str, Any]] = deque()
        self._ready = asyncio.Event()  # something is queued
        self._idle = asyncio.Event()  # nothing is queued
        self._idle.set()
        self._missed: dict[str, _Missed] = {}
        self._flushes: dict[str, asyncio.TimerHandle] = {}  # job -> the end of its window
        self._task: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._logged_at = -LOG_EVERY_SECONDS
        self._closing = False

    # --- emit points (synchronous, never blocking) ---------------------------------------

    def run_finished(
        self, claim: Claim, status: str, error: str | None, *, recorded: bool, final: bool
    ) -> None:
        if not recorded:
            self.run_fenced(claim, f"its record was no longer ours to write {status} into")
        elif status == "FAILED" and final:
            self._emit("FAILED", claim.job_name, claim, error=error)

    def run_fenced(self, claim: Claim, why: str) -> None:
        self._emit("FENCED", claim.job_name, claim, error=f"run fenced: {why}")

    def abandoned(self, run: Abandoned) -> None:
        if not run.alert:
            return
        self._emit(
            "ABANDONED",
            run.job_name,
            None,
            slot=run.scheduled_at,
            execution_id=run.execution_id,
            instance=run.instance_id,
            error=f"instance {run.instance_id} let the lease lapse at {_iso(run.lease_until)}",
            retry_execution_id=run.retry_id,
        )

    def not_run(self, claim: Claim) -> None:
        if claim.status != "MISSED" or "MISSED" not in self.events or self._closing:
            return
        if not self.alerting.get(claim.job_name, True):
            return
        pending = self._missed.get(claim.job_name)
        if pending is not None:
            pending.count += 1
            pending.last = max(pending.last, claim.scheduled_at)
            return
        self._missed[claim.job_name] = _Missed(1, claim, claim.scheduled_at)
        self._flushes[claim.job_name] = asyncio.get_running_loop().call_later(
            MISSED_WINDOW, self._flush_missed, claim.job_name
        )

    def _flush_missed(self, job: str) -> None:
        self._flushes.pop(job, None)
        pending = self._missed.pop(job, None)
        if pending is None:
            return
        self._emit(
            "MISSED",
            job,
            pending.first,
            error=pending.first.reason,
            count=pending.count,
            until=_iso(pending.last),
        )

    def _emit(
        self,
        event: str,
        job: str,
        claim: Claim | None,
        *,
        slot: datetime | None = None,
        execution_id: int | None = None,
        instance: str | None = None,
        error: str | None = None,
        **more: Any,
    ) -> None:
        if event not in self.events or self._closing:
            return
        if event != "ABANDONED" and not self.alerting.get(job, True):
            return
        if claim is not None:
            slot, execution_id = claim.scheduled_at, claim.execution_id
        assert slot is not None
        body: dict[str, Any] = {
            # Unique per event in the cluster: a receiver may deduplicate a re-sent POST on it.
            "id": f"{event}:{job}:{_iso(slot)}" if event == "MISSED" else f"{event}:{execution_id}",
            "event": event,
            "job": job,
            "slot": _iso(slot),
            "status": event,
            "error": self._scrub(error),
            "execution_id": execution_id,
            "attempt": claim.attempt if claim else None,
            "trigger": claim.trigger if claim else None,
            "instance": instance or self.instance_id,
            "sent_by": self.instance_id,
            "dashboard": self.dashboard(),
            "at": _iso(self.clock.now()),
            **mask_value(more, self._secrets),
        }
        # Names are ids a client chose (a runtime schedule's): masked like any text.
        body["job"], body["id"] = mask(job, self._secrets), mask(body["id"], self._secrets)
        if len(self._queue) >= QUEUE_LIMIT:
            self.stats.dropped += 1
            self._warn(
                "alert queue full (%d events): %s event of %s dropped", QUEUE_LIMIT, event, job
            )
            return
        self._queue.append(body)
        self.stats.queued = len(self._queue)
        self._idle.clear()
        self._ready.set()

    def _scrub(self, error: str | None) -> str | None:
        if error is None:
            return None
        # Masked whole, then cut: a traceback's end says what went wrong, and a cut made first
        # could leave the tail of a secret without the shape that makes it recognisable.
        return mask(error, self._secrets)[-ERROR_CHARS:]

    # --- sending ---------------------------------------------------------------------------

    async def start(self) -> None:
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
        log.info("alerts: %s events to %s", ",".join(sorted(self.events)), self.safe_url)

    async def stop(self) -> None:
        for handle in self._flushes.values():
            handle.cancel()
        for job in list(self._missed):  # what the windows hold so far, summed up now
            self._flush_missed(job)
        self._closing = True
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
        if _SENDERS.get(self.instance_id) is self:
            del _SENDERS[self.instance_id]

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
        import aiohttp

        data = json.dumps(body).encode()
        delay = RETRY_FIRST
        for attempt in range(1, MAX_ATTEMPTS + 1):
            try:
                status = await self._post(data)
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                said = str(exc) or f"no whole answer within {POST_TIMEOUT:g} s"
                problem = f"{type(exc).__name__}: {mask(said, self._secrets)}"[:200]
            else:
                if 200 <= status < 300:
                    self.stats.sent += 1
                    return
                problem = f"HTTP {status}"
                if 300 <= status < 400:
                    problem += " (a redirect: not followed, an alert goes to the URL configured)"
                if 400 <= status < 500 and status not in (408, 429):
                    self.stats.failed += 1
                    self.stats.dropped += 1
                    self._warn(
                        "alert webhook %s refused an event (%s): dropped", self.safe_url, problem
                    )
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
