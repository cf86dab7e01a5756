"""Text shown to people: ISO-8601 times and control characters made harmless.

One definition for the CLI, the HTTP API, the logs and the alerts, so a time reads the same and
an escape looks the same wherever it is shown.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import overload

# C0 controls but tab and newline, DEL, C1 controls, and the bidirectional overrides that can
# make a terminal (or a log viewer) show text other than what is there.
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_CONTROLS_AND_NEWLINES = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def displayable(text: str, *, newlines: bool = True) -> str:
    """``text`` (a job's error, a name, anything a job or a client wrote) made safe to show on
    a terminal or in a text log: control characters are written as ``\\x1b`` escapes, so they
    can neither move the cursor, recolour, retitle the terminal nor forge a line.
    ``newlines=False`` escapes newlines too (one table cell, one log line)."""
    pattern = _CONTROLS if newlines else _CONTROLS_AND_NEWLINES
    return pattern.sub(_escape, text)


@overload
def iso(value: datetime) -> str: ...
@overload
def iso(value: datetime | None) -> str | None: ...
def iso(value: datetime | None) -> str | None:
    """ISO-8601 UTC with a ``Z``; microseconds only when there are any."""
    if value is None:
        return None
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
