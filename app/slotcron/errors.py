"""The few named errors of slotcron, each raised in one kind of situation."""

from __future__ import annotations


class SlotcronError(Exception):
    """Base of every error slotcron raises on purpose."""


class InvalidJobError(SlotcronError, ValueError):
    """A job definition is wrong; the message names the job and the offending field."""

    def __init__(self, job: str, field: str, problem: str) -> None:
        self.job = job
        self.field = field
        self.problem = problem
        super().__init__(f"job {job!r}: {field}: {problem}")


class ConfigError(SlotcronError):
    """A configuration value is wrong; the message names the variable. Never holds a password."""

    def __init__(self, variable: str, problem: str) -> None:
        self.variable = variable
        self.problem = problem
        super().__init__(f"{variable}: {problem}")


class DatabaseUnreachable(SlotcronError):
    """An embedded :class:`~slotcron.Scheduler` could not reach its database while starting
    (``slotcron run`` waits such an outage out instead). The message names the host and port
    (or the SQLite file) and the driver's reason, never a password."""

    def __init__(self, where: str, reason: str) -> None:
        self.where = where
        self.reason = reason
        super().__init__(f"cannot reach the database at {where}: {reason}")


class UsageError(SlotcronError):
    """A command was asked something it cannot do as asked (exit status 2)."""


class NotFound(UsageError):
    """An operator named a job or an execution the database does not know (exit status 2;
    HTTP 404)."""


class Refused(SlotcronError):
    """A command understood the request and refuses it for a stated reason (exit status 1)."""


class QueueFull(Refused):
    """A trigger, restart or retry of a job that already has :data:`MAX_QUEUED` runs waiting
    ``QUEUED``: refused (exit status 1; HTTP 429), naming the cap."""


MAX_QUEUED = 100
"""The most runs of one job or schedule that may wait ``QUEUED`` at once."""


class SlotTaken(SlotcronError):
    """A lost race: another claimer already holds this slot. An expected outcome, not a failure."""


class Superseded(SlotcronError):
    """This instance's schedule of a job is no longer the one in force: a newer registration
    changed it. Its claims of the job are refused (issue 12, item 5)."""


class RunsExhausted(SlotcronError):
    """The job has completed its ``max_runs``: it has no slot left (nothing is recorded)."""


class RowBusy(SlotcronError):
    """The job's row is locked by another claimer right now (the NOWAIT lock was not granted)."""


class LeaseHeld(SlotcronError):
    """A ``forbid`` job's lease is held by a run, and the claim asked to wait for it rather than
    record the slot ``SKIPPED`` (a catch-up under ``misfire="all"``: every missed slot runs, one
    after another). Nothing was written."""

    def __init__(self, job: str, until: object) -> None:
        self.job = job
        self.until = until
        super().__init__(f"{job}: a run holds the lease until {until}")


class SlotsUndecided(SlotcronError):
    """Slots of a job before the one being claimed were never decided (no instance alive, or the
    database down, when they were due); ``expected`` is the first of them."""

    def __init__(self, job: str, expected: object) -> None:
        self.job = job
        self.expected = expected
        super().__init__(f"{job}: slots from {expected} were never decided")


class CheckpointError(SlotcronError, TypeError):
    """`ctx.checkpoint()` was given a value that cannot be stored as JSON."""
