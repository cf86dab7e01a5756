"""The words of the record: an execution's status and trigger, and an instance's state.

They are :class:`~enum.StrEnum` members, so they are stored, compared and printed as the plain
strings the contract names (``Status.RUNNING == "RUNNING"``).
"""

from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    """An execution's ``status``."""

    QUEUED = "QUEUED"
    """A manual run, restart or retry waiting for an instance to take it."""
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    SKIPPED = "SKIPPED"
    """Not run: the job was paused, or (``forbid``) its previous run still held its lease."""
    MISSED = "MISSED"
    """Not run: the misfire policy chose not to run it."""
    STOPPED = "STOPPED"
    """Interrupted by shutdown."""
    ABANDONED = "ABANDONED"
    """Its instance died (its lease lapsed unrenewed)."""


FINISHED = frozenset(
    {
        Status.COMPLETED,
        Status.FAILED,
        Status.SKIPPED,
        Status.MISSED,
        Status.STOPPED,
        Status.ABANDONED,
    }
)
"""Statuses that are final for their attempt."""


class Trigger(StrEnum):
    """What made an execution: its ``trigger``."""

    CRON = "cron"
    INTERVAL = "interval"
    MANUAL = "manual"
    CATCHUP = "catchup"
    RETRY = "retry"
    RESTART = "restart"
    BACKFILL = "backfill"


class InstanceState(StrEnum):
    """An instance row's ``state``."""

    STARTING = "starting"
    """In this process only: never stored."""
    RUNNING = "running"
    DRAINING = "draining"
    STOPPED = "stopped"
