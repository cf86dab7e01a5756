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

**Never in the way.** Events are built inline (cheap, no I/O) and handed to
:class:`slotcron.observe.webhook.Poster`: a bounded queue and one task that POSTs them (its
timeouts, retries and limits are described there). Events never carry a secret: every text
field is masked (:func:`slotcron.masking.mask`, and the admin token and the webhook's own
password by value), and the URL is printed masked.

The alerts are a built-in observer of the engine's events (:class:`Alerting`,
:mod:`slotcron.observe.events`); without a webhook there is no observer at all.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

from slotcron.clock import Clock
from slotcron.masking import mask, mask_value
from slotcron.observe.events import Ending, Observer, RunEvent, SlotsEvent
from slotcron.observe.webhook import AlertStats, Poster, safe_url

if TYPE_CHECKING:
    from slotcron.config import Settings
    from slotcron.store.claims import Claim
    from slotcron.store.lifeline import Abandoned

__all__ = ["AlertStats", "Alerting", "Alerts", "Webhook", "install", "safe_url"]

log = logging.getLogger("slotcron.alerts")

MISSED_WINDOW = 60.0
"""MISSED slots of one job recorded within this many seconds are one event."""
ERROR_CHARS = 4000


class Alerts:
    """The emit points. This base sends nothing (no webhook configured)."""

    stats = AlertStats()

    def failed(self, run: RunEvent) -> None:
        """``run`` was recorded FAILED with no attempt left (a failure that will be retried is
        not news)."""

    def fenced(self, run: RunEvent, why: str) -> None:
        """This instance stopped ``run``, or found its record no longer ours: ``why``."""

    def abandoned(self, run: Abandoned) -> None:
        """This instance's conditional update recorded ``run`` ABANDONED."""

    def not_run(self, claim: Claim) -> None:
        """This instance's claim recorded a slot not run (``SKIPPED`` or ``MISSED``)."""

    async def start(self) -> None:
        """Open the HTTP client and start the sending task."""

    async def stop(self) -> None:
        """Send what is queued, for up to 2 s, then close."""


NO_ALERTS = Alerts()


class Alerting(Observer):
    """The alerts as a built-in observer of the engine's events."""

    def __init__(self, alerts: Alerts) -> None:
        self.alerts = alerts

    def run_finished(self, run: RunEvent, end: Ending) -> None:
        if end.abandoned is not None:
            self.alerts.abandoned(end.abandoned)
        elif end.why is not None:
            self.alerts.fenced(run, end.why)
        elif not end.recorded:
            self.alerts.fenced(run, f"its record was no longer ours to write {run.status} into")
        elif run.status == "FAILED" and end.final:
            self.alerts.failed(run)

    def slots_passed(self, event: SlotsEvent, record: Claim, together: int | None) -> None:
        self.alerts.not_run(record)

    async def stop(self) -> None:
        await self.alerts.stop()


class _Alerting(Protocol):
    @property
    def alert(self) -> bool: ...


class AlertFlags(dict[str, bool]):
    """Whether each job's events go to the webhook, by name, as the sender reads it
    (``.get(name, True)``): code jobs' as entries; a runtime schedule's from its job while
    anything holds it (``held``: a run, a claim: whenever one of its events is sent), which
    carries its task's ``alert`` option. Nothing here grows with the number of schedules."""

    def __init__(self, code: dict[str, bool], held: Callable[[str], _Alerting | None]) -> None:
        super().__init__(code)
        self._held = held

    def get(self, name: str, default: Any = None) -> Any:
        if name in self:
            return self[name]
        job = self._held(name)
        return job.alert if job is not None else default


def install(
    settings: Settings,
    *,
    alerting: dict[str, bool],
    clock: Clock,
    dashboard: Callable[[], tuple[str, int] | None] = lambda: None,
) -> Alerts:
    """An instance's alerts: a :class:`Webhook` when ``SCHEDULER_ALERT_WEBHOOK_URL`` is set.
    ``dashboard`` tells the HTTP server's address, when it serves one."""
    if settings.alert_webhook_url is None:
        return NO_ALERTS
    return Webhook(
        settings, alerting=alerting, clock=clock, dashboard=lambda: dashboard_link(dashboard())
    )


def dashboard_link(address: tuple[str, int] | None) -> str | None:
    if address is None:
        return None
    host, port = address
    if host in ("0.0.0.0", "::", ""):  # bound to every address: name the machine instead
        host = socket.gethostname()
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{port}/"


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


class _Slot(Protocol):
    """What an event says of its run: a claim's or a run event's fields."""

    @property
    def scheduled_at(self) -> datetime: ...
    @property
    def execution_id(self) -> int: ...
    @property
    def attempt(self) -> int | None: ...
    @property
    def trigger(self) -> str | None: ...


@dataclass
class _Missed:
    """MISSED slots of one job, summed until its window closes."""

    count: int
    first: Claim
    last: datetime


class Webhook(Alerts):
    """Alerts to ``SCHEDULER_ALERT_WEBHOOK_URL``: each event built here, masked, and queued
    for its :class:`Poster`."""

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
        url = settings.alert_webhook_url.get_secret_value()
        self.events = settings.alert_events
        self.instance_id = settings.instance_id
        self.alerting = alerting
        self.dashboard = dashboard
        tokens = [t.get_secret_value() for t in (*settings.admin_tokens, *settings.read_tokens)]
        # Masked by value, wherever they appear: every token, and the webhook's own password.
        self._secrets = tuple(s for s in (*tokens, urlsplit(url).password) if s)
        self.poster = Poster(url, self._secrets)
        self.stats = self.poster.stats
        self.safe_url = self.poster.safe_url
        self._missed: dict[str, _Missed] = {}
        self._flushes: dict[str, asyncio.TimerHandle] = {}  # job -> the end of its window
        self._closing = False

    # --- emit points (synchronous, never blocking) ---------------------------------------

    def failed(self, run: RunEvent) -> None:
        self._emit("FAILED", run.job, run, error=run.error)

    def fenced(self, run: RunEvent, why: str) -> None:
        self._emit("FENCED", run.job, run, error=f"run fenced: {why}")

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
        run: _Slot | None,
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
        if run is not None:
            slot, execution_id = run.scheduled_at, run.execution_id
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
            "attempt": run.attempt if run else None,
            "trigger": run.trigger if run else None,
            "instance": instance or self.instance_id,
            "sent_by": self.instance_id,
            "dashboard": self.dashboard(),
            "at": _iso(self.clock.now()),
            **mask_value(more, self._secrets),
        }
        # Names are ids a client chose (a runtime schedule's): masked like any text.
        body["job"], body["id"] = mask(job, self._secrets), mask(body["id"], self._secrets)
        self.poster.enqueue(body)

    def _scrub(self, error: str | None) -> str | None:
        if error is None:
            return None
        # Masked whole, then cut: a traceback's end says what went wrong, and a cut made first
        # could leave the tail of a secret without the shape that makes it recognisable.
        return mask(error, self._secrets)[-ERROR_CHARS:]

    async def start(self) -> None:
        await self.poster.open()
        log.info("alerts: %s events to %s", ",".join(sorted(self.events)), self.safe_url)

    async def stop(self) -> None:
        for handle in self._flushes.values():
            handle.cancel()
        for job in list(self._missed):  # what the windows hold so far, summed up now
            self._flush_missed(job)
        self._closing = True
        await self.poster.close()
