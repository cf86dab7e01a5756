"""The row a claim inserts for a slot: a run, or a slot recorded as not run (shared by the
single claim, the batch and passed-over ranges)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from slotcron.status import Status


def execution_row(
    *,
    job_name: str,
    slot: datetime,
    trigger: str,
    status: Status,
    instance_id: str,
    now: datetime,
    lease_ms: int | None = None,
    reason: str | None = None,
    fencing_token: int | None = None,
    started: bool = True,
) -> dict[str, Any]:
    """The row a claim inserts: a run (``RUNNING``, holding a lease of ``lease_ms`` from
    ``now``; ``started``: its body starts now), or a slot recorded as not run, finished at
    ``now`` with ``reason``."""
    running = status == Status.RUNNING
    return {
        "job_name": job_name,
        "scheduled_at": slot,
        "trigger": trigger,
        "status": status,
        "attempt": 1,
        "instance_id": instance_id,
        "created_at": now,
        "started_at": now if running and started else None,
        "heartbeat_at": now if running else None,
        "lease_until": now + timedelta(milliseconds=lease_ms or 0) if running else None,
        "lease_ms": lease_ms if running else None,
        "finished_at": None if running else now,
        "error": reason,
        "params": {},
        "state": {},
        "fencing_token": fencing_token,
    }
