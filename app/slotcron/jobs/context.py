"""What a running job can see and do: :class:`JobContext`."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from slotcron.errors import CheckpointError
from slotcron.jobs.checks import json_problem

Saver = Callable[[dict[str, Any]], Awaitable[None]]


@dataclass
class JobContext:
    """Handed to a job that takes one argument.

    ``scheduled_at`` is the slot (aware UTC); ``state`` is restored from the last checkpoint of
    this slot; ``await ctx.checkpoint(**values)`` persists values into it at once.
    """

    job: str
    scheduled_at: datetime
    execution_id: int
    attempt: int
    trigger: str
    instance_id: str
    logger: logging.Logger | logging.LoggerAdapter[logging.Logger]
    params: dict[str, Any] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)
    fencing_token: int = 0
    """Grows with every run of this job across the cluster, attempts included: a job writing to
    its own database can refuse a writer whose token is older than the last one it saw."""
    lease_lost: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when this run has been fenced (its lease could not be kept): stop at once; the run
    is being cancelled, and another instance may run the slot again."""
    _save: Saver | None = field(default=None, repr=False)

    async def checkpoint(self, **values: Any) -> None:
        """Merge ``values`` into ``state`` and store them; a retry or restart starts from them.

        Raises :class:`~slotcron.errors.CheckpointError` if a value cannot be stored as JSON.
        """
        merged = {**self.state, **values}
        try:
            json.dumps(merged, allow_nan=False)
        except (TypeError, ValueError) as exc:
            bad = next((k for k, v in values.items() if not _json_ok(v)), None)
            where = f"value of {bad!r}" if bad else "state"
            raise CheckpointError(
                f"job {self.job!r}: checkpoint: {where} cannot be stored as JSON: {exc}"
            ) from None
        problem = json_problem(merged)
        if problem is not None:
            raise CheckpointError(f"job {self.job!r}: checkpoint: state {problem}")
        self.state.clear()
        self.state.update(merged)
        if self._save is not None:
            await self._save(dict(merged))


def _json_ok(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True
