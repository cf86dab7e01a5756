"""History filters as operators write them, read the same way by the CLI and the HTTP API."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

STATUSES = ("QUEUED", "RUNNING", "COMPLETED", "FAILED", "SKIPPED", "MISSED", "STOPPED", "ABANDONED")

_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def parse_status(text: str) -> str:
    """A status name, any case; ValueError naming the choices otherwise."""
    value = text.strip().upper()
    if value not in STATUSES:
        raise ValueError(f"unknown status {text!r}; one of {', '.join(STATUSES)}")
    return value


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """An ISO-8601 time (UTC unless it says otherwise) or a duration back from ``now``
    (``30m``, ``2h``, ``7d``); ValueError otherwise."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smhd])", text.strip())
    if match:
        back = timedelta(**{_UNITS[match.group(2)]: float(match.group(1))})
        return (now or datetime.now(UTC)) - back
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"{text!r}: expected an ISO-8601 time or a duration like 30m, 2h, 7d"
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
