"""Late slots of ``misfire="skip"`` jobs recorded ``MISSED`` many jobs per transaction: an
overloaded or paused instance that falls behind on thousands of jobs catches up in a few
statements, instead of falling further behind deciding them one by one."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from slotcron.engine.firing import Firing
from slotcron.jobs import misfire
from slotcron.jobs.registry import Job
from slotcron.store.batch import Due

log = logging.getLogger("slotcron.scheduler")


async def miss_together(
    firing: Firing,
    missed: list[tuple[Job, list[datetime], datetime]],
    now: datetime,
    resume: Callable[[Job, datetime], None],
    batch_size: int,
    *,
    own: bool,
) -> None:
    """Record each job's late slots MISSED (``missed``: the job, its late slots, its first slot
    that is not late); each job then ``resume``s firing at its first slot that is not late.
    ``own``: some of them were this instance's to decide in time (it is behind), not only slots
    that passed before it planned their jobs."""
    try:
        await record(firing, [(job, late) for job, late, _ in missed], now, batch_size)
        count = sum(len(late) for _, late, _ in missed)
        if count:
            if own:
                firing.late.note()
            log.warning(
                "%d slots of %d jobs reached past their grace: recorded MISSED (misfire='skip')",
                count,
                len(missed),
            )
    finally:
        for job, _, first_on_time in missed:
            resume(job, first_on_time)


async def record(
    firing: Firing, missed: list[tuple[Job, list[datetime]]], now: datetime, batch_size: int
) -> None:
    """The k-th late slot of every job goes in round k, so each job's slots stay in order."""
    if not missed:
        return
    claimer, schedules = firing.claimer, firing.schedules
    jobs = {job.name: job for job, _ in missed}
    for k in range(max(len(late) for _, late in missed)):
        items = [
            Due(
                job_name=job.name,
                slot=late[k],
                following=schedules[job.name].next_after(late[k]),
                trigger=job.trigger,
                lease_ms=0,
                forbid_overlap=False,
                missed_reason=misfire.missed_reason(job, late[k], now),
                excluded=claimer.excluded(job, late[k]),
                max_runs=job.max_runs,
                check_gap=False,
                fingerprint=claimer.fingerprint(job),
            )
            for job, late in missed
            if k < len(late)
        ]
        for begin in range(0, len(items), batch_size):
            chunk = items[begin : begin + batch_size]
            decided = await claimer.claim_many(chunk, give_up_at=now + misfire.MAX_GRACE)
            for item in decided.held + decided.undecided:  # one by one, in order
                await firing.claim(
                    jobs[item.job_name],
                    item.slot,
                    trigger=item.trigger,
                    check_gap=False,
                    missed_reason=item.missed_reason,
                )
