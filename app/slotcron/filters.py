"""History filters as operators write them, read the same way by the CLI and the HTTP API.

Every parser raises ``ValueError`` with a message fit to show (never ``OverflowError``), and
every value it returns can be bound to a query on each database.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

STATUSES = ("QUEUED", "RUNNING", "COMPLETED", "FAILED", "SKIPPED", "MISSED", "STOPPED", "ABANDONED")

_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
"""The earliest ``since`` worth asking: nothing ran before it, and every database stores it."""
_LATEST = datetime(9999, 1, 1, tzinfo=UTC)


def parse_status(text: str) -> str:
    """A status name, any case; ValueError naming the choices otherwise."""
    value = text.strip().upper()
    if value not in STATUSES:
        raise ValueError(f"unknown status {text!r}; one of {', '.join(STATUSES)}")
    return value


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """An ISO-8601 time (UTC unless it says otherwise) or a duration back from ``now``
    (``30m``, ``2h``, ``7d``); ValueError otherwise. The answer is aware UTC, no earlier than
    :data:`EPOCH` (a duration reaching further back means "everything")."""
    stripped = text.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smhd])", stripped)
    if match:
        now = now or datetime.now(UTC)
        try:
            moment = now - timedelta(**{_UNITS[match.group(2)]: float(match.group(1))})
        except (OverflowError, ValueError):  # further back than any datetime: everything
            return EPOCH
        return max(moment, EPOCH)
    return parse_instant(text, expected="an ISO-8601 time or a duration like 30m, 2h, 7d")


def parse_instant(text: str, *, expected: str = "an ISO-8601 time") -> datetime:
    """An ISO-8601 time (UTC unless it says otherwise), as aware UTC between :data:`EPOCH`
    and the year 9999; ValueError otherwise."""
    stripped = text.strip()
    try:
        moment = datetime.fromisoformat(stripped.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{text!r}: expected {expected}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    try:
        moment = moment.astimezone(UTC)
    except OverflowError:  # e.g. 0001-01-01T00:00:00+01:00: before the first representable UTC
        if moment.year > 1:
            raise ValueError(f"{text!r}: later than the year 9999") from None
        return EPOCH
    if moment > _LATEST:
        raise ValueError(f"{text!r}: later than the year 9999")
    return max(moment, EPOCH)
