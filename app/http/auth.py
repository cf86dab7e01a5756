"""Who may use the admin API: the bearer of ``SCHEDULER_ADMIN_TOKEN``, through a ``Host`` this
server answers to.

Writes always need the token, and with no token configured every write is refused. Reads of
the JSON API need it too once a token is configured (executions carry job parameters, state
and error text, which are not for everyone who can reach the port); with no token they are
open, for a read-only dashboard on a trusted address. ``/healthz``, ``/readyz``, ``/metrics``
and the dashboard's own files are always open: they hold no job data.

The API and the dashboard answer only requests whose ``Host`` is an IP address, ``localhost``,
the bind address or one of ``SCHEDULER_HTTP_ALLOWED_HOSTS``: a page on another site cannot
re-point its own name at this server (DNS rebinding) and read executions through a browser.

A wrong or missing token is logged (at most one line per peer per :data:`LOG_EVERY` seconds,
with a count) and each further failure from the same peer within :data:`FAILURE_WINDOW` is
answered more slowly, up to :data:`MAX_DELAY` seconds: guessing a token costs time.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from aiohttp import web
from pydantic import SecretStr

from app.http.errors import ApiError
from app.records import displayable

log = logging.getLogger("slotcron.http")

_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="slotcron"'}

FAILURE_WINDOW = 60.0
"""Seconds a peer's failed attempts are remembered."""
FREE_FAILURES = 3
"""Failures within the window answered at once (a mistyped token is not an attack)."""
MAX_DELAY = 2.0
LOG_EVERY = 10.0
_PEERS = 4096
"""Peers remembered at most (the oldest forgotten first): memory stays bounded under a flood."""


@dataclass
class _Failures:
    count: int
    first: float
    logged_at: float
    unlogged: int


class TokenCheck:
    def __init__(self, token: SecretStr | None) -> None:
        # Compared as bytes: compare_digest takes str only when it is ASCII.
        value = token.get_secret_value().strip() if token is not None else ""
        self._token = value.encode() if value else None
        self._failures: OrderedDict[str, _Failures] = OrderedDict()

    def read(self, request: web.Request) -> None:
        """Raise unless the request may read the JSON API."""
        if self._token is not None:
            self._check(request)

    def write(self, request: web.Request) -> None:
        """Raise unless the request may change something (trigger, pause, resume, restart)."""
        if self._token is None:
            raise ApiError(
                403,
                "admin API writes are disabled: no SCHEDULER_ADMIN_TOKEN is configured on this "
                "instance",
            )
        self._check(request)

    def _check(self, request: web.Request) -> None:
        assert self._token is not None
        header = request.headers.get("Authorization", "")
        try:
            # aiohttp hands undecodable header bytes over as lone surrogates.
            header.encode("utf-8")
        except UnicodeEncodeError:
            raise self._failed(
                request,
                ApiError(400, "the Authorization header is not valid UTF-8", field="Authorization"),
                "an undecodable Authorization header",
            ) from None
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            raise self._failed(
                request,
                ApiError(
                    401,
                    "missing Authorization: Bearer <SCHEDULER_ADMIN_TOKEN>",
                    headers=_CHALLENGE,
                ),
                "no bearer token",
            )
        if not hmac.compare_digest(given.strip().encode(), self._token):
            raise self._failed(request, ApiError(403, "wrong admin token"), "a wrong token")
        self._failures.pop(request.remote or "?", None)

    def _failed(self, request: web.Request, error: ApiError, what: str) -> ApiError:
        """Count a failure of ``request``'s peer; log it (rate-limited) and set how long the
        answer waits."""
        peer = request.remote or "?"
        now = time.monotonic()
        entry = self._failures.pop(peer, None)
        if entry is None or now - entry.first > FAILURE_WINDOW:
            entry = _Failures(count=0, first=now, logged_at=float("-inf"), unlogged=0)
        entry.count += 1
        entry.unlogged += 1
        self._failures[peer] = entry
        while len(self._failures) > _PEERS:
            self._failures.popitem(last=False)
        if now - entry.logged_at >= LOG_EVERY:
            log.warning(
                "admin API: refused %s %s from %s: %s (%d failed attempts from this peer in "
                "the last %.0f s)",
                request.method,
                displayable(request.path, newlines=False)[:200],
                peer,
                what,
                entry.count,
                now - entry.first,
            )
            entry.logged_at = now
            entry.unlogged = 0
        if entry.count > FREE_FAILURES:
            error.delay = min(MAX_DELAY, 0.1 * 2 ** (entry.count - FREE_FAILURES - 1))
        return error


class HostCheck:
    """Refuses (421) a request whose ``Host`` names a server this is not."""

    def __init__(self, bind_host: str, allowed: Iterable[str]) -> None:
        self._names = {"localhost", bind_host.lower().strip("[]"), *allowed}

    def allows(self, host_header: str | None) -> bool:
        if host_header is None:
            return True  # HTTP/1.0 without Host: not a browser, so not a rebinding page
        host = host_header.strip().lower()
        if host.startswith("["):
            host = host[1:].partition("]")[0]
        elif host.count(":") == 1:
            host = host.partition(":")[0]
        host = host.rstrip(".")
        if host in self._names or host.endswith(".localhost"):
            return True
        try:
            ipaddress.ip_address(host)
        except ValueError:
            return False
        return True  # an address, not a name: nothing to rebind

    def check(self, request: web.Request) -> None:
        host = request.headers.get("Host")
        if not self.allows(host):
            shown = displayable(host or "", newlines=False)[:100]
            raise ApiError(
                421,
                f"this server does not answer to Host {shown!r}; add it to "
                "SCHEDULER_HTTP_ALLOWED_HOSTS if it should",
                field="Host",
            )
