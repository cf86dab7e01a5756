"""Log set-up: human text or one JSON object per line.

**Every line is masked and cannot be forged.** Both formatters pass the message, the traceback
and (in JSON) every ``extra`` field through :func:`slotcron.masking.mask`: URL passwords,
``password=``, ``token=``, ``secret=``, ``api_key=``, ``Authorization:``/``Bearer``/``Basic``
credentials become ``***``. The text format writes control characters as escapes, newlines in a
message too: an id or an error holding ``"\n2026-… ERROR …"`` stays on its own line, and a
traceback's lines are indented, so a line that starts with a timestamp is always a record.
JSON escapes them by itself (and DEL, which JSON allows raw, is written ``\u007f``).

The lines of a run's life (claimed, started, finished, failed, skipped, missed, abandoned)
carry :func:`run_fields` as ``extra``: in JSON each is a key of its own (``job``, ``slot``,
``execution_id``, ``instance``, ``outcome``), so a log pipeline can follow one slot without
parsing messages; the text format keeps the sentence only.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

from slotcron.masking import mask, mask_value
from slotcron.text import displayable

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}
TRACEBACK_INDENT = "    "


def _timestamp(record: logging.LogRecord) -> str:
    return (
        datetime.fromtimestamp(record.created, UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


def run_fields(
    job: str, slot: datetime, execution_id: int | None, instance: str | None, outcome: str
) -> dict[str, Any]:
    """The ``extra`` of a run lifecycle line. Cheap: the slot is rendered only if the line is
    formatted as JSON."""
    return {
        "job": job,
        "slot": slot,
        "execution_id": execution_id,
        "instance": instance,
        "outcome": outcome,
    }


def _json_value(value: object) -> str:
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
    return mask(str(value))


class TextFormatter(logging.Formatter):
    """One human line per record, masked. Text that jobs and clients wrote (error text, ids,
    names) is shown with its control characters escaped, newlines included: it cannot recolour
    or retitle the terminal that tails the log, erase what came before it, nor forge a record.
    A traceback follows on lines of its own, each indented."""

    def format(self, record: logging.LogRecord) -> str:
        message = displayable(mask(record.getMessage()), newlines=False)
        name = displayable(record.name, newlines=False)
        line = f"{_timestamp(record)} {record.levelname:<7} {name}: {message}"
        if record.exc_info:
            trace = displayable(mask(self.formatException(record.exc_info)))
            line += "\n" + "\n".join(TRACEBACK_INDENT + part for part in trace.split("\n"))
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per record: the message, the traceback and every ``extra`` field
    masked (a field named like a secret, ``password`` or ``api_key``, is hidden whole)."""

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname,
            "logger": record.name,
            "message": mask(record.getMessage()),
        }
        payload.update(mask_value({k: v for k, v in vars(record).items() if k not in _STANDARD}))
        if record.exc_info:
            payload["exception"] = mask(self.formatException(record.exc_info))
        # JSON lets DEL through raw; a terminal tailing the log should not get it either.
        return json.dumps(payload, default=_json_value).replace("\x7f", "\\u007f")


def configure(level: str = "INFO", fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # slotcron.store.pool: SQLAlchemy names a pool's logger after its class (ours is a subclass).
    for noisy in ("sqlalchemy", "aiosqlite", "asyncio", "alembic", "slotcron.store.pool"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLevelName(level)))
