"""Log set-up: human text or one JSON object per line. Passwords are masked in every record.

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

from app.config import mask_url_text
from app.records import displayable

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class _Masking(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = mask_url_text(str(record.msg))
        if record.args:
            record.args = tuple(
                mask_url_text(a) if isinstance(a, str) else a
                for a in (record.args if isinstance(record.args, tuple) else (record.args,))
            )
        return True


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
    return str(value)


class TextFormatter(logging.Formatter):
    """One human line per record. Text that jobs and clients wrote (error text, names) is
    shown with its control characters escaped: it cannot recolour or retitle the terminal
    that tails the log, nor erase what came before it."""

    def format(self, record: logging.LogRecord) -> str:
        message = displayable(record.getMessage())
        line = f"{_timestamp(record)} {record.levelname:<7} {record.name}: {message}"
        if record.exc_info:
            line += "\n" + displayable(self.formatException(record.exc_info))
        return line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        payload = {
            "ts": _timestamp(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        payload.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info:
            payload["exception"] = self.formatException(record.exc_info)
        return json.dumps(payload, default=_json_value)


def configure(level: str = "INFO", fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(_Masking())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # app.store.pool: SQLAlchemy names a pool's logger after its class (ours is a subclass).
    for noisy in ("sqlalchemy", "aiosqlite", "asyncio", "alembic", "app.store.pool"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLevelName(level)))
