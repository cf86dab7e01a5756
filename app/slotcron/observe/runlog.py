"""The run log: one line for each run's end and each slot recorded not run, written by the
instance that recorded it.

A built-in observer of the engine's events (:mod:`slotcron.observe.events`): the lines the
claimer, the kick-off, the firing path, the runner, the leader and start-up each wrote for
themselves, in one place. Each carries :func:`slotcron.observe.logs.run_fields` (``job``,
``slot``, ``execution_id``, ``instance``, ``outcome``) for a JSON log pipeline.

Levels say what needs a look: a FAILED run, a fenced one, an ABANDONED one and a passed-over
range are WARNINGs; a STOPPED run, the COMPLETED ones (at most
:data:`COMPLETED_LINES_PER_SECOND`) and the SKIPPED slots (at most :data:`SKIPPED_LINES_PER_SECOND`)
are INFO; single MISSED slots are DEBUG (they come in bulk after an outage, and the firing path
sums them up in one warning).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from slotcron.observe.events import Ending, Observer, RunEvent, SlotsEvent
from slotcron.observe.logs import run_fields

if TYPE_CHECKING:
    from slotcron.store.claims import Claim
    from slotcron.store.lifeline import Abandoned

runs_log = logging.getLogger("slotcron.runner")
claims_log = logging.getLogger("slotcron.claims")
passed_log = logging.getLogger("slotcron.scheduler")
leader_log = logging.getLogger("slotcron.leader")
start_log = logging.getLogger("slotcron.service")

COMPLETED_LINES_PER_SECOND = 20
SKIPPED_LINES_PER_SECOND = 20
"""Past these, one line a second says how many more there were (``slotcron history`` lists
each): under overload an instance recorded thousands of slots SKIPPED (overlap) a second, and a
line each was work on the loop that was already late."""
SUMMED_UP = 5
"""Passed-over ranges recorded together past which each one's line is DEBUG (the firing path
sums them up in one WARNING)."""


class RunLog(Observer):
    def __init__(self, instance_id: str) -> None:
        self.instance_id = instance_id
        self._completed_lines = LineQuota(
            COMPLETED_LINES_PER_SECOND, runs_log, "%d more runs COMPLETED"
        )
        self._skipped_lines = LineQuota(
            SKIPPED_LINES_PER_SECOND, claims_log, "%d more slots SKIPPED"
        )

    def slots_passed(self, event: SlotsEvent, record: Claim, together: int | None) -> None:
        fields = run_fields(
            event.job, event.first, record.execution_id, self.instance_id, event.status
        )
        if together is not None:
            passed_log.log(
                logging.WARNING if together <= SUMMED_UP else logging.DEBUG,
                "%s: %s; recorded MISSED as execution %d",
                event.job,
                event.reason,
                record.execution_id,
                extra=fields,
            )
            return
        skipped = event.status == "SKIPPED"
        if skipped and not self._skipped_lines.take():
            return
        claims_log.log(
            logging.INFO if skipped else logging.DEBUG,
            "%s slot %s %s: %s",
            event.job,
            event.first.isoformat(),
            event.status,
            event.reason,
            extra=fields,
        )

    def run_finished(self, run: RunEvent, end: Ending) -> None:
        if end.abandoned is not None:
            self._abandoned(end.abandoned, end.at_start_up)
        elif end.why is not None:
            runs_log.warning(
                "run %s of %s (slot %s) was fenced: %s; not recording an outcome",
                run.execution_id,
                run.job,
                run.scheduled_at.isoformat(),
                end.why,
                extra=self._fields(run, "FENCED"),
            )
        else:
            self._outcome(run, end.recorded)

    def _outcome(self, run: RunEvent, recorded: bool) -> None:
        if run.status == "FAILED":
            first = (run.error or "").strip().splitlines()[-1:] or [""]
            runs_log.warning(
                "%s slot %s FAILED: %s",
                run.job,
                run.scheduled_at.isoformat(),
                first[0],
                extra=self._fields(run, run.status),
            )
        elif run.status != "COMPLETED" or self._completed_lines.take():
            runs_log.info(
                "%s slot %s %s",
                run.job,
                run.scheduled_at.isoformat(),
                run.status,
                extra=self._fields(run, run.status),
            )
        if not recorded:
            runs_log.warning(
                "execution %s (%s) was no longer ours to record as %s",
                run.execution_id,
                run.job,
                run.status,
                extra=self._fields(run, "FENCED"),
            )

    @staticmethod
    def _abandoned(run: Abandoned, at_start_up: bool) -> None:
        retry = f"; retry queued as {run.retry_id}" if run.retry_id else ""
        fields = run_fields(
            run.job_name, run.scheduled_at, run.execution_id, run.instance_id, "ABANDONED"
        )
        if at_start_up:
            start_log.warning(
                "execution %s of %s (slot %s) ABANDONED: left RUNNING by a previous process "
                "with this instance id%s",
                run.execution_id,
                run.job_name,
                run.scheduled_at.isoformat(),
                retry,
                extra=fields,
            )
            return
        leader_log.warning(
            "execution %s of %s (slot %s) ABANDONED: instance %s let its lease lapse at %s%s",
            run.execution_id,
            run.job_name,
            run.scheduled_at.isoformat(),
            run.instance_id,
            run.lease_until.isoformat(),
            retry,
            extra=fields,
        )

    def _fields(self, run: RunEvent, outcome: str) -> dict[str, object]:
        return run_fields(run.job, run.scheduled_at, run.execution_id, self.instance_id, outcome)


class LineQuota:
    """At most ``per_second`` lines a second; past it, one line (``said``, with the count) says
    how many were left out, once the next one is asked for in a later second.

    A COMPLETED line per run is what a human reading the log wants at a few runs a second; at
    thousands a second, writing them would be most of the instance's work (and nobody reads
    them: the executions table holds every run)."""

    def __init__(
        self,
        per_second: int,
        log: logging.Logger,
        said: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.per_second = per_second
        self.log = log
        self.said = said + " in that second without a line each (`slotcron history` lists them)"
        self.clock = clock
        self._second = 0
        self._used = 0
        self._dropped = 0

    def take(self) -> bool:
        second = int(self.clock())
        if second != self._second:
            if self._dropped:
                self.log.info(self.said, self._dropped)
            self._second, self._used, self._dropped = second, 0, 0
        if self._used < self.per_second:
            self._used += 1
            return True
        self._dropped += 1
        return False
