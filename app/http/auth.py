"""Who may use the admin API: the bearer of ``SCHEDULER_ADMIN_TOKEN``.

Writes always need the token, and with no token configured every write is refused. Reads of
the JSON API need it too once a token is configured (executions carry job parameters, state
and error text, which are not for everyone who can reach the port); with no token they are
open, for a read-only dashboard on a trusted address. ``/healthz``, ``/readyz``, ``/metrics``
and the dashboard's own files are always open: they hold no job data.
"""

from __future__ import annotations

import hmac

from aiohttp import web
from pydantic import SecretStr

from app.http.errors import ApiError

_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="slotcron"'}


class TokenCheck:
    def __init__(self, token: SecretStr | None) -> None:
        # Compared as bytes: compare_digest takes str only when it is ASCII.
        value = token.get_secret_value().strip() if token is not None else ""
        self._token = value.encode() if value else None

    @property
    def configured(self) -> bool:
        return self._token is not None

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
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            raise ApiError(
                401, "missing Authorization: Bearer <SCHEDULER_ADMIN_TOKEN>", headers=_CHALLENGE
            )
        if not hmac.compare_digest(given.strip().encode(), self._token):
            raise ApiError(403, "wrong admin token")
