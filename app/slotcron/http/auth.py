"""Who may use the admin API: the bearer of a token, through a ``Host`` this server answers to.

Two kinds of token, each setting a comma-separated list (several at once: rotation):
``SCHEDULER_ADMIN_TOKEN`` may read and write, ``SCHEDULER_READ_TOKEN`` may only read. Writes
always need an admin token, and with none configured every write is refused (403); a read
token on a write is refused (403). Reads of the JSON API need a token, read or admin, once
``SCHEDULER_READ_TOKEN`` is set (executions and schedules carry job parameters, state and error
text, which are not for everyone who can reach the port: set it wherever the port is not a
trusted address); without it they are open (docs/reference/http.md), for a read-only dashboard.
``/healthz``, ``/readyz``, ``/metrics`` and the dashboard's own files are always open: they
hold no job data.

A token is compared in constant time with every configured token (a digest of each, so neither
which one matched nor their lengths show in the time taken).

The API and the dashboard answer only requests whose ``Host`` is an IP address, ``localhost``,
the bind address or one of ``SCHEDULER_HTTP_ALLOWED_HOSTS``: a page on another site cannot
re-point its own name at this server (DNS rebinding) and read executions through a browser.

A wrong or missing token is logged (at most one line per peer per :data:`LOG_EVERY` seconds,
with a count) and each further failure from the same peer within :data:`FAILURE_WINDOW` is
answered more slowly, up to :data:`MAX_DELAY` seconds: guessing a token costs time. A success
forgets nothing: a peer that holds one good token still pays for its wrong guesses.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from aiohttp import web
from pydantic import SecretStr

from slotcron.http.errors import ApiError
from slotcron.text import displayable

log = logging.getLogger("slotcron.http")

_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="slotcron"'}

FAILURE_WINDOW = 60.0
"""Seconds a peer's failed attempts are remembered."""
FREE_FAILURES = 3
"""Failures within the window answered at once (a mistyped token is not an attack)."""
FIRST_DELAY = 0.1
"""Seconds the first failure past :data:`FREE_FAILURES` waits; each further one doubles it."""
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
    def __init__(self, admin: Iterable[SecretStr] = (), read: Iterable[SecretStr] = ()) -> None:
        # Compared as digests of their bytes: compare_digest takes str only when it is ASCII,
        # and digests of equal length show no token's length.
        self._admin = [_digest(t.get_secret_value().strip()) for t in admin]
        self._read = [_digest(t.get_secret_value().strip()) for t in read]
        self._failures: OrderedDict[str, _Failures] = OrderedDict()

    def read(self, request: web.Request) -> None:
        """Raise unless the request may read the JSON API."""
        if self._read:
            self._check(request, reading=True)

    def write(self, request: web.Request) -> None:
        """Raise unless the request may change something (trigger, pause, resume, restart,
        schedules): it bears an admin token."""
        if not self._admin:
            raise ApiError(
                403,
                "admin API writes are disabled: no SCHEDULER_ADMIN_TOKEN is configured on this "
                "instance",
            )
        self._check(request, reading=False)

    def _check(self, request: web.Request, *, reading: bool) -> None:
        header = request.headers.get("Authorization", "")
        try:
            # aiohttp hands undecodable header bytes over as lone surrogates.
            given = header.encode("utf-8")
        except UnicodeEncodeError:
            raise self._failed(
                request,
                ApiError(400, "the Authorization header is not valid UTF-8", field="Authorization"),
                "an undecodable Authorization header",
            ) from None
        scheme, _, token = given.partition(b" ")
        token = token.strip()
        if scheme.lower() != b"bearer" or not token:
            wanted = "a read or admin token" if reading and self._read else "an admin token"
            raise self._failed(
                request,
                ApiError(401, f"missing Authorization: Bearer <{wanted}>", headers=_CHALLENGE),
                "no bearer token",
            )
        digest = _digest_bytes(token)
        # Every token compared, none skipped: the time taken says nothing of which matched.
        admin = _matches(digest, self._admin)
        read_only = _matches(digest, self._read)
        if admin or (reading and read_only):
            return
        if read_only:
            # A valid token, not a guess: refused without counting as a failure.
            raise ApiError(
                403,
                "this token may only read (SCHEDULER_READ_TOKEN); writes need an admin token "
                "(SCHEDULER_ADMIN_TOKEN)",
            )
        wrong = "wrong token" if self._read else "wrong admin token"
        raise self._failed(request, ApiError(403, wrong), "a wrong token")

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
            error.delay = min(MAX_DELAY, FIRST_DELAY * 2 ** (entry.count - FREE_FAILURES - 1))
        return error


def _digest(token: str) -> bytes:
    return _digest_bytes(token.encode())


def _digest_bytes(token: bytes) -> bytes:
    return hashlib.sha256(token).digest()


def _matches(digest: bytes, tokens: list[bytes]) -> bool:
    found = False
    for token in tokens:
        found |= hmac.compare_digest(digest, token)
    return found


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
