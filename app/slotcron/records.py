"""The JSON shape of jobs, executions and instances: one definition for ``--json`` and the API.

Timestamps are ISO-8601 UTC with a ``Z``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from slotcron.text import iso

if TYPE_CHECKING:  # the CLI imports this before it needs the database layer
    from slotcron.store.history import ExecutionRecord
    from slotcron.store.operations import JobRecord, Queued
    from slotcron.store.registrations import InstanceRecord


def execution_json(record: ExecutionRecord) -> dict[str, Any]:
    return {
        "id": record.id,
        "job": record.job,
        "scheduled_at": iso(record.scheduled_at),
        "trigger": record.trigger,
        "status": record.status,
        "attempt": record.attempt,
        "instance_id": record.instance_id,
        "started_at": iso(record.started_at),
        "finished_at": iso(record.finished_at),
        "duration_ms": record.duration_ms,
        "heartbeat_at": iso(record.heartbeat_at),
        "lease_until": iso(record.lease_until),
        "error": record.error,
        "params": record.params,
        "state": record.state,
        "until": iso(record.until),
    }


def job_json(record: JobRecord) -> dict[str, Any]:
    return {
        "name": record.name,
        "kind": record.kind,
        "schedule": record.schedule,
        "timezone": record.timezone,
        "next_slot": iso(record.next_slot),
        "paused": record.paused,
        "paused_reason": record.paused_reason,
        "last_status": record.last_status,
        "last_slot": iso(record.last_slot),
        "last_finished": iso(record.last_finished),
        "registered_by": record.registered_by,
        "version": record.version,
        "drift": record.drift,
        "superseded": record.superseded,
    }


def instance_json(record: InstanceRecord) -> dict[str, Any]:
    return {
        "instance_id": record.instance_id,
        "host": record.host,
        "pid": record.pid,
        "version": record.version,
        "started_at": iso(record.started_at),
        "heartbeat_at": iso(record.heartbeat_at),
        "state": record.state,
        "leader": record.leader,
    }


def queued_json(queued: Queued) -> dict[str, Any]:
    """A run an operator queued (trigger or restart)."""
    return {
        "execution_id": queued.execution_id,
        "job": queued.job,
        "scheduled_at": iso(queued.scheduled_at),
        "attempt": queued.attempt,
        "trigger": queued.trigger,
        "status": "QUEUED",
    }
